"""The settings the property-based fuzzes of the suite run under (``tests/test_fuzz_*.py``)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

#: ``SAGE_FUZZ_EXAMPLES=N``: a random hunt of N examples a test, its failures kept in
#: ``.hypothesis/`` and replayed first next time. Unset: the suite's few derandomized examples,
#: the same on every machine and every run.
HUNT = int(os.environ.get("SAGE_FUZZ_EXAMPLES", "0"))


def fuzz(examples: int) -> settings:
    """``examples`` derandomized examples a test in the suite, or the hunt's ``HUNT`` random ones.
    Function-scoped fixtures are shared by a test's examples: the tests reset what they write."""
    return settings(
        max_examples=HUNT or examples,
        derandomize=not HUNT,
        database=settings.default.database if HUNT else None,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )
