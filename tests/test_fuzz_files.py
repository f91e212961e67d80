"""A property-based fuzz (hypothesis) of the readers of chain files: a damaged line costs that
line, never the run, and never another line.

The files are real: chains of the scripted expert through ``ChainRunner`` and PocketWorld, written
as an evaluation's streamed ``trajectories.*.jsonl`` and as a step's journal. Each example damages
them as a kill, a disk or another version would (cut anywhere, bytes flipped or inserted, a value
of another type or a key gone anywhere inside a record, a line of junk), then reads them back with
every reader a resumed or reported run uses:

- ``eval.resume.finished`` (an evaluation's resume): the chains of the lines left whole, or
  ``ResumeError`` naming the file;
- ``StepJournal`` (a training step's resume): never raises; the groups of the lines left whole
  come back as they were written;
- ``view.read.read_run`` (the viewer): the chains of the lines left whole, one problem naming the
  file for each line that is not one;
- ``recipe.controls.per_task`` (the results' steps and tokens): the tasks of the lines left whole;
- ``recipe.controls.screened_templates`` (an RL arm's pool in the results, from ``screens.jsonl``):
  the templates of the screens whose lines are left whole.

Before this test, a value of another type inside a record (an outcome that is a number) raised
``AttributeError`` out of the journal and ``per_task``, and any damaged line stopped ``per_task`` and
``screened_templates`` (the results' table).
``SAGE_FUZZ_EXAMPLES=N`` runs a random hunt (as in ``test_fuzz_rollout.py``).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import random
import shutil

import pytest
from fuzzing import fuzz
from hypothesis import given
from hypothesis import strategies as st

from sage_rl.build import build_runner
from sage_rl.collect_store import LEDGER, CollectStore, StoreError
from sage_rl.config import load_config
from sage_rl.data.records import DatasetError, read_jsonl
from sage_rl.envs.pocketworld.env import PocketWorldSuite
from sage_rl.envs.pocketworld.expert import ScriptedExpert
from sage_rl.eval.resume import ResumeError, finished
from sage_rl.recipe.controls import metric_rows, per_task, screened_templates
from sage_rl.rollout.journal import StepJournal
from sage_rl.runs.collect import run_collect
from sage_rl.settings import CollectConfig, TrainConfig
from sage_rl.skills import Library
from sage_rl.text import dumps
from sage_rl.train.logging import MetricsLogger, is_metric, read_metrics
from sage_rl.types import Chain
from sage_rl.view.overview import overview
from sage_rl.view.read import read_run

FUZZ = fuzz(40)
KEY = "weights-and-settings"
OTHER = st.sampled_from([None, 0, -1, 1.5, "x", "", [], {}, [1], {"a": 1}, True, 10**30])
JUNK = st.sampled_from(["[]", "1", "null", '"x"', "{}", '{"trajectories": 5}', '{"group": 1}', "\x00\xff"])
DAMAGE = st.one_of(
    st.tuples(st.just("cut"), st.floats(0, 1)),
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(0, 255)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("retype"), st.floats(0, 1), st.floats(0, 1), OTHER),
    st.tuples(st.just("drop_key"), st.floats(0, 1), st.floats(0, 1)),
    st.tuples(st.just("junk"), st.floats(0, 1), JUNK),
)
DAMAGES = st.lists(DAMAGE, min_size=1, max_size=3)


def _places(o):
    """Every (container, key) inside a JSON value."""
    items = o.items() if isinstance(o, dict) else enumerate(o) if isinstance(o, list) else ()
    for k, v in items:
        yield o, k
        yield from _places(v)


def damage(data: bytes, ops) -> bytes:
    for op, at, *args in ops:
        i = int(at * len(data))
        if op == "cut":
            data = data[:i]
        elif op == "flip" and data:
            i = min(i, len(data) - 1)
            data = data[:i] + bytes([args[0]]) + data[i + 1 :]
        elif op == "insert":
            data = data[:i] + args[0] + data[i:]
        else:  # a whole line changed
            lines = data.split(b"\n")
            n = min(int(at * len(lines)), len(lines) - 1)
            if op == "junk":
                lines.insert(n, args[0].encode("utf-8", "surrogateescape"))
            else:
                try:
                    record = json.loads(lines[n])
                except ValueError:
                    continue
                places = list(_places(record))
                if not places:
                    continue
                where, key = places[min(int(args[0] * len(places)), len(places) - 1)]
                if op == "retype":
                    where[key] = copy.deepcopy(args[1])  # a value drawn twice is two values
                elif isinstance(where, dict):
                    del where[key]
                lines[n] = json.dumps(record, ensure_ascii=False).encode()
            data = b"\n".join(lines)
    return data


@pytest.fixture(scope="module")
def chains() -> list[Chain]:
    """Three chains of two tasks (the second loads the first's skills), in-process PocketWorld."""
    suite = PocketWorldSuite()
    runner = build_runner(load_config(TrainConfig, None, []), ScriptedExpert(seed=1), suite)
    rng = random.Random(3)
    return [asyncio.run(runner.run(suite.sample_chain(rng, 2), Library(), chain_index=i)) for i in range(3)]


def _whole(original: list[bytes], damaged: bytes) -> list[int]:
    """Which original lines are still a line of the damaged file, byte for byte."""
    left = set(damaged.split(b"\n"))
    return [i for i, line in enumerate(original) if line in left]


@FUZZ
@given(ops=DAMAGES)
def test_a_damaged_trajectories_file_costs_only_its_damaged_lines(tmp_path, chains, ops, caplog):
    caplog.set_level(logging.CRITICAL)
    folder = tmp_path / "eval"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    lines = [dumps(c).encode() for c in chains]
    data = damage(b"\n".join(lines) + b"\n", ops)
    path = folder / "trajectories.same_scenario.jsonl"
    path.write_bytes(data)
    whole = _whole(lines, data)
    scenarios = [tuple(t.task for t in c.trajectories) for c in chains]

    try:
        found = finished(path, scenarios)
    except ResumeError as e:
        assert str(path) in str(e)
    else:
        assert set(found) <= set(range(len(chains)))
        assert all(found[i] == chains[i] for i in whole)

    run = read_run(folder)  # an evaluation folder whatever its lines hold: no ViewError
    shown = run.sections[0].chains if run.sections else ()
    assert all(chains[i] in shown for i in whole)
    lines_read = sum(1 for line in data.split(b"\n") if line.strip())
    assert len(shown) + sum(str(path) in p for p in run.problems) == lines_read  # each line shown or named

    steps = per_task(folder)
    for i in whole:
        for t in chains[i].trajectories:
            assert steps[t.task.task_id] == [len(t.turns), t.num_generated_tokens]


@FUZZ
@given(ops=DAMAGES)
def test_a_damaged_step_journal_costs_only_its_damaged_groups(tmp_path, chains, ops, caplog):
    caplog.set_level(logging.CRITICAL)
    path = tmp_path / "step_000001.partial.jsonl"
    for old in (path, path.with_suffix(".stale")):
        old.unlink(missing_ok=True)
    journal = StepJournal(path, KEY)
    for i, chain in enumerate(chains):
        journal.add(i, [chain])
    head, *lines = path.read_bytes().split(b"\n")[:-1]
    data = damage(path.read_bytes(), ops)
    path.write_bytes(data)
    first = next((line for line in data.split(b"\n") if line), b"")
    whole = _whole(lines, data) if first == head else []  # a damaged key line: every group is sampled again

    again = StepJournal(path, KEY)  # never raises
    for i in whole:
        chain = chains[i]
        tasks = [t.task for t in chain.trajectories]
        assert again.take(i, tasks, 1, Library()) == [chain]


def test_the_damage_is_what_it_says():
    data = b'{"a": [1, 2]}\nxyz\n'
    assert damage(data, [("cut", 0.5)]) == data[:9]
    assert damage(data, [("flip", 0.0, 65)]) == b"A" + data[1:]
    assert damage(data, [("insert", 1.0, b"!")]) == data + b"!"
    assert damage(data, [("retype", 0.0, 0.0, None)]) == b'{"a": null}\nxyz\n'
    assert damage(data, [("drop_key", 0.0, 0.0)]) == b"{}\nxyz\n"
    assert damage(data, [("junk", 0.5, "[]")]) == b'{"a": [1, 2]}\n[]\nxyz\n'
    assert _whole([b'{"a": [1, 2]}', b"xyz"], damage(data, [("junk", 0.5, "[]")])) == [0, 1]


def test_a_damaged_line_that_claims_another_groups_index_does_not_cost_that_group(tmp_path, chains):
    """A line of group 2 whose index was damaged into 0, after group 0's whole line: group 0 is
    still taken from the journal (each index keeps every line that claimed it; ``take`` picks the
    one of its tasks), and group 2 is sampled again."""
    path = tmp_path / "step_000001.partial.jsonl"
    journal = StepJournal(path, KEY)
    for i, chain in enumerate(chains[:2]):
        journal.add(i, [chain])
    with open(path, "a", encoding="utf-8") as f:
        f.write(dumps({"group": 0, "chains": [chains[2]]}) + "\n")
    again = StepJournal(path, KEY)
    assert again.take(0, [t.task for t in chains[0].trajectories], 1, Library()) == [chains[0]]
    assert again.take(2, [t.task for t in chains[2].trajectories], 1, Library()) is None


SCREENS = [
    {"step": 0, "pool": ["mail_a", "notes_b"], "success": {"mail_a": 0.5, "notes_b": 0.25, "todo_d": 1.0}, "tokens": 10, "seconds": 1.0},
    {"step": 40, "pool": ["music_c"], "success": {"music_c": 0.5}, "tokens": 12, "seconds": 1.5},
]


@FUZZ
@given(ops=DAMAGES)
def test_a_damaged_screens_file_costs_only_its_damaged_screens(tmp_path, ops, caplog):
    caplog.set_level(logging.CRITICAL)
    lines = [json.dumps(row).encode() for row in SCREENS]
    data = damage(b"\n".join(lines) + b"\n", ops)
    (tmp_path / "screens.jsonl").write_bytes(data)
    pool = screened_templates(tmp_path)
    assert all(isinstance(t, str) for t in pool)
    assert all(set(SCREENS[i]["pool"]) <= pool for i in _whole(lines, data))


@pytest.fixture(scope="module")
def collection(tmp_path_factory) -> CollectConfig:
    """A scripted collection of 3 scenarios, some of whose tasks fail (so some are dropped)."""
    folder = tmp_path_factory.mktemp("collect") / "expert"
    cfg = CollectConfig(out_dir=str(folder), num_scenarios=3, scripted_fail_rate=0.3, concurrency=1)
    run_collect(cfg)
    return cfg


@FUZZ
@given(which=st.sampled_from([LEDGER, "sage_expert.jsonl"]), ops=DAMAGES)
def test_a_damaged_collection_resumes_or_names_the_line(tmp_path, collection, which, ops, caplog):
    """The ledger or the dataset damaged: resuming the collection either works, with the dataset cut
    back to what the ledger committed, or raises ``StoreError`` naming the folder; the SFT reader
    reads the dataset or raises ``DatasetError`` naming it; the viewer shows the folder. Before, a
    ledger value of another type (``"jsonl_bytes": null``) stopped the resume with a bare TypeError,
    and the viewer's reading of the ledger with 12 other TypeErrors in 1,500 random tries."""
    caplog.set_level(logging.CRITICAL)
    folder = tmp_path / "expert"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(collection.out_dir, folder)
    f = folder / which
    f.write_bytes(damage(f.read_bytes(), ops))
    read_run(folder)  # no exception
    try:
        store = CollectStore(folder, collection.name, collection.identity())
    except StoreError as e:
        assert str(folder) in str(e)
    else:
        committed = store.records[-1].jsonl_bytes if store.records else 0
        assert store.dataset.stat().st_size == committed
        assert all(isinstance(r.jsonl_bytes, int) and isinstance(r.scenario_id, str) for r in store.records)
    dataset = folder / f"{collection.name}.jsonl"
    if dataset.is_file():
        try:
            examples = read_jsonl(dataset)
        except DatasetError as e:
            assert str(dataset) in str(e)
        else:
            assert all(isinstance(x.position, int) and isinstance(x.library, tuple) for x in examples)


METRICS = [
    {"step": 0, "eval/tgc": 40.0, "eval/sgc": 20.0},
    *(
        {"step": s, "reward": 0.5 * s, "success": 0.25, "skill_use_success": float("nan"),
         "sampled_tokens": 1000 + s, "sampled_tokens_total": 1000 * s + s * (s + 1) // 2, "updated": s != 2}
        for s in (1, 2, 3)
    ),
]  # fmt: skip


#: a value that is not a number put anywhere in a row, beside the other damages
NOT_A_NUMBER = st.tuples(st.just("retype"), st.floats(0, 1), st.floats(0, 1), st.sampled_from(["x", "", [], {}]))


@fuzz(24)  # each example draws the overview's curves
@given(ops=st.lists(st.one_of(NOT_A_NUMBER, DAMAGE), min_size=1, max_size=3))
def test_a_damaged_metrics_file_costs_only_its_damaged_rows(tmp_path, ops, caplog):
    """A run's ``metrics.jsonl`` (written by ``MetricsLogger``) damaged: the results' and the report's
    reader (``metric_rows``) and the viewer keep every whole row and only rows of numbers; the
    resume's strict reader (``read_metrics``, the sampled-token count) returns the same rows or names
    the file. Before, a value of another type reached a plot or ``int()``."""
    caplog.set_level(logging.CRITICAL)
    folder = tmp_path / "run"
    shutil.rmtree(folder, ignore_errors=True)
    logger = MetricsLogger(folder, tensorboard=False)
    for row in METRICS:  # a flag as a bool, as a trainer may report one: a number to every reader
        logger.log(row["step"], {k: v for k, v in row.items() if k != "step"})
    logger.close()
    path = folder / "metrics.jsonl"
    lines = path.read_bytes().split(b"\n")[:-1]
    data = damage(path.read_bytes(), ops)
    path.write_bytes(data)
    written = [json.loads(line) for line in lines]

    rows = metric_rows(path)
    assert all(written[i] in rows for i in _whole(lines, data))
    assert all(is_metric(v) for r in rows for v in r.values())
    try:
        assert read_metrics(folder) == rows
    except ValueError as e:
        assert str(path) in str(e)
    if rows:  # a metrics file with no row is not a run folder to the viewer
        run = read_run(folder)
        assert list(run.metrics_rows) == rows
        overview(run)  # the curves are drawn
