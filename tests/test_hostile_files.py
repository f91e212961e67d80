"""Corrupt, crafted and foreign files (issue 11): training checkpoints and ``--resume``, skill
imports and stores, YAML configs. Each gives an error that names the file and what is wrong, runs
no code from it, and loses nothing (the metrics file is not cut, a foreign database not touched,
the good records of an import still land).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from sage_rl.train.checkpoint import CheckpointError, latest_checkpoint, open_run, save_checkpoint
from sage_rl.train.trainer import Trainer, TrainerConfig

sys.path.insert(0, str(Path(__file__).parent))
from test_trainer import make_sample, small_model  # noqa: E402

CFG = TrainerConfig(lr=1e-2, micro_batch_size=2, seed=3)


# -- checkpoints and --resume ------------------------------------------------------------------------


@pytest.fixture
def run_dir(tmp_path):
    """A run of two steps with a checkpoint after each (the metrics file has two rows)."""
    torch.set_num_threads(1)
    trainer = Trainer(small_model(), None, CFG)
    logger, _ = open_run(trainer, tmp_path, resume=False, tensorboard=False)
    for step in (1, 2):
        logger.log(step, trainer.step([make_sample([1, 2, 3], [([4, 5], [])], 1.0)], 1))
        save_checkpoint(trainer, tmp_path, logger.offset())
    logger.close()
    return tmp_path


def _resume(run_dir):
    return open_run(Trainer(small_model(seed=9), None, CFG), run_dir, resume=True, tensorboard=False)


def _refused(run_dir, names: str) -> str:
    """Resuming raises a CheckpointError naming ``names``; the metrics file is left as it was."""
    metrics = run_dir / "metrics.jsonl"
    before = metrics.read_bytes()
    with pytest.raises(CheckpointError) as e:
        _resume(run_dir)
    assert names in str(e.value), str(e.value)
    assert metrics.read_bytes() == before
    return str(e.value)


def test_resume_works_and_an_empty_folder_starts_at_zero(run_dir, tmp_path_factory):
    logger, start = _resume(run_dir)
    logger.close()
    assert start == 2
    logger, start = _resume(tmp_path_factory.mktemp("empty"))
    logger.close()
    assert start == 0


def test_metrics_without_a_checkpoint_is_an_error_not_a_restart(run_dir):
    (run_dir / "checkpoints" / "latest").unlink()
    msg = _refused(run_dir, str(run_dir / "checkpoints" / "latest"))
    assert "step_000002" in msg  # it says which folder to resume from
    import shutil

    shutil.rmtree(run_dir / "checkpoints")
    assert "another out_dir" in _refused(run_dir, "metrics.jsonl")


@pytest.mark.parametrize("content", [b"\xff\xfe garbage \x00", b"step_999999", b"../../etc"])
def test_a_garbage_latest_pointer(run_dir, content):
    (run_dir / "checkpoints" / "latest").write_bytes(content)
    _refused(run_dir, "latest")


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[]", b'{"step": -1, "metrics_offset": 0}', b'{"step": "2", "metrics_offset": 1}'],
)
def test_a_corrupt_state_file(run_dir, content):
    (latest_checkpoint(run_dir) / "state.json").write_bytes(content)
    _refused(run_dir, "state.json")


@pytest.mark.parametrize("name", ["model/model.safetensors", "optimizer.pt", "rng.pt"])
@pytest.mark.parametrize("damage", ["garbage", "truncated", "missing"])
def test_a_corrupt_weight_file(run_dir, name, damage):
    path = latest_checkpoint(run_dir) / name
    if damage == "garbage":
        path.write_bytes(os.urandom(2048))
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        path.unlink()
    message = _refused(run_dir, name)
    # one line: torch's weights-only unpickler adds paragraphs advising weights_only=False
    assert "\n" not in message and "weights_only" not in message, message


class _RunsCode:
    """Unpickling this runs ``os.system``: what a crafted rng.pt would do with weights_only=False."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_rng_file_runs_no_code(run_dir, tmp_path_factory):
    marker = tmp_path_factory.mktemp("pwned") / "ran"
    torch.save({"python": _RunsCode(marker)}, latest_checkpoint(run_dir) / "rng.pt")
    _refused(run_dir, "rng.pt")
    assert not marker.exists()


def test_rng_states_of_the_wrong_shape(run_dir):
    torch.save(
        {"python": [3, [1, 2], None], "numpy": [], "torch": torch.zeros(3)},
        latest_checkpoint(run_dir) / "rng.pt",
    )
    _refused(run_dir, "rng.pt")


def test_a_metrics_file_shorter_than_the_checkpoint_says(run_dir):
    metrics = run_dir / "metrics.jsonl"
    metrics.write_bytes(metrics.read_bytes()[:10])
    _refused(run_dir, "metrics.jsonl")


def test_train_cli_reports_a_broken_resume_without_a_traceback(run_dir, tiny):
    """``sage-rl train --resume`` turns the error into one line naming the file, exit code 2."""
    import typer
    from typer.testing import CliRunner

    from sage_rl.cli.train import main
    from sage_rl.models import save_plain

    app = typer.Typer()
    app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(main)
    model_dir = run_dir / "tiny_model"
    save_plain(tiny[0], model_dir)
    tiny[1].save_pretrained(model_dir)
    (run_dir / "checkpoints" / "latest").write_text("nonsense")
    before = (run_dir / "metrics.jsonl").read_bytes()
    args = [f"policy.model={model_dir}", f"out_dir={run_dir}", "init_from=null", "--resume"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "checkpoints/latest should name a checkpoint folder" in r.stderr.replace("\n", "")
    assert r.exception is None or isinstance(r.exception, SystemExit)  # no traceback
    assert (run_dir / "metrics.jsonl").read_bytes() == before


# -- skill imports and stores ----------------------------------------------------------------------

GOOD = {"name": "f", "source": "def f(x):\n    return x"}
BAD_RECORDS = {
    "imports not a list": {**GOOD, "imports": 5},
    "depends_on not a list": {**GOOD, "depends_on": 5},
    "version past SQLite": {**GOOD, "version": 10**23},
    "created_at a word": {**GOOD, "provenance": {"created_at": "yesterday"}},
    "created_at NaN": {**GOOD, "provenance": {"created_at": float("nan")}},
    "uses a bool": {**GOOD, "uses": True},
    "version zero": {**GOOD, "version": 0},
    "an import that is code": {**GOOD, "imports": ["import os; apis.supervisor.complete_task()"]},
    "a name that is no identifier": {**GOOD, "name": "f x"},
    "a tier from nowhere": {**GOOD, "tier": ["gold"]},
    "provenance a list": {**GOOD, "provenance": [1]},
    "step negative": {**GOOD, "provenance": {"step": -4}},
    "signature not text": {**GOOD, "signature": 7},
}


def _jsonl(tmp_path, extra_lines=()):
    import json

    doc = '    """Count the good things."""\n'
    lines = [json.dumps({**GOOD, "name": "good_one", "source": f"def good_one():\n{doc}    return 1"})]
    lines += [json.dumps(r) for r in BAD_RECORDS.values()]
    lines += list(extra_lines)
    lines.append(json.dumps({**GOOD, "name": "good_two", "source": f"def good_two():\n{doc}    return 2"}))
    path = tmp_path / "skills.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_poisoned_import_reports_each_bad_line_and_keeps_the_good_ones(tmp_path):
    from sage_rl.skills.io import read_jsonl

    deep = "[" * 100_000 + "]" * 100_000
    huge_int = '{"name": "f", "source": "def f(x):\\n    return x", "version": 1' + "0" * 5000 + "}"
    path = _jsonl(tmp_path, [deep, huge_int, '{"name": "g", "source": "def g(:"}'])
    report = read_jsonl(path)
    assert [s.name for s in report.skills] == ["good_one", "good_two"]
    bad = {e.line: e.message for e in report.errors}
    assert sorted(bad) == list(range(2, len(BAD_RECORDS) + 5))  # every bad line, by number
    msgs = dict(zip(BAD_RECORDS, [bad[i] for i in range(2, len(BAD_RECORDS) + 2)], strict=True))
    assert "imports must be a list" in msgs["imports not a list"]
    assert "depends_on must be a list" in msgs["depends_on not a list"]
    assert "version must be a positive integer below 2**62" in msgs["version past SQLite"]
    assert "created_at must be seconds since the epoch" in msgs["created_at a word"]
    assert "must be an import statement" in msgs["an import that is code"]
    assert all(not m.startswith("unexpected") for m in bad.values()), bad


def test_import_then_search_and_load_through_the_cli(tmp_path):
    from typer.testing import CliRunner

    from sage_rl.cli.skills import app
    from sage_rl.skills.store import SkillStore

    store = tmp_path / "s.db"
    res = CliRunner().invoke(app, ["import", str(_jsonl(tmp_path)), "--store", str(store), "--json"])
    assert res.exit_code == 1  # some records were bad ...
    assert '"added": 2' in res.stdout  # ... and the good ones landed
    res = CliRunner().invoke(app, ["search", "count the good things", "--store", str(store), "--json"])
    assert res.exit_code == 0 and "good_one" in res.stdout
    with SkillStore(store, readonly=True) as st:
        assert st.load_library().names() == ("good_one", "good_two")


def test_a_poisoned_stored_record_cannot_break_search_or_loading(tmp_path):
    """A row written by an older version or by hand: it is skipped (and named), never fatal."""
    import json
    import sqlite3

    from sage_rl.skills import make_skill
    from sage_rl.skills.store import SkillStore, StoreError

    path = tmp_path / "s.db"
    with SkillStore(path) as st:
        st.put(make_skill('def a():\n    """Count the good things."""\n    return 1'))
        st.put(make_skill("def b():\n    return 2"))
    poisoned = json.dumps(
        {**GOOD, "name": "b", "source": "def b():\n    return 2", "provenance": {"created_at": "yesterday"}}
    )
    with sqlite3.connect(path) as db:
        db.execute("UPDATE skills SET record = ? WHERE name = 'b'", (poisoned,))
    with SkillStore(path, readonly=True) as st:
        assert st.load_library().names() == ("a",)
        assert "stored record 'b' v1 is corrupt" in st.skipped[0] and "created_at" in st.skipped[0]
        with pytest.raises(StoreError, match="'b' v1 is corrupt"):
            st.get("b")
    from typer.testing import CliRunner

    from sage_rl.cli.skills import app

    res = CliRunner().invoke(app, ["search", "count the good things", "--store", str(path), "--json"])
    assert res.exit_code == 0 and '"a"' in res.stdout


def _foreign(path, schema=None):
    import sqlite3

    with sqlite3.connect(path) as db:
        if schema is None:
            db.execute("CREATE TABLE accounts (id INTEGER, secret TEXT)")
            db.execute("INSERT INTO accounts VALUES (1, 'hunter2')")
        else:
            db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            db.execute("CREATE TABLE skills (name TEXT)")
            db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(schema),))
    db.close()


@pytest.mark.parametrize("schema", [None, 2])
def test_a_foreign_or_other_version_sqlite_file_is_refused_untouched(tmp_path, schema):
    import hashlib

    from typer.testing import CliRunner

    from sage_rl.cli.skills import app
    from sage_rl.skills.store import SkillStore, StoreError

    path = tmp_path / "other.db"
    _foreign(path, schema)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(StoreError, match="not a sage-rl skill store of schema 1.*left untouched"):
        SkillStore(path)
    res = CliRunner().invoke(app, ["import", str(_jsonl(tmp_path)), "--store", str(path)])
    assert res.exit_code == 2 and "not a sage-rl skill store" in res.output
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest  # no table added, no WAL switch
    assert not (tmp_path / "other.db-wal").exists() and not (tmp_path / "other.db-journal").exists()


def test_scrambled_pages_give_a_clear_error(tmp_path):
    from typer.testing import CliRunner

    from sage_rl.cli.skills import app
    from sage_rl.skills import make_skill
    from sage_rl.skills.store import SkillStore, StoreError

    path = tmp_path / "s.db"
    with SkillStore(path) as st:
        st.put_many([make_skill(f"def s{i}():\n    '''{'doc ' * 200}'''\n    return {i}") for i in range(60)])
    data = bytearray(path.read_bytes())
    assert len(data) > 4 * 4096
    data[2 * 4096 : 4 * 4096] = os.urandom(2 * 4096)  # pages 3 and 4: the header stays valid
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError) as e:
        SkillStore(path, readonly=True).current()
    assert str(path) in str(e.value) and "corrupt" in str(e.value)
    res = CliRunner().invoke(app, ["list", "--store", str(path)])
    assert res.exit_code == 2 and "Traceback" not in res.output and str(path) in res.output.replace("\n", "")


# -- YAML configs ------------------------------------------------------------------------------------


def _bomb(levels: int = 9) -> str:
    """The "billion laughs": 9 aliases of 9 aliases of ... (342 bytes; 9**9 strings expanded)."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    prev = "a"
    for name in "bcdefghijklmnop"[: levels - 1]:
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
        prev = name
    return "\n".join(lines) + "\n"


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path):
    import time

    from sage_rl.build import RunConfig
    from sage_rl.config import ConfigError, load_config

    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb())
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"bomb.yaml: YAML aliases expand to more than 100000 values"):
        load_config(RunConfig, path)
    with pytest.raises(ConfigError, match="override 'seed=.*expand to more than"):
        load_config(RunConfig, None, ["seed=" + _bomb().replace("\n", ", ").join("{}")])
    assert time.perf_counter() - start < 5


def test_recursive_aliases_and_absurd_nesting_are_refused(tmp_path):
    from sage_rl.build import RunConfig
    from sage_rl.config import ConfigError, load_config

    path = tmp_path / "c.yaml"
    path.write_text("seed: &a [1, *a]\n")
    with pytest.raises(ConfigError, match="alias refers to itself"):
        load_config(RunConfig, path)
    path.write_text("seed: " + "[" * 20_000 + "]" * 20_000 + "\n")
    with pytest.raises(ConfigError, match="c.yaml"):
        load_config(RunConfig, path)


def test_modest_anchors_still_work(tmp_path):
    from sage_rl.config import load_yaml

    assert load_yaml("base: &b {x: 1}\nrun: {<<: *b, y: 2}\n", "t") == {
        "base": {"x": 1},
        "run": {"x": 1, "y": 2},
    }
    assert load_yaml(_bomb(levels=3), "t")["c"][0][0] == ["lol"] * 9  # 9**3 values: fine
