"""benchmarks/replay_update.py: a saved step's batch rebuilt as the loop built it, and the shuffled
control keeps each group's samples and advantage values while cutting their link to success."""

from bench_script import load

from sage_rl.settings import TrainConfig
from sage_rl.types import Chain, ExecResult, Outcome, StopReason, Task, Trajectory, Turn

replay = load("replay_update")


def _chain(group: int, index: int, success: bool) -> Chain:
    task = Task(f"t{group}", f"s{group}", 1, "do it", "train")
    turn = Turn((5, 6, index), (-0.1, -0.2, -0.3), "x", "print(1)", ExecResult("1", True), obs_ids=(7,))
    traj = Trajectory(task, (1, 2), (turn,), Outcome(float(success), success), StopReason.COMPLETED)
    return Chain(group_index=group, chain_index=index, trajectories=(traj,))


def test_the_batch_by_hand_and_its_shuffled_control():
    cfg = TrainConfig.model_validate(
        {"rollout": {"chain_length": 1, "group_size": 4, "reward": "outcome", "dynamic_sampling": True}}
    )
    chains = [_chain(0, i, i == 0) for i in range(4)] + [_chain(1, i, False) for i in range(4)]
    batch = replay.batch_of(chains, cfg)
    assert len(batch.drawn) == 2 and len(batch.trained) == 1  # group 1 failed everywhere: no signal
    assert batch.num_chains == 4
    assert [s.advantage for s in batch.samples] == [0.75, -0.25, -0.25, -0.25]  # r - mean, no std
    seen = set()
    for seed in range(8):
        mixed = replay.shuffled(batch, seed)
        assert [s.trajectory for s in mixed.samples] == [s.trajectory for s in batch.samples]
        assert sorted(s.advantage for s in mixed.samples) == [-0.25, -0.25, -0.25, 0.75]
        assert mixed.num_chains == 4 and mixed.drawn == batch.drawn
        seen.add(next(i for i, s in enumerate(mixed.samples) if s.advantage > 0))
    assert len(seen) > 1  # the success's advantage lands on other samples
    assert replay.shuffled(batch, 3).samples == replay.shuffled(batch, 3).samples  # its seed's
