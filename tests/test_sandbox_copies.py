"""Agent code's own copies of the allowed modules (sandbox/copies.py): what it changes there the
worker never runs, and the copies behave as the modules do."""

from __future__ import annotations

import pytest
from test_sandbox_support import FakeWorld, run

#: Agent code may assign public attributes, and the allowed modules were the worker's too: the
#: worker's ``done`` frame is written by ``json.JSONEncoder``, the tracker calls ``itertools.islice``,
#: the bridge ``time.monotonic``. name -> cells; each patches one and then makes an API call.
PATCHES = {
    # rewrites the call records on their way to the parent (a skill credited with API work it never
    # did: (2.0, 2.0) through the real ChainRunner before agent code got its own modules)
    "json.JSONEncoder.iterencode": [
        "import json\norig = json.JSONEncoder.iterencode\ndef forge(self, o, _one_shot=False):\n"
        "    if type(o) is dict and o.get('op') == 'done':\n"
        "        o['calls'] = o['calls'] + [['forged', '<cell-0>', 1, 0, 1, []]]\n"
        "    return orig(self, o, _one_shot)\njson.JSONEncoder.iterencode = forge\nprint(apis.bank.balance())",
        "print(apis.bank.balance())",
    ],
    "json.loads": [
        "import json\nseen = []\nloads = json.loads\njson.loads = lambda s, **k: seen.append(s) or loads(s, **k)\n"
        "print(apis.bank.balance(), len(seen))"
    ],
    "itertools.islice": ["import itertools\nitertools.islice = None\nprint(apis.bank.balance())"],
    "time.monotonic": ["import time\ntime.monotonic = None\nprint(apis.bank.balance())"],
}


@pytest.mark.parametrize("name", list(PATCHES))
def test_agent_code_gets_its_own_modules(sandbox, name):
    """What agent code changes in a module it imported, the worker never runs: no forged record, and
    the tracker, the bridge and the frames work as before (before: forged records, a dead worker,
    a TypeError in every API call). Failed with ``__import__`` left as the builtin. Since session
    40 a module and its classes are read-only to agent code (sandbox/stores.py): the patch itself is
    refused, and the next cell's API call works."""
    results = run(sandbox, [*PATCHES[name], "print(apis.bank.balance())"], FakeWorld())
    assert not results[0].ok and "is read-only" in results[0].observation, results[0].observation
    for r in results[1:]:
        assert r.ok and r.observation.startswith("100"), r.observation
        assert "forged" not in [c.name for c in r.calls]


def test_the_agents_own_modules_behave_as_the_modules(sandbox):
    """Errors that a shared C module raises (``_json``, ``_zoneinfo``) are the classes agent code
    catches; C code that imports while agent code runs (``datetime.strptime``) works."""
    cell = (
        "import json, zoneinfo, numbers, decimal, time, collections.abc\nfrom datetime import datetime\n"
        "try:\n    json.loads('{bad')\nexcept json.JSONDecodeError as e:\n    print('json', e.pos)\n"
        "try:\n    zoneinfo.ZoneInfo('No/Such_Zone')\nexcept zoneinfo.ZoneInfoNotFoundError:\n    print('zone')\n"
        "print(datetime.strptime('2024-01-02', '%Y-%m-%d').timetuple().tm_yday, time.strptime('2024', '%Y').tm_year)\n"
        "print(isinstance(decimal.Decimal(1), numbers.Number), isinstance({}, collections.abc.Mapping))"
    )
    [r] = run(sandbox, [cell])
    assert r.observation == "json 1\nzone\n2 2024\nTrue True\n", r.observation


FETCHED_BY_C = {  # each in a fresh worker: what C code takes from the worker's modules (a review, s39)
    "re.error from _sre": "import re\ntry:\n    re.sub('a', r'\\9', 'a')\nexcept re.error:\n    print('ok')",
    "collections.abc after import collections": "import collections\nprint(isinstance({}, collections.abc.Mapping))",
    "Decimal with Fraction": "import decimal, fractions\nd, f = decimal.Decimal, fractions.Fraction\n"
    "print(d('0.5') == f(1, 2), d(1) < f(3, 2))",
    "struct_time from C": "import time, datetime\nprint(isinstance(datetime.datetime(2020, 1, 1).timetuple(), "
    "time.struct_time), isinstance(time.strptime('2020', '%Y'), time.struct_time))",
    "decimal flags": "import decimal, collections.abc\n"
    "print(isinstance(decimal.getcontext().flags, collections.abc.MutableMapping))",
}


@pytest.mark.parametrize("name", list(FETCHED_BY_C))
def test_what_c_code_makes_is_what_agent_code_checks_against(sandbox, name):
    """Five behaviours the agent's own module copies broke: C code builds or raises the worker's
    classes (``_sre``'s ``re.error``, ``_decimal``'s Rational check and flags mapping, ``_datetime``
    and ``_strptime``'s ``struct_time``), and a fresh ``collections`` did not load ``.abc``."""
    [r] = run(sandbox, [FETCHED_BY_C[name]])
    assert r.ok and set(r.observation.split()) <= {"ok", "True"}, r.observation
