"""The SQLite store (versioning, counters, readers during writes, kill -9 safety) and the JSON Lines /
folder export and import with per-line error reports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from sage_rl.skills import AddStatus, Library, Provenance, Tier, make_skill
from sage_rl.skills.io import read_folder, read_jsonl, skill_file_text, write_folder, write_jsonl
from sage_rl.skills.store import SkillStore, StoreError


def _s(name: str, body: str = "return 1", **kw):
    return make_skill(f'def {name}(x):\n    """Doc of {name}."""\n    {body}', **kw)


def test_versions_dedup_and_counters(tmp_path):
    with SkillStore(tmp_path / "s.db") as st:
        assert st.put(_s("a", provenance=Provenance("t1", "sc", created_at=5.0))).status is AddStatus.ADDED
        assert st.put(_s("a", tier=Tier.VERIFIED)).status is AddStatus.UNCHANGED
        r = st.put(_s("a", "return 2"))
        assert (r.status, r.version) == (AddStatus.REPLACED, 2)
        dup = st.put(make_skill('def b(x):\n    """Doc of a."""\n    return 2'))  # a's code, another name
        assert (dup.status, dup.name) == (AddStatus.DUPLICATE, "a")
        st.add_counts("a", uses=3, successes=2)
        st.add_counts("a", uses=1, successes=0)
        assert [s.version for s in st.history("a")] == [1, 2]
        v1 = st.get("a", version=1)
        assert v1.tier is Tier.VERIFIED and v1.provenance.created_at == 5.0 and "return 1" in v1.source
        cur = st.get("a")
        assert (cur.version, cur.uses, cur.successes) == (2, 4, 2)
        assert st.names() == ["a"] and st.get("b") is None
        stats = st.stats()
        assert (stats.skills, stats.versions, stats.uses, stats.successes) == (1, 2, 4, 2)
        with pytest.raises(KeyError, match="no skill called 'zz'"):
            st.add_counts("zz", 1, 1)


def test_library_round_trip_through_store(tmp_path):
    lib = Library(
        [_s("a", tier=Tier.CALLED_OK), _s("b", "return a(x)", depends_on=("a",), tier=Tier.DEFINED)]
    )
    with SkillStore(tmp_path / "s.db") as st:
        st.save_library(lib)
        back = st.load_library()
        assert [(s.name, s.depends_on, s.tier) for s in back] == [(s.name, s.depends_on, s.tier) for s in lib]
        assert st.load_library(min_tier=Tier.CALLED_OK).names() == ("a",)


def test_not_a_store(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a usable skill store"):
        SkillStore(bad)
    with pytest.raises(StoreError, match="not found"):
        SkillStore(tmp_path / "missing.db", readonly=True)


_WRITER = textwrap.dedent(
    """
    import sys
    from sage_rl.skills import make_skill
    from sage_rl.skills.store import SkillStore
    st = SkillStore(sys.argv[1])
    i = 0
    while True:
        skills = [make_skill(f"def s{i}_{j}(x):\\n    return x + {i * 10 + j}") for j in range(3)]
        st.put_many(skills)  # one transaction per batch of 3
        print(i, flush=True)
        i += 1
    """
)


def test_kill_9_during_writes_loses_nothing_committed(tmp_path):
    db = tmp_path / "s.db"
    SkillStore(db).close()
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(db)], stdout=subprocess.PIPE, text=True)
    committed, seen_by_reader = [], []
    reader = SkillStore(db, readonly=True)
    try:
        for line in proc.stdout:
            committed.append(int(line))
            if len(committed) % 10 == 0:
                seen_by_reader.append(len(reader))  # a reader works while the writer writes
            if len(committed) >= 60:
                break
        assert proc.poll() is None, "the writer must still be writing when it is killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        committed += [int(x) for x in proc.stdout.read().split()]  # printed before the kill
    finally:
        reader.close()
        if proc.poll() is None:
            proc.kill()
    assert seen_by_reader == sorted(seen_by_reader) and seen_by_reader[0] >= 30
    with SkillStore(db) as st:
        assert st.integrity_ok()
        names = set(st.names())
        assert len(names) % 3 == 0  # batches are atomic: all three or none
        for i in committed:
            assert {f"s{i}_0", f"s{i}_1", f"s{i}_2"} <= names


def test_jsonl_round_trip_and_bad_lines(tmp_path):
    skills = [
        _s("a", tier=Tier.CALLED_OK, uses=2, imports=("import os",)),
        _s("b", provenance=Provenance("t", "sc", "p", 3, 1.5)),
    ]
    path = tmp_path / "lib.jsonl"
    assert write_jsonl(skills, path) == 2
    assert read_jsonl(path).skills == tuple(skills)
    good = path.read_text().splitlines()
    lines = [
        good[0],
        "{not json",
        json.dumps({"name": "c", "source": "def c(:\n  pass"}),
        "",
        json.dumps({"name": "d", "source": "def d():\n    return 4", "tier": "legendary"}),
        good[1],
        "[1, 2]",
    ]
    path.write_text("\n".join(lines) + "\n")
    report = read_jsonl(path)
    assert [s.name for s in report.skills] == ["a", "b"]
    assert [(e.line, e.message.split(":")[0]) for e in report.errors] == [
        (2, "not valid JSON"),
        (3, "skill c"),
        (
            5,
            "unknown tier 'legendary'; expected one of ['parsed', 'defined', 'called_ok', 'task_success', 'verified']",
        ),
        (7, "a skill record must be a JSON object, not list"),
    ]


def test_folder_round_trip_edit_and_bad_files(tmp_path):
    skills = [
        make_skill(
            '@staticmethod\ndef a(x):\n    """Doc."""\n    return json.dumps(x)',
            imports=("import json",),
            depends_on=("b",),
            provenance=Provenance("t_1", "t", "smollm", 4, 12.5),
            tier=Tier.TASK_SUCCESS,
            version=3,
            uses=5,
            successes=4,
        ),
        _s("b"),
    ]
    folder = tmp_path / "lib"
    assert write_folder(skills, folder) == 2
    text = (folder / "a.py").read_text()
    assert text.startswith("# sage-rl skill\n# name: a\n# version: 3\n# tier: task_success\n")
    assert read_folder(folder).skills == tuple(skills)
    # a human edits the code: derived fields follow the new code, provenance stays
    (folder / "b.py").write_text(skill_file_text(skills[1]).replace("return 1", "return 2  # edited"))
    (folder / "c.py").write_text("# sage-rl skill\n# name: c\n# uses: many\n\ndef c():\n    return 3\n")
    (folder / "d.py").write_text("# sage-rl skill\n# name: d\n\nx = 1\n\ndef d():\n    return x\n")
    (folder / "e.py").write_text("def e(:\n")
    report = read_folder(folder)
    b = next(s for s in report.skills if s.name == "b")
    assert "return 2" in b.source and b.content_hash != skills[1].content_hash
    assert [(os.path.basename(e.path), e.line) for e in report.errors] == [
        ("c.py", 3),
        ("d.py", 4),
        ("e.py", 1),
    ]
    assert "invalid literal for int()" in report.errors[0].message
    assert "only imports and the function 'd'" in report.errors[1].message
