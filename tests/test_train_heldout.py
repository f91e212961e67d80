"""``train_heldout``: fixed scenarios of the train templates that training and collection never draw."""

import random

import pytest
from pocket import SyncEnv

from sage_rl.collect import plan_scenarios
from sage_rl.config import ConfigError, load_config
from sage_rl.envs.pocketworld import tasks
from sage_rl.envs.pocketworld.env import PocketWorldSuite
from sage_rl.envs.pocketworld.scenarios import templates
from sage_rl.settings import CollectConfig, EvalRunConfig, TrainConfig, known_splits
from sage_rl.text import dumps

HELDOUT = tasks.split_tasks("train_heldout")


def _seed(scenario_id: str) -> int:
    return int(scenario_id.rsplit("-s", 1)[1])


#: sha256 of the 90 task ids of ``train_heldout`` before issue 27 (one seed, 2**31), newline-joined in
#: split order: the first 90 tasks of the grown split must be exactly these, so results measured on
#: the old split stay comparable (a scenario's id never changes; seeds are only added).
FIRST_SEED_IDS_SHA256 = "f3d2ea4735bed99bf6d2c8a349e18770aafa9d931174572c69d1e48a3afe1567"


def test_three_fixed_scenarios_per_train_template_with_stable_ids():
    import hashlib
    from collections import Counter

    train = {t.name for t in templates("train")}
    scenarios = tasks.scenarios_of_split("train_heldout")
    per_template = Counter(s.rsplit("-s", 1)[0] for s in scenarios)
    assert set(per_template) == train and min(per_template.values()) >= 3
    assert len(scenarios) >= 90 and len(HELDOUT) == 3 * len(scenarios) >= 270
    assert all(_seed(s) in tasks.HELDOUT_SEEDS for s in scenarios)
    for i in range(0, len(HELDOUT), 3):  # ordered by scenario, then position
        chunk = HELDOUT[i : i + 3]
        assert [t.position for t in chunk] == [1, 2, 3] and len({t.scenario_id for t in chunk}) == 1
    assert all(t.split == "train_heldout" and t.task_id == f"{t.scenario_id}_{t.position}" for t in HELDOUT)
    # ids round-trip to the same task (split included), and the order is not the template order
    assert [dumps(tasks.task_by_id(t.task_id)) for t in HELDOUT] == [dumps(t) for t in HELDOUT]
    assert [s.rsplit("-s", 1)[0] for s in scenarios[:30]] != [t.name for t in templates("train")]
    assert "train_heldout" in known_splits("pocketworld") and "train_heldout" in tasks.split_names()
    # seed-major: the first seed's 30 scenarios (the split before issue 27, same ids, same order),
    # then each added seed's, the templates in the same order each time
    first = [t.task_id for t in HELDOUT[:90]]
    assert hashlib.sha256("\n".join(first).encode()).hexdigest() == FIRST_SEED_IDS_SHA256
    order = [s.rsplit("-s", 1)[0] for s in scenarios[:30]]
    for j, seed in enumerate(tasks.HELDOUT_SEEDS):
        assert scenarios[30 * j : 30 * (j + 1)] == tuple(f"{name}-s{seed}" for name in order)


@pytest.mark.parametrize("split", ["train_heldout", "train_val"])
def test_reference_solves_and_noop_fails_every_task_of_the_split(split):
    for t in tasks.split_tasks(split):
        env = SyncEnv()
        env.reset(t)
        env.execute(tasks.reference_solution(t), "<cell-1>")
        assert env.evaluate().success, t.task_id
        env = SyncEnv()
        env.reset(t)
        assert not env.evaluate().success, t.task_id


def test_train_sampling_can_never_draw_a_heldout_seed():
    assert tasks.TRAIN_SEEDS.stop <= tasks.HELDOUT_SEEDS.start and 0 not in tasks.HELDOUT_SEEDS

    class Extreme(random.Random):
        """An RNG whose draws are always the largest (or smallest) value allowed."""

        def __init__(self, top: bool) -> None:
            super().__init__(0)
            self.top = top

        def randrange(self, start, stop=None, step=1):
            lo, hi = (0, start) if stop is None else (start, stop)
            return hi - 1 if self.top else lo

    for top in (True, False):
        chain = tasks.sample_chain(Extreme(top), 3, "train")
        assert _seed(chain[0].scenario_id) in tasks.TRAIN_SEEDS and chain[0].split == "train"
    heldout_ids = set(tasks.scenarios_of_split("train_heldout"))
    rng = random.Random(0)
    drawn = {tasks.sample_chain(rng, 1)[0].scenario_id for _ in range(2000)}
    assert not drawn & heldout_ids


def test_collection_plans_no_heldout_scenario():
    plan = plan_scenarios(PocketWorldSuite(), "train", 400, 3, seed=0)
    assert len(plan) == 400
    assert not {s[0].scenario_id for s in plan} & set(tasks.scenarios_of_split("train_heldout"))


def test_configs_evaluate_on_it_but_never_train_or_collect_on_it():
    assert load_config(EvalRunConfig, None, ["split=train_heldout"]).split == "train_heldout"
    assert load_config(TrainConfig, None, ["eval.split=train_heldout"]).eval.split == "train_heldout"
    with pytest.raises(ConfigError, match="held out for evaluation"):
        load_config(TrainConfig, None, ["rollout.split=train_heldout"])
    with pytest.raises(ConfigError, match="held out for evaluation"):
        load_config(CollectConfig, None, ["split=train_heldout"])
    with pytest.raises(ConfigError, match="not a split"):
        load_config(EvalRunConfig, None, ["split=train_held"])


def test_the_scenario_listing_and_counts_name_what_the_built_split_holds():
    """``scenarios_of_split`` and ``stats`` name a split's scenarios without building a world
    (``world stats`` built all 1,065 tasks: 7.5 s); they must say what building it gives."""
    counts = tasks.stats()
    for split in tasks.split_names():
        built = tasks.split_tasks(split)
        assert tasks.scenarios_of_split(split) == tuple(dict.fromkeys(t.scenario_id for t in built)), split
        assert counts["scenarios"][split] == len(built) // 3
        assert counts["tasks"][split] == ("unlimited" if split == "train" else len(built)), split


def test_a_limited_split_builds_only_the_scenarios_it_returns(monkeypatch):
    """``split(name, limit)`` is the first ``limit`` scenarios of the split, and only they are built:
    an evaluation of one scenario of ``train_heldout`` built all 630 tasks first (~5-15 s a start),
    and so did the check that the split exists. Sampling a chain from it builds one scenario."""
    built = []
    real = tasks.scenario_tasks
    monkeypatch.setattr(tasks, "scenario_tasks", lambda *a: built.append(a[:2]) or real(*a))
    tasks.split_tasks.cache_clear()
    try:
        suite, scope = PocketWorldSuite(), PocketWorldSuite(templates=["todo_count_open", "notes_count_tag"])
        assert suite.split("train_heldout", 2) == HELDOUT[:6] and len(built) == 2
        whole_scope = tasks.split_tasks("train_heldout", ("notes_count_tag", "todo_count_open"))
        built.clear()
        assert scope.split("train_heldout", 1) == whole_scope[:3] and len(built) == 1
        assert suite.split("dev", 100) == tasks.split_tasks("dev")  # a limit past the end: all of it
        for s, limit in ((suite, None), (suite, 4), (scope, None), (scope, 2)):
            built.clear()
            ids = s.scenario_ids("train_heldout", limit)
            assert not built  # named, none built
            assert ids == tuple(dict.fromkeys(t.scenario_id for t in s.split("train_heldout")))[:limit]
        assert scope.scenario_ids("dev") == suite.scenario_ids("dev")  # a scope narrows only the train splits
        for seed in range(20):  # the same draw as from the whole split, one scenario built
            i = random.Random(seed).randrange(len(HELDOUT) // 3)
            built.clear()
            assert tasks.sample_chain(random.Random(seed), 2, "train_heldout") == HELDOUT[3 * i : 3 * i + 2]
            assert len(built) == 1
            j = random.Random(seed).randrange(len(whole_scope) // 3)
            assert (
                scope.sample_chain(random.Random(seed), 3, "train_heldout") == whole_scope[3 * j : 3 * j + 3]
            )
        with pytest.raises(ValueError, match="unknown split 'heldout'.*'train_heldout', 'train_val'"):
            suite.split("heldout", 1)
    finally:
        tasks.split_tasks.cache_clear()
