"""A stopped evaluation continues where it stopped (eval/resume.py): only the missing scenarios
run, the result equals an unbroken run's, and a folder of another evaluation is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_server import run_cli

from sage_rl.config import load_config
from sage_rl.eval.resume import SETTINGS, ResumeError, start
from sage_rl.rollout.chain import ChainRunner
from sage_rl.runs.eval import run_evaluation
from sage_rl.settings import EvalRunConfig


def _cfg(out, *more):
    args = ["policy.kind=scripted", "split=dev", "limit_scenarios=4", "concurrency=2", f"out_dir={out}"]
    return load_config(EvalRunConfig, None, [*args, *more])


@pytest.fixture
def ran(monkeypatch):
    """The scenario ids each ``ChainRunner.run`` call ran, in order."""
    seen: list[str] = []
    original = ChainRunner.run

    async def run(self, tasks, *args, **kwargs):
        seen.append(tasks[0].scenario_id)
        return await original(self, tasks, *args, **kwargs)

    monkeypatch.setattr(ChainRunner, "run", run)
    return seen


def _outcomes(line):
    chain = json.loads(line)
    return [(t["task"]["task_id"], t["outcome"]["success"]) for t in chain["trajectories"]]


def _lines(path):
    return path.read_text(encoding="utf-8").splitlines()


def test_a_killed_evaluation_resumes_with_the_missing_scenarios_only(tmp_path, ran):
    whole = run_evaluation(_cfg(tmp_path / "whole"))
    assert len(ran) == 4
    folder = tmp_path / "stopped"
    # what a kill leaves: two chains streamed, a third cut mid-line, no metrics, no report
    folder.mkdir()
    (folder / SETTINGS).write_text((tmp_path / "whole" / SETTINGS).read_text())
    lines = _lines(tmp_path / "whole" / "trajectories.same_scenario.jsonl")
    (folder / "trajectories.same_scenario.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:50])
    ran.clear()
    resumed = run_evaluation(_cfg(folder), resume=True)
    first_two = {json.loads(line)["trajectories"][0]["task"]["scenario_id"] for line in lines[:2]}
    assert len(ran) == 2 and not first_two & set(ran)  # the torn third and the fourth ran again
    assert resumed.headline == whole.headline
    got = _lines(folder / "trajectories.same_scenario.jsonl")
    assert got[:2] == lines[:2]  # read back as they were
    assert [_outcomes(line) for line in got] == [_outcomes(line) for line in lines]  # all, in order
    assert (folder / "metrics.json").read_text() == (tmp_path / "whole" / "metrics.json").read_text()


def test_without_resume_the_folder_is_evaluated_again(tmp_path, ran):
    run_evaluation(_cfg(tmp_path))
    ran.clear()
    run_evaluation(_cfg(tmp_path))
    assert len(ran) == 4


def test_a_folder_of_other_settings_is_refused_and_kept(tmp_path, ran):
    run_evaluation(_cfg(tmp_path, "limit_scenarios=2"))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    # how fast it runs is not a setting: resuming with other parallelism is fine
    run_evaluation(_cfg(tmp_path, "limit_scenarios=2", "concurrency=1", "policy.threads=1"), resume=True)
    with pytest.raises(ResumeError, match=r"limit_scenarios: 2 -> 4"):
        run_evaluation(_cfg(tmp_path), resume=True)
    with pytest.raises(ResumeError, match=r"sampling.temperature: 0.7 -> 0.5"):
        run_evaluation(_cfg(tmp_path, "limit_scenarios=2", "sampling.temperature=0.5"), resume=True)
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert (
        after.keys() == before.keys()
        and after["trajectories.same_scenario.jsonl"] == before["trajectories.same_scenario.jsonl"]
    )


def test_a_finished_evaluation_is_read_back_only_for_its_own_model(tmp_path, ran, tiny_dir):
    """The recipes read a finished evaluation back instead of running it (``pipeline.evaluate``):
    only when it evaluated this model under these settings. A model folder linked elsewhere (as
    ``--sft-from`` links them) is the same model; a retrained one is not, and is named."""
    import shutil

    from sage_rl.recipe.pipeline import evaluate

    model, other = tmp_path / "sft", tmp_path / "sage_step13"
    shutil.copytree(tiny_dir, model), shutil.copytree(tiny_dir, other)  # the scripted policy reads a tokenizer
    (tmp_path / "linked").symlink_to(model, target_is_directory=True)
    out = tmp_path / "eval"
    evaluate(_cfg(out, f"policy.model={model}", "limit_scenarios=2"))
    first = json.loads((out / "outcomes.json").read_text())
    assert len(ran) == 2
    ran.clear()
    assert evaluate(_cfg(out, f"policy.model={tmp_path / 'linked'}", "limit_scenarios=2")) == first
    assert ran == []  # read back
    with pytest.raises(ResumeError, match=rf"policy.model: '{model}' -> '{other}'"):
        evaluate(_cfg(out, f"policy.model={other}", "limit_scenarios=2"))
    with pytest.raises(ResumeError, match="limit_scenarios: 2 -> 4"):
        evaluate(_cfg(out, f"policy.model={model}"))
    assert ran == [] and json.loads((out / "outcomes.json").read_text()) == first  # kept


def test_trajectories_without_their_settings_are_refused(tmp_path, ran):
    run_evaluation(_cfg(tmp_path))
    (tmp_path / SETTINGS).unlink()
    with pytest.raises(ResumeError, match="cannot be checked"):
        run_evaluation(_cfg(tmp_path), resume=True)
    assert (tmp_path / "trajectories.same_scenario.jsonl").is_file()


def test_chains_of_other_tasks_are_refused(tmp_path, ran):
    run_evaluation(_cfg(tmp_path / "dev"))
    other = tmp_path / "other"
    start(other, _cfg(other, "split=train_heldout"), resume=False)  # its settings, someone else's chain
    foreign = _lines(tmp_path / "dev" / "trajectories.same_scenario.jsonl")[0]
    (other / "trajectories.same_scenario.jsonl").write_text(foreign + "\n")
    with pytest.raises(ResumeError, match="not a scenario of this evaluation"):
        run_evaluation(_cfg(other, "split=train_heldout"), resume=True)


def test_the_command_resumes_and_names_a_mismatch_in_one_line(tmp_path):
    def cli(*args):
        return run_cli(["eval", "policy.kind=scripted", "split=dev", *args], Path.cwd())

    out = f"out_dir={tmp_path}"
    assert cli("limit_scenarios=1", out).returncode == 0
    r = cli("limit_scenarios=1", out, "--resume")
    assert r.returncode == 0 and "1/1" in r.stderr  # read back, nothing left to run
    r = cli("limit_scenarios=2", out, "--resume")
    assert r.returncode == 1 and "limit_scenarios: 1 -> 2" in r.stderr and "Traceback" not in r.stderr


def test_a_split_that_grew_is_evaluated_further_on_its_new_scenarios_only(tmp_path, ran, monkeypatch):
    """``train_heldout`` only ever appends seeds (issue 27: 3, then 7 a template). A finished
    evaluation of the shorter split is not read back short: its new scenarios run, the others are
    read back, and the outcomes hold both."""
    from sage_rl.envs.pocketworld import tasks
    from sage_rl.recipe.pipeline import evaluate

    def seeds(n):
        monkeypatch.setitem(tasks.SEEDED_SPLITS, "train_heldout", range(2**31, 2**31 + n))
        tasks.split_tasks.cache_clear()

    scope = "pocketworld.templates=[notes_count_tag,todo_count_open]"
    cfg = _cfg(tmp_path, "split=train_heldout", "limit_scenarios=null", scope)
    try:
        seeds(1)
        first = evaluate(cfg)
        assert len(ran) == 2 and first["metrics"]["scenarios"] == 2
        ran.clear()
        assert evaluate(cfg)["outcomes"] == first["outcomes"] and ran == []  # nothing new: read back
        seeds(2)
        grown = evaluate(cfg)
        assert sorted(ran) == sorted(f"{t}-s{2**31 + 1}" for t in ("notes_count_tag", "todo_count_open"))
        assert grown["metrics"]["scenarios"] == 4 and grown["outcomes"][:6] == first["outcomes"]
    finally:
        tasks.split_tasks.cache_clear()
