"""Extraction and usage detection over the shared corpus (tests/skill_corpus.py): call records from
the in-process executor and static detection must agree with the hand-worked expectations.

Usage is checked under the paper's credit rule (a call counts when it returned): the corpus's
expectations are about which skill ran, not which made an API call (the ``api`` rule's own tests
are in tests/test_reward_credit.py and tests/test_skills_usage_credit.py)."""

from __future__ import annotations

import ast
import dataclasses

import pytest
from skill_corpus import CASES, FakeApis, make_library
from skill_exec import run_cells

from sage_rl.skills import (
    Library,
    SavePolicy,
    SkillCredit,
    Tier,
    extract_skills,
    make_skill,
    used_skills,
    used_skills_from_calls,
    used_skills_static,
)

PAPER = SkillCredit.PAPER


def _run(case):
    lib = make_library()
    results = run_cells(case.cells, lib, FakeApis())
    return lib, results


def _blind(results):
    """The same results as an environment without call records or definition reports sees them."""
    return [dataclasses.replace(r, calls=None, defined=None) for r in results]


def test_corpus_is_big_enough():
    assert sum(len(c.cells) for c in CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_usage_from_call_records(case):
    lib, results = _run(case)
    assert used_skills_from_calls(results, lib.names(), PAPER) == case.used


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_usage_static(case):
    lib = make_library()
    assert used_skills_static(list(case.cells), lib) == case.used


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_used_skills_dispatches_on_records(case):
    lib, results = _run(case)
    assert used_skills(list(zip(case.cells, results, strict=True)), lib, PAPER) == case.used
    assert used_skills(list(zip(case.cells, _blind(results), strict=True)), lib, PAPER) == case.used


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("policy", [SavePolicy.CALLED_OK, SavePolicy.DEFINED])
def test_extraction(case, policy):
    lib, results = _run(case)
    cells = list(zip(case.cells, results, strict=True))
    saved = extract_skills(cells, policy=policy, library=lib)
    expected = case.saved_called_ok if policy is SavePolicy.CALLED_OK else case.saved_defined
    assert {s.name for s in saved} == set(expected)
    exact = extract_skills(
        cells, policy=policy, library=lib, origins=[f"<cell-{i}>" for i in range(len(cells))]
    )
    assert exact == saved  # matching records by origin and by position agree on the corpus
    if case.static_extract:
        blind = extract_skills(
            list(zip(case.cells, _blind(results), strict=True)), policy=policy, library=lib
        )
        assert [(s.name, s.source, s.tier) for s in blind] == [(s.name, s.source, s.tier) for s in saved]


def _saved(case_id, **kw):
    case = next(c for c in CASES if c.id == case_id)
    lib, results = _run(case)
    return {s.name: s for s in extract_skills(list(zip(case.cells, results, strict=True)), library=lib, **kw)}


def test_imports_cut_to_what_the_function_reads():
    s = _saved("imports_needed")["genre_counts"]
    assert s.imports == ("import json", "from collections import Counter")
    assert s.depends_on == ()  # find_song is called by the cell, not by the function
    assert s.tier is Tier.CALLED_OK


def test_decorator_and_dependencies_kept():
    s = _saved("decorator_from_library")["fetch"]
    assert s.source.startswith("@retry\ndef fetch(title):")
    assert s.depends_on == ("find_song", "retry")
    assert s.signature == "def fetch(title)"
    assert s.docstring == "Fetch a song, retrying."


def test_update_saves_the_fixed_version():
    s = _saved("update_after_failure")["get_ids"]
    assert '["id"]' in s.source and "identifier" not in s.source


def test_last_good_definition_wins_per_policy():
    assert _saved("last_good_definition_wins")["summarize"].docstring == "v1."
    assert (
        _saved("last_good_definition_wins", policy=SavePolicy.DEFINED)["summarize"].docstring
        == "v2, never called."
    )


def test_mutual_references_and_async():
    saved = _saved("mutual_recursion")
    assert saved["is_even"].depends_on == ("is_odd",) and saved["is_odd"].depends_on == ("is_even",)
    assert _saved("async_def")["fetch_all"].signature == "async def fetch_all(titles)"


def test_task_success_policy():
    assert _saved("helper_and_main", policy=SavePolicy.TASK_SUCCESS) == {}
    saved = _saved("helper_and_main", policy=SavePolicy.TASK_SUCCESS, task_success=True)
    assert {n: s.tier for n, s in saved.items()} == {"_fmt": Tier.TASK_SUCCESS, "describe": Tier.TASK_SUCCESS}


@pytest.mark.parametrize(
    "code, by_records, by_static",
    [
        # a skill passed by name is called by sorted(): records see it, the AST rule does not
        ('print(sorted(["Red", "Blue"], key=lambda t: find_song(t)["id"]))', {"find_song"}, set()),
        ('print(sorted(["Blue"], key=find_song, reverse=False) and 1)', {"find_song"}, set()),
        # a branch that does not run: static assumes every branch runs once
        ('if False:\n    find_song("Blue")', set(), {"find_song"}),
        # a skill whose only call raised is not used (issue 30); static cannot tell that it raised
        ('find_song("no such song")', set(), {"find_song"}),
    ],
)
def test_documented_divergences(code, by_records, by_static):
    """The cases where the two detectors knowingly differ (docs/skills.md): kept out of the corpus."""
    lib = make_library()
    results = run_cells([code], lib, FakeApis())
    assert used_skills_from_calls(results, lib.names(), PAPER) == by_records
    assert used_skills_static([code], lib) == by_static


def test_extraction_origins_and_missing_dependencies():
    """Origins match records to the defining cell (by position without them); a saved skill whose helper did not execute is
    dropped unless the library provides the helper."""
    from sage_rl.types import CallRecord, ExecResult

    code = "def helper():\n    return 1\n\ndef main():\n    return helper()\n\nmain()"
    rec = (CallRecord("main", "<cell-7>", 1, 0), CallRecord("helper", "<cell-7>", 1, 0))
    ok = ExecResult("", ok=True, calls=rec, defined=("helper", "main"))
    assert [s.name for s in extract_skills([(code, ok)], origins=["<cell-7>"])] == ["helper", "main"]
    assert extract_skills([(code, ok)], origins=["<cell-0>"]) == []  # the records name <cell-7>
    assert [s.name for s in extract_skills([(code, ok)])] == ["helper", "main"]  # matched by position
    only_main = ExecResult("", ok=True, calls=(), defined=("main",))
    assert extract_skills([(code, only_main)], policy=SavePolicy.DEFINED) == []
    from sage_rl.skills import Library, make_skill

    lib = Library([make_skill("def helper():\n    return 2")])
    saved = extract_skills([(code, only_main)], policy=SavePolicy.DEFINED, library=lib)
    assert [(s.name, s.depends_on, s.tier) for s in saved] == [("main", ("helper",), Tier.DEFINED)]
    with pytest.raises(ValueError, match="1 cells but 2 origins"):
        extract_skills([(code, ok)], origins=["a", "b"])


#: cell -> the skills it saves (policy ``defined``: every def that ran), worked by hand
SELF_CONTAINED = {
    # a task's variable read by the skill: a later task could put any value there and have it paid
    "V = 1\ndef run():\n    return V": set(),
    "V = 1\ndef run():\n    def inner(V):\n        return V\n    return inner(2) + V": set(),  # scopes apart
    "V = 1\ndef run():\n    return [V for _ in range(2)]": set(),  # a comprehension's own scope
    # it would write every later task's namespace (here: replace a library skill)
    "def run():\n    global lib_skill\n    lib_skill = None\n    return 1": set(),
    # what a skill may read: builtins, apis, ApiError, its imports, the trajectory's and the library's
    # functions, its own locals in every scope
    "import json\ndef f(x):\n    try:\n        return json.dumps(x) + str(len(x))\n    except ApiError:\n"
    "        return apis.supervisor.show_profile()\ndef g(y):\n    n = 2\n    def h():\n"
    "        nonlocal n\n        n += 1\n        return n\n    return f([y, lib_skill(y), h()])": {"f", "g"},
    # a module the library's imports bind (its cells bind it in every task that loads it)
    "def k(s):\n    return re.sub('a', 'b', s)": {"k"},
}


@pytest.mark.parametrize("code", list(SELF_CONTAINED))
def test_a_skill_reads_no_variable_of_the_task(code):
    from sage_rl.types import ExecResult

    lib = Library([make_skill("def lib_skill(x):\n    return re.escape(x)", imports=("import re",))])
    defined = tuple(n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef))
    ran = ExecResult("", ok=True, calls=(), defined=defined)
    saved = extract_skills([(code, ran)], policy=SavePolicy.DEFINED, library=lib)
    assert {s.name for s in saved} == SELF_CONTAINED[code]
