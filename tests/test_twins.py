"""recipe/twins.py: an evaluation the run already made (same settings, byte-identical weights) is
read back, not run again; anything else that differs (a byte, a file, a setting) is evaluated."""

import json
from pathlib import Path

from sage_rl.eval.resume import SETTINGS, settings_of
from sage_rl.recipe.pipeline import evaluate, listed_scenarios
from sage_rl.recipe.twins import SAME_AS, read_twin, same_weights, twin
from sage_rl.settings import EvalRunConfig

TENSOR = '"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}'


def _safetensors(path: Path, header: str, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(len(header.encode()).to_bytes(8, "little") + header.encode() + data)
    return path


def _model(folder: Path, weights: bytes = b"\x00\x00\x80?\x00\x00\x00@", extra: dict | None = None) -> Path:
    _safetensors(folder / "model.safetensors", '{"__metadata__": {"format": "pt"}, ' + TENSOR + "}", weights)
    (folder / "config.json").write_text('{"hidden_size": 8}')
    for name, text in (extra or {}).items():
        (folder / name).write_text(text)
    return folder


def _ev(out: Path, model: Path, **over) -> EvalRunConfig:
    """A greedy evaluation of ``model`` on ``dev`` (the recipe's are greedy), with ``over``."""
    policy = {"kind": "transformers", "model": str(model)}
    return EvalRunConfig(
        **{"out_dir": str(out), "split": "dev", "policy": policy, "sampling": {"temperature": 0.0}} | over
    )


def _finished(ev: EvalRunConfig) -> list:
    """A finished evaluation of ``ev`` on disk: its settings, outcome rows for every scenario, a
    trajectory file; returns the rows."""
    out = Path(ev.out_dir)
    out.mkdir(parents=True)
    (out / SETTINGS).write_text(json.dumps(settings_of(ev)))
    rows = [[f"{s}_1", s, i % 2 == 0] for i, s in enumerate(listed_scenarios(ev))]
    (out / "outcomes.json").write_text(json.dumps({"metrics": {"tgc": 50.0}, "outcomes": rows}))
    (out / "trajectories.same_scenario.jsonl").write_text('{"chain": 1}\n')
    return rows


def test_same_weights_means_the_same_files_byte_for_byte(tmp_path):
    a = _model(tmp_path / "sft" / "final")
    assert same_weights(a, _model(tmp_path / "best" / "model"))
    assert not same_weights(a, _model(tmp_path / "step1", weights=b"\x00\x00\x80?\x00\x00\x00A"))  # one byte
    assert not same_weights(a, _model(tmp_path / "more", extra={"adapter.bin": "x"}))  # another file
    (tmp_path / "link").symlink_to(a)
    assert same_weights(a, tmp_path / "link") and same_weights(a, a)
    assert not same_weights(a, tmp_path / "missing")
    (tmp_path / "empty1").mkdir(), (tmp_path / "empty2").mkdir()
    assert not same_weights(tmp_path / "empty1", tmp_path / "empty2")  # no weights: nothing to vouch for


def test_safetensors_weights_compare_by_header_and_tensor_bytes(tmp_path):
    """transformers writes a safetensors header's metadata in an order that varies from save to save
    (laptop_recipe --quick: sft/final against sage's kept step 0): the same tensors all the same."""
    t, data = TENSOR, b"\x00\x00\x80?\x00\x00\x00@"  # 1.0, 2.0
    a = _safetensors(
        tmp_path / "a" / "model.safetensors", '{"__metadata__": {"format": "pt", "k": "v"}, ' + t + "}", data
    )
    b = _safetensors(
        tmp_path / "b" / "model.safetensors", '{"__metadata__": {"k": "v", "format": "pt"}, ' + t + "}", data
    )
    assert a.read_bytes() != b.read_bytes() and same_weights(a.parent, b.parent)
    c = _safetensors(tmp_path / "c" / "model.safetensors", '{"__metadata__": {"k": "v", "format": "pt"}, ' + t + "}",
                     data[:-1] + b"A")  # fmt: skip
    assert not same_weights(a.parent, c.parent)  # one byte of a tensor
    f16 = t.replace("F32", "F16").replace("[2]", "[4]")  # a header of the same length
    d = _safetensors(
        tmp_path / "d" / "model.safetensors",
        '{"__metadata__": {"format": "pt", "k": "v"}, ' + f16 + "}",
        data,
    )
    assert not same_weights(a.parent, d.parent)  # the same bytes read as other tensors
    for name in ("e", "f"):  # a header cut short, and a first word that is no header's length
        _safetensors(tmp_path / name / "model.safetensors", '{"__metadata__": {"format": "pt", "k"', data)
        (tmp_path / f"{name}2").mkdir()
        (tmp_path / f"{name}2" / "model.safetensors").write_bytes(
            (tmp_path / name / "model.safetensors").read_bytes()
        )
    (tmp_path / "f" / "model.safetensors").write_bytes(b"\xff" * 8 + data)
    (tmp_path / "f2" / "model.safetensors").write_bytes(b"\xff" * 8 + data)
    assert not same_weights(tmp_path / "e", tmp_path / "e2") and not same_weights(
        tmp_path / "f", tmp_path / "f2"
    )


def test_a_kept_start_reads_back_its_starts_evaluation(tmp_path):
    sft, kept = _model(tmp_path / "sft" / "final"), _model(tmp_path / "sage" / "best" / "model")
    start = _ev(tmp_path / "eval" / "sft_dev", sft)
    rows = _finished(start)
    nolib = _ev(tmp_path / "eval" / "sft_nolib_dev", sft, skills={"use_skills": False})
    _finished(nolib)
    arm = _ev(tmp_path / "eval" / "sage_dev", kept)
    folders = sorted((tmp_path / "eval").glob("*_dev"))
    assert twin(arm, folders) == Path(start.out_dir)  # not sft_nolib: another setting
    # a stopped evaluation of the arm left part of its chains: the twin's replace them
    Path(arm.out_dir).mkdir()
    (Path(arm.out_dir) / "trajectories.same_scenario.jsonl").write_text('{"partial": 1}\n')
    note = read_twin(arm, Path(start.out_dir))
    assert note["same_weights_as"] == str(sft) and note["model"] == str(kept)
    assert json.loads((Path(arm.out_dir) / SAME_AS).read_text())["evaluation"] == start.out_dir
    assert (Path(arm.out_dir) / "trajectories.same_scenario.jsonl").read_text() == '{"chain": 1}\n'
    assert json.loads((Path(arm.out_dir) / SETTINGS).read_text()) == settings_of(arm)  # its own settings
    assert evaluate(arm)["outcomes"] == rows  # read back as any finished evaluation: nothing runs
    other = _ev(tmp_path / "eval" / "grpo_lib_dev", _model(tmp_path / "grpo_lib" / "best" / "model"))
    folders = sorted((tmp_path / "eval").glob("*_dev"))  # sage_dev (a read-back) sorts before sft_dev
    assert twin(other, folders) == Path(start.out_dir)  # the evaluation that ran, not a read-back of it
    (
        Path(start.out_dir) / "outcomes.json"
    ).unlink()  # the start's gone: the arm's own folder is no twin of it
    assert twin(arm, sorted((tmp_path / "eval").glob("*_dev"))) is None


def test_anything_else_is_evaluated(tmp_path):
    sft = _model(tmp_path / "sft" / "final")
    start = _ev(tmp_path / "eval" / "sft_dev", sft)
    _finished(start)
    folders = [Path(start.out_dir)]
    moved = _model(tmp_path / "sage" / "step_2", weights=b"\x00\x00\x80?\x00\x00\x10@")
    assert twin(_ev(tmp_path / "eval" / "sage_dev", moved), folders) is None  # trained weights
    kept = _model(tmp_path / "sage" / "best")
    assert twin(_ev(tmp_path / "eval" / "sage_dev", kept, limit_scenarios=1), folders) is None  # a setting
    sampled = {"sampling": {"temperature": 0.5}}
    _finished(_ev(tmp_path / "eval" / "sft_sampled_dev", sft, **sampled))
    sampled_kept = _ev(tmp_path / "eval" / "sage_sampled_dev", kept, **sampled)
    assert twin(sampled_kept, [tmp_path / "eval" / "sft_sampled_dev"]) is None  # greedy evaluations only
    (Path(start.out_dir) / SETTINGS).write_text("{not json")
    assert twin(_ev(tmp_path / "eval" / "sage_dev", kept), folders) is None  # unreadable: unchecked
    (Path(start.out_dir) / SETTINGS).write_text(json.dumps(settings_of(start)))
    (Path(start.out_dir) / "outcomes.json").unlink()
    assert twin(_ev(tmp_path / "eval" / "sage_dev", kept), folders) is None  # not finished


def test_the_results_name_each_evaluation_read_back(tmp_path):
    from sage_rl.recipe.results import read_back

    for name, text in (
        ("sage_dev", json.dumps({"evaluation": str(tmp_path / "eval" / "sft_dev")})),
        ("grpo_lib_dev", "{"),
    ):
        (tmp_path / "eval" / name).mkdir(parents=True)
        (tmp_path / "eval" / name / SAME_AS).write_text(text)
    (tmp_path / "eval" / "sft_dev").mkdir()
    assert read_back(tmp_path) == {"grpo_lib_dev": "unreadable same_as.json", "sage_dev": "sft_dev"}


def test_read_back_copies_a_twin_in_once_and_leaves_a_finished_evaluation_alone(tmp_path):
    from sage_rl.recipe.twins import read_back

    sft, kept = _model(tmp_path / "sft" / "final"), _model(tmp_path / "sage" / "best" / "model")
    start = _ev(tmp_path / "eval" / "sft_dev", sft)
    rows = _finished(start)
    arm = _ev(tmp_path / "eval" / "sage_dev", kept)
    assert read_back(arm, [Path(start.out_dir)]) == Path(start.out_dir)
    assert json.loads((Path(arm.out_dir) / "outcomes.json").read_text())["outcomes"] == rows
    assert read_back(arm, [Path(start.out_dir)]) is None  # finished now: itself, not copied again
    moved = _ev(tmp_path / "eval" / "grpo_dev", _model(tmp_path / "grpo" / "m", weights=b"\x00" * 8))
    # nothing to copy
    assert read_back(moved, [Path(start.out_dir)]) is None and not Path(moved.out_dir).exists()


def test_the_main_job_reads_back_a_sage_run_that_kept_the_sft_weights(tmp_path):
    """``sage-rl recipe`` (``pipeline._evaluate_all``): SAGE's evaluation of weights byte-identical
    to the SFT model's, under the same settings, is the SFT evaluation read back (nothing runs:
    the SFT evaluation here exists only on disk); the report's SAGE row names the kept step."""
    from sage_rl.config import load_config
    from sage_rl.recipe.pipeline import Layout, _evaluate_all, eval_config
    from sage_rl.recipe.report import _what
    from sage_rl.settings import TrainConfig

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(
        TrainConfig, root / "configs/quickstart.yaml", [f"out_dir={tmp_path}", "recipe.eval.scenarios=1"]
    )
    lay, r = Layout(tmp_path), cfg.recipe
    sft, kept = _model(lay.sft / "final"), _model(lay.sage / "best" / "step_000000" / "model")
    rows = {}
    for split in r.eval.splits:
        rows[split] = _finished(
            eval_config(cfg, str(sft), split, r.eval.scenarios, 1, lay.eval("sft", split))
        )
    done = _evaluate_all(cfg, r, lay, "sage", str(kept))
    for split in r.eval.splits:
        assert done[split]["outcomes"] == rows[split]
        assert json.loads((lay.eval("sage", split) / SAME_AS).read_text())["evaluation"] == str(
            lay.eval("sft", split)
        )
    row = _what("sage", {"result": {"steps": 3, "sampled_tokens": 1200, "kept": {"step": 0, "tgc": 50.0}}})
    assert row == "3 steps, 1,200 sampled tokens, keeps the weights of step 0"
    assert _what("sage", {"result": {"steps": 3, "sampled_tokens": 1200, "kept": None}}).endswith(
        "sampled tokens"
    )
