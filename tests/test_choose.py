"""``sage-rl choose``: a run's model chosen after the fact from finished evaluations of its saved
models, by keep-best's rule, and refused where the evaluations do not compare."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sage_rl.cli import _register, app
from sage_rl.runs.choose import ChooseError, choose, read_candidate


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory) -> Path:
    """A real finished evaluation (the scripted expert on train_val's first 2 scenarios)."""
    out = tmp_path_factory.mktemp("choose") / "ev"
    _register("eval")
    r = CliRunner().invoke(app, ["eval", "split=train_val", "policy.kind=scripted", "limit_scenarios=2", f"out_dir={out}"])
    assert r.exit_code == 0, r.output
    return out


def _copy(src: Path, dst: Path, tgc: float, sgc: float, model: str, **settings) -> Path:
    """``src`` as the evaluation of ``model`` with the given scores (and settings changed)."""
    shutil.copytree(src, dst)
    m = json.loads((dst / "metrics.json").read_text())
    m["same_scenario"] |= {"tgc": tgc, "sgc": sgc}
    (dst / "metrics.json").write_text(json.dumps(m))
    s = json.loads((dst / "resume.json").read_text())
    s["policy"]["model"] = model
    s |= settings
    (dst / "resume.json").write_text(json.dumps(s))
    return dst


def _run(evaluated: Path, tmp_path: Path, scores: dict[int, tuple[float, float]], **settings):
    return [
        read_candidate(step, _copy(evaluated, tmp_path / f"s{step}", tgc, sgc, f"m{step}", **settings))
        for step, (tgc, sgc) in scores.items()
    ]


def test_the_real_folder_reads_back(evaluated):
    c = read_candidate(3, evaluated)
    assert (c.step, c.split, c.metrics["tasks"]) == (3, "train_val", 6)
    assert c.metrics["tgc"] == 100.0  # the scripted expert solves every task


def test_higher_tgc_then_sgc_and_a_tie_keeps_the_earlier_step_whatever_the_argument_order(evaluated, tmp_path):
    # given out of step order: 6 ties 2 on both (earlier kept), 4 ties 2 on TGC with a higher SGC
    cands = _run(evaluated, tmp_path, {6: (66.7, 60.0), 0: (50.0, 40.0), 4: (66.7, 60.0), 2: (66.7, 50.0)})
    kept = choose(cands)
    assert (kept.step, kept.model) == (4, "m4")
    # the start model kept when nothing beats it
    cands = _run(evaluated, tmp_path / "b", {3: (40.0, 90.0), 0: (50.0, 10.0), 1: (50.0, 10.0)})
    assert choose(cands).step == 0


def test_reported_splits_are_refused(evaluated, tmp_path):
    for split in ("train_heldout", "test_normal"):
        cands = _run(evaluated, tmp_path / split, {0: (50.0, 40.0), 2: (60.0, 50.0)}, split=split)
        with pytest.raises(ChooseError, match=f"'{split}', whose results are reported"):
            choose(cands)


def test_evaluations_that_differ_but_in_the_model_are_refused(evaluated, tmp_path):
    a = read_candidate(0, _copy(evaluated, tmp_path / "a", 50.0, 40.0, "m0"))
    served = _copy(evaluated, tmp_path / "served", 60.0, 50.0, "m2")  # the same, served on a port of its own
    s = json.loads((served / "resume.json").read_text())
    s["policy"]["base_url"] = "http://127.0.0.1:8002/v1"
    (served / "resume.json").write_text(json.dumps(s))
    assert choose([a, read_candidate(2, served)]).step == 2
    b = read_candidate(2, _copy(evaluated, tmp_path / "b", 60.0, 50.0, "m2", seed=7))
    with pytest.raises(ChooseError, match=r"evaluated otherwise .*seed: 0 -> 7.*only the model may differ"):
        choose([a, b])
    c = _copy(evaluated, tmp_path / "c", 60.0, 50.0, "m2")
    m = json.loads((c / "metrics.json").read_text())
    m["same_scenario"]["tasks"] = 3
    (c / "metrics.json").write_text(json.dumps(m))
    with pytest.raises(ChooseError, match="scored 3 tasks"):
        choose([a, read_candidate(2, c)])
    with pytest.raises(ChooseError, match="step is given twice"):
        choose([a, read_candidate(0, c)])
    with pytest.raises(ChooseError, match="at least two"):
        choose([a])


def test_unfinished_damaged_or_other_strategy_folders_are_named(evaluated, tmp_path):
    d = _copy(evaluated, tmp_path / "d", 50.0, 40.0, "m")
    with pytest.raises(ChooseError, match="no 'all_scenarios' results"):
        read_candidate(0, d, strategy="all_scenarios")
    (d / "metrics.json").write_text('{"same_scenario": {"tgc": "high", "sgc": 1, "tasks": 6}}')
    with pytest.raises(ChooseError, match=r"same_scenario\.tgc is 'high', not a finite number"):
        read_candidate(0, d)
    (d / "metrics.json").write_text('{"same_scenario": {"tgc": NaN, "sgc": 1, "tasks": 6}}')  # Python's json reads it
    with pytest.raises(ChooseError, match=r"same_scenario\.tgc is nan, not a finite number"):
        read_candidate(0, d)
    (d / "metrics.json").write_text("{not json")
    with pytest.raises(ChooseError, match=f"{d}/metrics.json: unreadable"):
        read_candidate(0, d)
    (d / "metrics.json").unlink()
    with pytest.raises(ChooseError, match="no metrics.json .not a finished evaluation: finish it with .* --resume"):
        read_candidate(0, d)
    (d / "resume.json").unlink()
    shutil.copy(evaluated / "metrics.json", d / "metrics.json")
    with pytest.raises(ChooseError, match="no resume.json .its settings are not recorded"):
        read_candidate(0, d)


def test_the_command_prints_the_choice_and_exits_2_on_bad_input(evaluated, tmp_path):
    a = _copy(evaluated, tmp_path / "a", 50.0, 40.0, "start")
    b = _copy(evaluated, tmp_path / "b", 60.0, 50.0, "after2")
    _register("choose")
    r = CliRunner().invoke(app, ["choose", f"2={b}", f"0={a}", "--json"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)
    assert (row["kept"]["step"], row["kept"]["model"], row["split"]) == (2, "after2", "train_val")
    assert [c["step"] for c in row["candidates"]] == [0, 2]
    r = CliRunner().invoke(app, ["choose", f"x={a}", f"0={b}"])
    assert r.exit_code == 2 and "give STEP=FOLDER" in r.output
