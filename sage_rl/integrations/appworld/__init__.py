"""AppWorld as a first-class sage-rl environment (issues 8 and 14). See docs/appworld.md.

AppWorld runs in its own virtualenv and processes (it pins pydantic<2, freezes the clock and keeps
one world per process); this package is the sage-rl side plus two scripts run under that venv
(``worker.py``, ``synthetic.py``).

    from sage_rl.integrations.appworld import AppWorldSuite, appworld_data_status
    ok, message = appworld_data_status()      # (False, "<one line: how to install>") without data
    suite = AppWorldSuite()                   # raises SetupError(one line) without data
"""

from sage_rl.integrations.appworld.config import AppWorldEnvConfig, check_policy
from sage_rl.integrations.appworld.env import (
    AppWorldEnvironment,
    AppWorldError,
    AppWorldSuite,
    EnvironmentBroken,
    EvaluationError,
    TaskLoadError,
)
from sage_rl.integrations.appworld.paths import SetupError, appworld_data_status, default_paths

__all__ = [
    "AppWorldEnvConfig",
    "AppWorldEnvironment",
    "AppWorldError",
    "AppWorldSuite",
    "EnvironmentBroken",
    "EvaluationError",
    "SetupError",
    "TaskLoadError",
    "appworld_data_status",
    "check_policy",
    "default_paths",
]
