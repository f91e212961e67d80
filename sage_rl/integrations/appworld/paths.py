"""Where AppWorld lives on disk, and whether it is ready to use.

AppWorld runs in its own virtualenv (it pins pydantic<2) and reads its task data from
``<root>/data``. Both locations default to folders beside the repository (``.venv-appworld`` and
``.cache/appworld``, both gitignored) and can be moved with environment variables:

- ``SAGE_RL_APPWORLD_VENV``: the virtualenv;
- ``SAGE_RL_APPWORLD_ROOT``: AppWorld's root (its ``APPWORLD_ROOT``; the data is ``<root>/data``).

This module imports nothing from AppWorld: it runs in sage-rl's own environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

APPWORLD_VERSION = "0.1.3.post1"
#: sha256 of AppWorld's ``data-0.1.0.bundle`` (PLATFORM.md).
DATA_BUNDLE_SHA256 = "fd9f9608c2ec71ed0ac25c3633a738b9129a318a129e31230425b9188e508250"
DATA_BUNDLE_NAME = "data-0.1.0.bundle"
SPLITS = ("train", "dev", "test_normal", "test_challenge")
INSTALL_HINT = (
    "run `sage-rl appworld setup --bundle /path/to/data-0.1.0.bundle` "
    "(or `sage-rl appworld setup --download` where the network allows)"
)


class SetupError(RuntimeError):
    """AppWorld (its virtualenv, its decrypted code or its data) is not ready. One-line message."""


@dataclass(frozen=True)
class AppWorldPaths:
    """The AppWorld virtualenv and root folder."""

    venv: Path
    root: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def cache(self) -> Path:
        """AppWorld's ``APPWORLD_CACHE`` (where ``appworld install`` puts its own tests)."""
        return self.root / "cache"

    def site_package(self) -> Path | None:
        """The installed ``appworld`` package folder inside the venv, if any."""
        found = sorted(self.venv.glob("lib/python3*/site-packages/appworld"))
        return found[0] if found else None

    def env(self) -> dict[str, str]:
        """Environment for a process of the AppWorld venv (its root, its cache, no .pyc noise)."""
        return {
            **os.environ,
            "APPWORLD_ROOT": str(self.root),
            "APPWORLD_CACHE": str(self.cache),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        }


def project_dir() -> Path:
    """The repository root for a source checkout (editable install), else the current directory."""
    here = Path(__file__).resolve().parents[3]
    return here if (here / "pyproject.toml").is_file() else Path.cwd()


def default_paths() -> AppWorldPaths:
    base = project_dir()
    venv = os.environ.get("SAGE_RL_APPWORLD_VENV") or base / ".venv-appworld"
    root = os.environ.get("SAGE_RL_APPWORLD_ROOT") or base / ".cache" / "appworld"
    return AppWorldPaths(venv=Path(venv).resolve(), root=Path(root).resolve())


def venv_status(paths: AppWorldPaths) -> tuple[bool, str]:
    """(ok, one line): is the venv there with AppWorld installed and its app code decrypted?"""
    if not paths.python.exists():
        return False, f"AppWorld virtualenv not found at {paths.venv}: {INSTALL_HINT}"
    pkg = paths.site_package()
    if pkg is None:
        return False, f"appworld is not installed in {paths.venv}: {INSTALL_HINT}"
    # `appworld install` decrypts the apps; before it, apps/supervisor/apis.py does not exist.
    if not (pkg / "apps" / "supervisor" / "apis.py").exists():
        return False, f"AppWorld's app code is not unpacked in {pkg} (run `appworld install`): {INSTALL_HINT}"
    return True, f"AppWorld {APPWORLD_VERSION} installed in {paths.venv}"


def data_status(paths: AppWorldPaths) -> tuple[bool, str]:
    """(ok, one line): is AppWorld's task data unpacked under ``paths.root``?"""
    missing = [
        str(p)
        for p in (paths.data / "tasks", paths.data / "datasets", paths.data / "api_docs")
        if not p.is_dir()
    ]
    if missing:
        return False, f"AppWorld data not found ({missing[0]} is missing): {INSTALL_HINT}"
    splits = [s for s in SPLITS if (paths.data / "datasets" / f"{s}.txt").is_file()]
    if not splits:
        return False, f"AppWorld data at {paths.data} has no split files (datasets/*.txt): {INSTALL_HINT}"
    return True, f"AppWorld data at {paths.data} (splits: {', '.join(splits)})"


def appworld_data_status(paths: AppWorldPaths | None = None) -> tuple[bool, str]:
    """(ok, message): can ``sage-rl eval env=appworld`` run? The message is one line; when not ok
    it says what is missing and how to install it."""
    paths = paths or default_paths()
    ok, msg = venv_status(paths)
    if not ok:
        return ok, msg
    return data_status(paths)


def require_ready(paths: AppWorldPaths | None = None) -> AppWorldPaths:
    """``paths`` (or the defaults) when AppWorld is usable, else raise ``SetupError`` (one line)."""
    paths = paths or default_paths()
    ok, msg = appworld_data_status(paths)
    if not ok:
        raise SetupError(msg)
    return paths
