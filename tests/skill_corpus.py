"""The shared corpus of realistic agent cells for skill extraction and usage detection (issue 4).

Each ``Case`` is one task: the cells it executed in order, against the library ``LIBRARY`` and the
fake apps in ``FakeApis``. The expectations were worked out by reading the code by hand:

- ``used``: library skills the task used (call records and static detection must both say this);
- ``saved_called_ok`` / ``saved_defined``: names ``extract_skills`` saves under those policies,
  with call records from ``tests/skill_exec.py``;
- ``static_extract``: False where static extraction (no call records, no ``defined``) is expected
  to differ from the record-based one, because a cell failed and static extraction trusts nothing
  of a failed cell.

The static rules (docs/skills.md) are matched by construction: every branch in the corpus that
static detection assumes taken is really taken, and no skill is passed by name without a call.
"""

from __future__ import annotations

from dataclasses import dataclass

from sage_rl.skills.library import Library
from sage_rl.skills.record import Provenance, Tier, make_skill
from sage_rl.skills.source import dependencies, function_node

LIBRARY_SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "find_song": (
        '''def find_song(title: str) -> dict:
    """Return the first song whose title matches ``title``."""
    results = apis.music.search_songs(query=title)
    return results[0]''',
        (),
    ),
    "song_ids": (
        '''def song_ids(titles: list[str]) -> list[int]:
    """Ids of the songs with these titles, in order."""
    return [find_song(t)["id"] for t in titles]''',
        (),
    ),
    "notify": (
        '''def notify(contact: str, text: str) -> None:
    """Send a text message to a contact, looked up by name."""
    person = apis.contacts.search(name=contact)[0]
    apis.phone.send_message(to=person["phone"], text=text)''',
        (),
    ),
    "total_duration": (
        '''def total_duration(songs: list[dict]) -> int:
    """Total length of the songs in seconds."""
    return sum(s["duration"] for s in songs)''',
        (),
    ),
    "retry": (
        '''def retry(fn):
    """Decorator: call ``fn`` up to 3 times until it does not raise."""
    def wrapper(*args, **kwargs):
        for attempt in range(3):
            try:
                return fn(*args, **kwargs)
            except Exception:
                if attempt == 2:
                    raise
    return wrapper''',
        (),
    ),
    "dump_songs": (
        '''def dump_songs(songs: list[dict]) -> str:
    """The songs as sorted JSON."""
    return json.dumps(songs, sort_keys=True)''',
        ("import json",),
    ),
}


def make_library() -> Library:
    lib = Library()
    for i, (src, imports) in enumerate(LIBRARY_SOURCES.values()):
        deps = dependencies(function_node(src), LIBRARY_SOURCES)
        prov = Provenance(task_id=f"lib_{i}", scenario_id="lib", created_at=float(i))
        lib.add(make_skill(src, imports=imports, depends_on=deps, provenance=prov, tier=Tier.CALLED_OK))
    return lib


SONGS = {
    "Blue": {"id": 1, "title": "Blue", "duration": 200, "genre": "jazz"},
    "Red": {"id": 2, "title": "Red", "duration": 150, "genre": "rock"},
}


class _Music:
    def search_songs(self, query: str) -> list[dict]:
        return [dict(s) for t, s in SONGS.items() if query.lower() in t.lower()]


class _Contacts:
    def search(self, name: str) -> list[dict]:
        return [{"name": name, "phone": "555-0101"}] if name == "Alice" else []


class _Phone:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def send_message(self, to: str, text: str) -> None:
        self.sent.append((to, text))


class FakeApis:
    """``apis.<app>.<api>(...)`` as agent code sees it; fresh per task."""

    def __init__(self) -> None:
        self.music, self.contacts, self.phone = _Music(), _Contacts(), _Phone()


@dataclass(frozen=True)
class Case:
    id: str
    cells: tuple[str, ...]
    used: frozenset[str] = frozenset()
    saved_called_ok: tuple[str, ...] = ()
    saved_defined: tuple[str, ...] = ()
    static_extract: bool = True


def _c(id: str, *cells: str, used=(), ok=(), defined=None, static_extract=True) -> Case:
    return Case(
        id, cells, frozenset(used), tuple(ok), tuple(ok if defined is None else defined), static_extract
    )


CASES: tuple[Case, ...] = (
    _c("direct_use", 'song = find_song("Blue")\nprint(song["id"])', used={"find_song"}),
    _c(
        "transitive_through_library",
        'ids = song_ids(["Blue", "Red"])\nprint(ids)',
        used={"song_ids", "find_song"},
    ),
    _c("mention_in_string", "print(\"I could call find_song('Blue') here\")"),
    _c("mention_in_comment", '# find_song("Blue") would work too\nx = 1\nprint(x)'),
    _c(
        "attribute_call_same_name",
        'class Helper:\n    def find_song(self, t):\n        return t\n\nh = Helper()\nprint(h.find_song("Blue"))',
    ),
    _c(
        "redefine_before_call",
        'def find_song(title):\n    """Local version."""\n    return {"id": 0, "title": title}',
        'print(find_song("Blue"))',
        ok={"find_song"},
    ),
    _c(
        "redefine_after_call",
        'print(find_song("Blue"))',
        'def find_song(title):\n    """Never called."""\n    return {"id": 0}',
        used={"find_song"},
        defined={"find_song"},
    ),
    _c(
        "redefine_after_call_same_cell",
        'first = find_song("Red")\n\ndef find_song(title):\n    return {"id": -1}',
        used={"find_song"},
        defined={"find_song"},
    ),
    _c(
        "redefine_dependency_of_library_skill",
        'def find_song(title):\n    """Offline stand-in."""\n    return {"id": 99, "title": title}\n\nprint(song_ids(["x"]))',
        used={"song_ids"},
        ok={"find_song"},
    ),
    _c(
        "nested_def_never_called",
        'def plan():\n    """Plan the playlist."""\n    def helper():\n        return find_song("Blue")\n    return 1\n\nplan()',
        ok={"plan"},
    ),
    _c(
        "nested_def_called",
        'def plan_ids():\n    """Ids for the plan."""\n    def helper(t):\n        return find_song(t)["id"]\n'
        '    return [helper(t) for t in ["Blue"]]\n\nprint(plan_ids())',
        used={"find_song"},
        ok={"plan_ids"},
    ),
    _c(
        "defined_never_called",
        'def later(title):\n    """Later."""\n    return find_song(title)',
        defined={"later"},
    ),
    _c(
        "decorator_from_library",
        '@retry\ndef fetch(title):\n    """Fetch a song, retrying."""\n    return find_song(title)\n\nsong = fetch("Blue")',
        used={"retry", "find_song"},
        ok={"fetch"},
    ),
    _c(
        "default_argument_calls_skill",
        'def pick(title=find_song("Blue")["title"]):\n    """Pick a title."""\n    return title\n\nprint(pick())',
        used={"find_song"},
        ok=set(),  # a default that calls anything would run as the library loads: no skill (record.py)
    ),
    _c(
        "async_def",
        'import asyncio\n\nasync def fetch_all(titles):\n    """Fetch songs."""\n'
        "    await asyncio.sleep(0)\n    return [find_song(t) for t in titles]\n\n"
        'songs = asyncio.run(fetch_all(["Blue", "Red"]))\nprint(len(songs))',
        used={"find_song"},
        ok={"fetch_all"},
    ),
    _c(
        "mutual_recursion",
        'def is_even(n: int) -> bool:\n    """True when n is even."""\n    return True if n == 0 else is_odd(n - 1)\n\n'
        'def is_odd(n: int) -> bool:\n    """True when n is odd."""\n    return False if n == 0 else is_even(n - 1)\n\n'
        "print(is_even(4))",
        ok={"is_even", "is_odd"},
    ),
    _c(
        "syntax_error_then_use",
        "def broken(:\n    pass",
        'print(find_song("Red")["id"])',
        used={"find_song"},
    ),
    _c(
        "syntax_error_hides_call",
        "x = find_song(\"Blue\")\nif x['id'] == 1\n    print(x)",
    ),
    _c(
        "fails_part_way",
        'def first_id(titles):\n    """Id of the first title\'s song."""\n    return find_song(titles[0])["id"]\n\n'
        'print(first_id(["Blue"]))\nraise RuntimeError("stop here")\n\ndef never_defined():\n    return 1',
        used={"find_song"},
        ok={"first_id"},
        static_extract=False,
    ),
    _c(
        "update_after_failure",
        'def get_ids(titles):\n    """Song ids."""\n    return [find_song(t)["identifier"] for t in titles]\n\nget_ids(["Blue"])',
        'def get_ids(titles):\n    """Song ids."""\n    return [find_song(t)["id"] for t in titles]\n\nprint(get_ids(["Blue"]))',
        used={"find_song"},
        ok={"get_ids"},
        static_extract=False,
    ),
    _c(
        "last_good_definition_wins",
        'def summarize(titles):\n    """v1."""\n    return ", ".join(titles)\n\nprint(summarize(["a"]))',
        'def summarize(titles):\n    """v2, never called."""\n    return "; ".join(titles)',
        ok={"summarize"},
    ),
    _c(
        "imports_needed",
        "import json\nfrom collections import Counter, OrderedDict\n\n"
        'def genre_counts(songs):\n    """Songs per genre, as JSON."""\n    return json.dumps(Counter(s["genre"] for s in songs))\n\n'
        'print(genre_counts([find_song("Blue")]))',
        used={"find_song"},
        ok={"genre_counts"},
    ),
    _c(
        "transitive_through_task_function",
        'def playlist_seconds(titles):\n    """Total seconds."""\n    return total_duration([find_song(t) for t in titles])',
        'print(playlist_seconds(["Blue", "Red"]))',
        used={"total_duration", "find_song"},
        ok={"playlist_seconds"},
    ),
    _c("shadow_by_lambda", 'find_song = lambda t: {"id": 1}\nprint(find_song("x"))'),
    _c("shadow_by_import", "from statistics import mean as total_duration\nprint(total_duration([1, 2, 3]))"),
    _c(
        "except_branch_runs",
        # find_song returns (a use); the lookup in its result raises, and the except branch runs
        'try:\n    find_song("Blue")["no such field"]\nexcept KeyError:\n    notify("Alice", "song not found")',
        used={"find_song", "notify"},
    ),
    _c(
        "comprehension_call",
        'ids = [find_song(t)["id"] for t in ["Blue", "Red"]]\nprint(ids)',
        used={"find_song"},
    ),
    _c("while_loop_call", 'n = 0\nwhile n < 1:\n    notify("Alice", "hi")\n    n += 1', used={"notify"}),
    _c("name_as_variable", "find_song_result = 3\nprint(find_song_result)"),
    _c("keyword_named_like_skill", "print(dict(find_song=1))"),
    _c(
        "class_init_calls_skill",
        "class Playlist:\n    def __init__(self, titles):\n        self.songs = [find_song(t) for t in titles]\n\n"
        'p = Playlist(["Blue"])\nprint(len(p.songs))',
        used={"find_song"},
    ),
    _c(
        "local_shadow_inside_function",
        'def report(titles):\n    """Report ids."""\n    find_song = lambda t: {"id": 0}\n'
        '    return [find_song(t)["id"] for t in titles]\n\nprint(report(["Blue"]))',
        ok={"report"},
    ),
    _c("undefined_function", 'songs = fetch_songs("Blue")'),
    _c(
        "helper_and_main",
        "def _fmt(song):\n    return f\"{song['title']} ({song['duration']}s)\"\n\n"
        'def describe(titles):\n    """Describe songs."""\n    return [_fmt(find_song(t)) for t in titles]\n\n'
        'print(describe(["Blue", "Red"]))',
        used={"find_song"},
        ok={"_fmt", "describe"},
    ),
    _c(
        "library_with_import_used",
        'print(dump_songs([find_song("Blue")]))\nnotify("Alice", "done")\napis.phone.send_message(to="1", text="x")',
        used={"dump_songs", "find_song", "notify"},
    ),
    _c(
        "deleted_then_called",
        'del song_ids\ntry:\n    song_ids(["Blue"])\nexcept NameError:\n    print("gone")',
        static_extract=True,
    ),
)
