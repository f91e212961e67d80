"""Stage summaries written whole or not at all (sage_rl/files.py), and a damaged one read back as a
one-line error naming it (recipe/pipeline.read_summary), not a traceback at the next start."""

import os

import pytest

from sage_rl import files
from sage_rl.recipe.pipeline import RecipeError, evaluate, read_summary, run_once


def test_a_write_that_fails_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    files.write_atomic(path, '{"examples": 879}')
    assert path.read_text() == '{"examples": 879}' and [p.name for p in tmp_path.iterdir()] == [
        "summary.json"
    ]

    def killed(src, dst):  # the process dies between writing the new text and renaming it
        raise OSError("killed")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(OSError, match="killed"):
        files.write_atomic(path, '{"examples": 881, "scenarios": {"run": 330}}')
    assert path.read_text() == '{"examples": 879}'  # a reader never sees half of the new one


@pytest.mark.parametrize(
    "data", [b'{"examples": 8', b"[1, 2]", b"\xff\xfe{}"], ids=["torn", "list", "not-utf8"]
)
def test_a_damaged_summary_is_named_not_a_traceback(tmp_path, data):
    done = tmp_path / "sft" / "result.json"
    done.parent.mkdir()
    done.write_bytes(data)
    ran = []
    with pytest.raises(
        RecipeError, match=rf"^{done}: the stage's summary .*delete it to run the stage again"
    ):
        run_once(done, ran.append, "cfg")
    assert ran == []  # the stage is neither re-run silently nor skipped with garbage


def test_a_missing_or_whole_summary(tmp_path):
    done = tmp_path / "summary.json"
    assert run_once(done, lambda cfg: {"ran": cfg}, 7) == {"ran": 7}
    files.write_atomic(done, '{"examples": 3}')
    assert run_once(done, lambda cfg: {"ran": cfg}, 7) == {"examples": 3}
    with pytest.raises(RecipeError, match="cannot be read"):
        read_summary(tmp_path / "nothing.json")


def test_an_evaluation_with_damaged_outcomes_is_named(tmp_path):
    from sage_rl.settings import EvalRunConfig

    folder = tmp_path / "eval" / "sft_dev"
    folder.mkdir(parents=True)
    (folder / "outcomes.json").write_text('{"metrics": {"tgc": 0.6')
    with pytest.raises(RecipeError, match="outcomes.json: the stage's summary cannot be read"):
        evaluate(EvalRunConfig(out_dir=str(folder)))
