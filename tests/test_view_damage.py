"""``sage-rl view`` on bad input (issue 15): a folder that is not a run, lines cut or flipped, and
valid JSON or YAML of another type anywhere in a run's files. The page is still built, every link
resolves, what was lost is named in one sentence, and everything readable is shown."""

from __future__ import annotations

import copy
import json
import random
import shutil
from html import unescape

import yaml
from fuzzing import fuzz
from hypothesis import given
from hypothesis import strategies as st
from view_support import Page, assert_links_resolve, build, cli


def test_bad_input_is_named_in_one_sentence_and_readable_lines_are_still_shown(eval_run, tmp_path):
    r = cli("view", str(tmp_path))
    assert r.returncode == 2 and "is not a sage-rl run folder" in r.stderr and len(r.stderr.splitlines()) == 1
    bad = tmp_path / "bad"
    shutil.copytree(eval_run, bad)
    f = bad / "trajectories.same_scenario.jsonl"
    lines = f.read_text().splitlines(keepends=True)
    f.write_text(lines[0] + lines[1] + lines[2][:200])  # a crash mid-write: the last line is cut off
    r = cli("view", str(bad), "--out", str(tmp_path / "bad.html"))
    assert r.returncode == 0, r.stderr
    assert f"{f} line 3 is cut off" in r.stderr
    page = Page((tmp_path / "bad.html").read_text())
    assert len(page.trajs) == 6  # the two readable chains
    assert "line 3 is cut off" in (tmp_path / "bad.html").read_text()


def test_corrupted_files_never_stop_the_viewer(eval_run, tmp_path):
    """Cut, flipped bytes, a deleted line, a line of the wrong JSON type, in any file of the run:
    the page is still built, every link resolves, and what was lost is said."""
    rng = random.Random(0)
    files = ["trajectories.same_scenario.jsonl", "config.yaml", "metrics.json"]
    for i in range(12):  # each kind of damage to each file
        run = tmp_path / f"r{i}"
        shutil.copytree(eval_run, run)
        f = run / files[i % len(files)]
        data = bytearray(f.read_bytes())
        kind = i // len(files) % 4
        if kind == 0:
            data = data[: rng.randrange(len(data))]
        elif kind == 1:
            for _ in range(5):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 2:
            lines = bytes(data).split(b"\n")
            lines.pop(rng.randrange(len(lines)))
            data = bytearray(b"\n".join(lines))
        else:
            data = bytearray(b'[1, "x"]\n') + data
        f.write_bytes(bytes(data))
        page, _ = build(run)
        assert_links_resolve(page)
        if f.suffix == ".jsonl" and (kind == 3 or (kind == 0 and not data.endswith(b"\n"))):
            assert page.problems_shown, f"corruption {i} of {f.name} went unreported"


FILES = {
    "eval": ("config.yaml", "metrics.json", "trajectories.same_scenario.jsonl"),
    "train": ("config.yaml", "metrics.jsonl", "summary.json", "rollouts/step_000001.jsonl"),
    "collect": ("config.yaml", "progress.jsonl", "sage_expert.jsonl"),
}
OTHER = st.sampled_from([None, "x", "", -1, 1.5, True, [], [1, "a"], {}, {"a": None}, 10**30])
RETYPES = st.lists(st.tuples(st.integers(0, 3), st.floats(0, 1), OTHER), min_size=1, max_size=3)


def _paths(value, at=()):
    yield at
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        yield from _paths(v, (*at, k))


def retyped(value, retypes):
    """``value`` with values replaced: each retype is (the deepest level, which path, new value),
    level 0 being ``value`` itself."""
    for depth, where, new in retypes:
        paths = [p for p in _paths(value) if len(p) <= depth]
        *parents, last = paths[min(int(where * len(paths)), len(paths) - 1)] or (None,)
        if last is None:
            value = copy.deepcopy(new)
            continue
        inner = value
        for k in parents:
            inner = inner[k]
        inner[last] = copy.deepcopy(new)  # a value drawn twice is two values
    return value


@fuzz(24)
@given(kind=st.sampled_from(sorted(FILES)), pick=st.floats(0, 1), line=st.floats(0, 1), retypes=RETYPES)
def test_values_of_another_type_anywhere_in_a_run_never_stop_the_viewer(
    eval_run, train_run, collect_run, tmp_path, kind, pick, line, retypes
):
    """Valid JSON and YAML holding a value of another type at any depth of any file (another
    version, a hand edit): the page is built and every link resolves. Before, 21 of 1,500 random
    such runs raised (a metrics value plotted, ``strategies: 5``, ``rollout: 3``)."""
    run = tmp_path / "run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree({"eval": eval_run, "train": train_run, "collect": collect_run}[kind], run)
    f = run / FILES[kind][min(int(pick * len(FILES[kind])), len(FILES[kind]) - 1)]
    if f.suffix == ".yaml":
        f.write_text(yaml.safe_dump(retyped(yaml.safe_load(f.read_text()), retypes)))
    elif f.suffix == ".json":
        f.write_text(json.dumps(retyped(json.loads(f.read_text()), retypes)))
    else:
        lines = f.read_text().splitlines()
        n = min(int(line * len(lines)), len(lines) - 1)
        lines[n] = json.dumps(retyped(json.loads(lines[n]), retypes))
        f.write_text("\n".join(lines) + "\n")
    assert_links_resolve(build(run)[0])


def test_numbers_of_another_type_are_named_and_the_rest_is_shown(train_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(train_run, run)
    rows = (run / "metrics.jsonl").read_text().splitlines()
    row = json.loads(rows[1])
    (run / "metrics.jsonl").write_text(
        "\n".join([rows[0], json.dumps({**row, "reward": [1]}), *rows[2:]]) + "\n"
    )
    summary = json.loads((run / "summary.json").read_text())
    summary["after"]["tgc"], summary["wall_s"], summary["before"] = "x", {}, 5
    (run / "summary.json").write_text(json.dumps(summary))
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["rollout"], config["policy"] = 3, "x"
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    page, text = build(run)
    assert_links_resolve(page)
    text = unescape(text)
    assert (
        f"{run / 'metrics.jsonl'} line 2 is not a metrics row (ValueError: 'reward' holds [1], not a" in text
    )
    assert (
        f'{run / "summary.json"}: wall_s = {{}}; before = 5; after.tgc = "x": not of the type written' in text
    )
    assert len(page.trajs) == 2 * 2 * 2  # every chain is still shown
