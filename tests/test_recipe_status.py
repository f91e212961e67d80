"""The laptop experiment's ``--status`` (sage_rl/recipe/status.py) read off a run folder in the
middle of its stages, torn lines and all (the finished run's table is checked in
tests/test_laptop_recipe.py)."""

import json
import os
from pathlib import Path

from sage_rl.recipe.status import STOPPED_AFTER, show, stages

T = 1_800_000_000.0  # the epoch seconds every file of a test's run is dated to (``_written_at``)


def _written_at(out: Path, when: float = T) -> None:
    """Date ``out`` and everything in it to ``when`` (the status ages started stages by it)."""
    for path in (out, *out.rglob("*")):
        os.utime(path, (when, when))


def _lines(path: Path, rows: list[dict], torn: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + torn)


def test_a_run_in_the_middle_of_its_stages(tmp_path):
    out = tmp_path / "run"
    metrics = {"tgc": 25.0, "sgc": 10.0, "tasks": 270}  # percent, as EvalMetrics writes them
    for split in ("train_heldout", "dev"):
        (out / "eval" / f"base_{split}").mkdir(parents=True)
        (out / "eval" / f"base_{split}" / "outcomes.json").write_text(json.dumps({"metrics": metrics}))
    (out / "expert").mkdir()
    (out / "expert" / "summary.json").write_text(json.dumps({"examples": 879, "scenarios": {"run": 300}}))
    _lines(out / "sft" / "metrics.jsonl", [{"step": 0, "eval_loss": 1.72}, {"step": 1, "loss": 1.6678},
           {"step": 2, "loss": 1.3391}], torn='{"step": 3, "lo')  # fmt: skip
    _lines(out / "eval" / "sft_train_heldout" / "trajectories.same_scenario.jsonl", [{}] * 7, torn="{")
    _lines(out / "sage" / "metrics.jsonl", [
        {"step": 1, "sampled_tokens_total": 61_000, "success": 0.5, "eval/tgc": None},
        {"step": 2, "sampled_tokens_total": 118_500, "success": 0.375, "eval/tgc": 60.0},  # success a fraction, TGC in percent
    ])  # fmt: skip
    (out / "sage" / "config.yaml").write_text("steps: 40\nsampled_token_budget: 400000\n")
    (out / "grpo_lib").mkdir()
    (out / "sft" / "resume").mkdir()
    (out / "sft" / "resume" / "state.json").write_text(json.dumps({"step": 1, "losses": [1.6678]}))
    _lines(out / "sft_inline" / "metrics.jsonl", [{"step": 1, "loss": 1.5}])
    (out / "sft_inline" / "resume").mkdir()
    (out / "sft_inline" / "resume" / "state.json").write_text('{"step": 1, "los')  # torn: no resume point
    _written_at(out)
    _written_at(out / "sft" / "resume" / "state.json", T - 660)  # step 2 trained since
    got = {s.name: (s.state, s.detail) for s in stages(out, now=T + 90)}
    assert got["eval base train_heldout"] == ("done", "TGC 25.0%, SGC 10.0%, 270 tasks")
    assert got["collect"] == ("done", "879 examples from 300 scenarios")
    assert got["sft"] == (
        "running",
        "step 2, loss 1.339; held-out 1.720 at step 0; last written 1 min ago"
        "; resume point at step 1, written 12 min ago",
    )
    assert got["sft inline"] == ("running", "step 1, loss 1.500; last written 1 min ago")
    assert got["eval sft train_heldout"] == ("running", "7 scenarios finished; last written 1 min ago")
    assert got["eval sft dev"] == ("pending", "")
    assert got["collect inline"] == ("pending", "")
    assert got["rl sage"] == (
        "running",
        "step 2: 118,500 / 400,000 sampled tokens, success 37.5%; held-out curve TGC 60.0% at step 2"
        "; last written 1 min ago",
    )
    assert got["rl grpo_lib"] == ("running", "step 1 in progress; last written 1 min ago")
    assert got["rl grpo_nolib"] == ("pending", "")
    assert [s.state for s in stages(tmp_path / "nothing")] == ["pending"] * 23


def test_an_arm_that_keeps_its_best_model_says_which(tmp_path):
    """``eval.keep: best`` (train/best.py): the curve is named by its split and the kept step shown,
    while the arm runs and once it is done; a damaged kept record reads as what it holds."""
    out = tmp_path / "run"
    _lines(out / "sage" / "metrics.jsonl", [
        {"step": 0, "eval/tgc": 70.0, "eval/best_step": 0.0, "eval/best_tgc": 70.0},
        {"step": 2, "sampled_tokens_total": 60_000, "success": 0.5, "eval/tgc": 76.7, "eval/best_step": 2.0,
         "eval/best_tgc": 76.7},
        {"step": 4, "sampled_tokens_total": 120_000, "success": 0.5, "eval/tgc": 72.2, "eval/best_step": 2.0,
         "eval/best_tgc": 76.7},
    ])  # fmt: skip
    (out / "sage" / "config.yaml").write_text("sampled_token_budget: 400000\neval:\n  split: train_val\n  keep: best\n")
    (out / "grpo_lib").mkdir(parents=True)
    (out / "grpo_lib" / "summary.json").write_text(json.dumps({"steps": 12, "sampled_tokens": 401_000,
                                                                "kept": {"step": 4, "tgc": 74.4, "sgc": 60.0}}))  # fmt: skip
    (out / "grpo_nolib").mkdir(parents=True)
    (out / "grpo_nolib" / "summary.json").write_text('{"steps": 3, "sampled_tokens": 9, "kept": {"tgc": "x"}}')
    _written_at(out)
    got = {s.name: (s.state, s.detail.removesuffix("; last written 0 min ago")) for s in stages(out, now=T)}
    assert got["rl sage"] == (
        "running",
        "step 4: 120,000 / 400,000 sampled tokens, success 50.0%; train_val curve TGC 72.2% at step 4"
        "; keeping step 2 (TGC 76.7%)",
    )
    assert got["rl grpo_lib"] == ("done", "steps 12, 401,000 sampled tokens, keeps step 4 (TGC 74.4%)")
    assert got["rl grpo_nolib"] == ("done", "steps 3, 9 sampled tokens, keeps step None (TGC n/a)")


def test_an_evaluation_read_back_from_its_twin_says_so(tmp_path):
    """An arm that kept its start's weights has its start's evaluation copied in (recipe/twins.py,
    ``same_as.json``): done, with the figures and where they come from."""
    out = tmp_path / "run"
    for model in ("sft", "sage"):
        folder = out / "eval" / f"{model}_dev"
        folder.mkdir(parents=True)
        (folder / "outcomes.json").write_text(json.dumps({"metrics": {"tgc": 50.0, "sgc": 25.0, "tasks": 24}}))
    (out / "eval" / "sage_dev" / "same_as.json").write_text(json.dumps({"evaluation": str(out / "eval" / "sft_dev")}))
    got = {s.name: (s.state, s.detail) for s in stages(out, now=T)}
    assert got["eval sft dev"] == ("done", "TGC 50.0%, SGC 25.0%, 24 tasks")
    assert got["eval sage dev"] == ("done", "TGC 50.0%, SGC 25.0%, 24 tasks; read back from sft_dev (the same weights)")


def test_damaged_files_are_read_as_what_they_hold(tmp_path):
    out = tmp_path / "run"
    (out / "eval" / "base_dev").mkdir(parents=True)
    (out / "eval" / "base_dev" / "outcomes.json").write_text('{"metrics": {"tgc": null}')  # torn
    (out / "eval" / "base_train_heldout").mkdir(parents=True)
    (out / "eval" / "base_train_heldout" / "outcomes.json").write_text("[1, 2]")  # not an object
    (out / "expert").mkdir()
    (out / "expert" / "summary.json").write_text('{"examples": 5, "scenarios": "lots"}')
    (out / "sft").mkdir()
    (out / "sft" / "result.json").write_text('{"steps": 3, "eval_loss_before": null, "eval_loss_after": "x"}')
    (out / "sage").mkdir()
    (out / "sage" / "summary.json").write_text('{"steps": 2, "sampled_tokens": null}')
    (out / "grpo_lib").mkdir()
    (out / "grpo_lib" / "config.yaml").write_text("sampled_token_budget: [unclosed\n")
    (out / "grpo_nolib").mkdir()
    (out / "grpo_nolib" / "config.yaml").write_text("- a list\n")
    _lines(out / "grpo_nolib" / "metrics.jsonl", [{"step": 1, "sampled_tokens_total": 9, "success": "[/]"}])
    with (out / "grpo_nolib" / "metrics.jsonl").open("ab") as f:
        f.write(b"\xff\xfe not UTF-8\n")  # a damaged line: left out, not the whole file
    _lines(
        out / "expert_inline" / "progress.jsonl",
        [{"kind": "scenario", "examples": "3"}, {"kind": "scenario", "examples": 2}],
    )
    _lines(
        out / "grpo_lib" / "metrics.jsonl", [{"step": 1, "sampled_tokens_total": "many"}, ["not", "a", "row"]]
    )
    _written_at(out)
    got = {s.name: (s.state, s.detail.removesuffix("; last written 0 min ago")) for s in stages(out, now=T)}
    assert got["eval base dev"] == ("running", "0 scenarios finished")
    assert got["eval base train_heldout"] == ("running", "0 scenarios finished")
    assert got["collect"] == ("done", "5 examples from None scenarios")
    assert got["sft"] == ("done", "steps 3, held-out loss ? -> ?, float32")
    assert got["rl sage"] == ("done", "steps 2, ? sampled tokens")
    assert got["rl grpo_lib"] == ("running", "step 1: ? sampled tokens, success n/a")
    assert got["rl grpo_nolib"] == ("running", "step 1: 9 sampled tokens, success n/a")
    assert got["collect inline"] == ("running", "2 scenarios, 2 examples")
    (out / "sft" / "result.json").write_text('{"steps": 3, "dtype": "[/bold] [red"}')  # not rich markup
    shown = show(out)
    assert {s.name: s.detail for s in shown}["sft"] == "steps 3, held-out loss ? -> ?, [/bold] [red"


def test_an_evaluation_of_a_split_that_grew_since_reads_partial(tmp_path):
    """An evaluation finished before ``train_heldout`` gained seeds is not "done": the recipe runs
    its new scenarios on resume (``pipeline.evaluate``), and the status says how many it holds."""
    from sage_rl.config import dump_config
    from sage_rl.recipe.pipeline import eval_config, listed_scenarios
    from sage_rl.settings import TrainConfig

    out = tmp_path / "run"
    folder = out / "eval" / "sft_train_heldout"
    ev = eval_config(TrainConfig(), "m", "train_heldout", None, 1, folder)
    listed = listed_scenarios(ev)
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(dump_config(ev))
    rows = [[f"{s}-t{i}", s, 1] for s in listed[:2] for i in range(3)]  # two scenarios of 210, three tasks each
    (folder / "outcomes.json").write_text(json.dumps({"metrics": {"tgc": 100.0, "sgc": 100.0, "tasks": 6},
                                                      "outcomes": rows}))  # fmt: skip
    got = {s.name: (s.state, s.detail) for s in stages(out)}
    assert len(listed) == 210
    assert got["eval sft train_heldout"] == (
        "partial", "TGC 100.0%, SGC 100.0%, 6 tasks; 2 of 210 scenarios, the rest run on resume")
    (folder / "outcomes.json").write_text(json.dumps({"metrics": {"tgc": 100.0, "sgc": 100.0, "tasks": 630},
                                                      "outcomes": [[f"{s}-t", s, 1] for s in listed]}))  # fmt: skip
    assert {s.name: s.state for s in stages(out)}["eval sft train_heldout"] == "done"
    (folder / "config.yaml").write_text("split: [unreadable")  # a status never fails on what it only reports
    assert {s.name: s.state for s in stages(out)}["eval sft train_heldout"] == "done"


def test_a_started_stage_nothing_wrote_to_for_an_hour_reads_stopped(tmp_path):
    """The files cannot say whether a process still runs a stage; a started stage whose folder was
    last written an hour ago or more reads "stopped" (a run ended with its session), with the age
    of that write, and one written since reads "running" again. Finished stages never age."""
    out = tmp_path / "run"
    _lines(out / "eval" / "sft_train_heldout" / "trajectories.same_scenario.jsonl", [{}] * 100)
    _lines(out / "eval" / "sft_nolib_train_heldout" / "trajectories.same_scenario.jsonl", [{}] * 46)
    (out / "expert").mkdir()
    (out / "expert" / "summary.json").write_text(json.dumps({"examples": 879, "scenarios": {"run": 300}}))
    _written_at(out)
    _written_at(out / "eval" / "sft_nolib_train_heldout", T + 95 * 60)

    def read(now: float) -> dict[str, tuple[str, str]]:
        return {s.name: (s.state, s.detail) for s in stages(out, now=now)}

    got = read(T + 2 * 3600 + 5 * 60)
    assert got["eval sft train_heldout"] == ("stopped", "100 scenarios finished; last written 2 h 5 min ago")
    assert got["eval sft_nolib train_heldout"] == (
        "running",
        "46 scenarios finished; last written 30 min ago",
    )
    assert got["collect"] == ("done", "879 examples from 300 scenarios")
    assert read(T + STOPPED_AFTER - 1)["eval sft train_heldout"][0] == "running"
    assert read(T + STOPPED_AFTER)["eval sft train_heldout"][0] == "stopped"
    _lines(out / "eval" / "sft_train_heldout" / "trajectories.jsonl", [{}])  # the run resumed: a new scenario
    _written_at(out / "eval" / "sft_train_heldout" / "trajectories.jsonl", T + 3 * 3600)
    resumed = read(T + 3 * 3600 + 30)["eval sft train_heldout"]
    assert resumed == ("running", "101 scenarios finished; last written 0 min ago")


def test_the_table_and_its_title_read_the_holder_once(tmp_path, monkeypatch, capsys):
    """A run whose process ends while ``--status`` reads it is shown one way: the title and the
    stages' states come from one read of the claim (two reads gave "running" rows under a title
    saying no process is in the run)."""
    import sage_rl.recipe.status as status
    from sage_rl.runs.claim import OWNER

    out = tmp_path / "run"
    _lines(out / "eval" / "sft_train_heldout" / "trajectories.same_scenario.jsonl", [{}] * 3)
    (out / OWNER).write_text("{}")  # claimed once
    reads = iter([{"pid": 7}, None, None])  # alive at the first read, gone at any later one
    monkeypatch.setattr(status, "holder", lambda folder: next(reads))
    rows = show(out)
    printed = " ".join(capsys.readouterr().out.split())  # the title wraps
    assert {s.name: s.state for s in rows}["eval sft train_heldout"] == "running"
    assert "stages done; run by pid 7" in printed and "no process" not in printed
