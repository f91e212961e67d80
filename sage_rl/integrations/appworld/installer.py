"""``sage-rl appworld setup``: AppWorld's own virtualenv, its decrypted code, and its data.

Steps, each skipped when already done (so a second run takes about a second):
1. create the virtualenv (``python -m venv``);
2. ``pip install appworld==0.1.3.post1`` into it;
3. ``appworld install``: decrypt the app code inside the venv (never copy it into the repository:
   AppWorld's licence allows redistribution only in encrypted form);
4. the data, one of:
   - a local ``data-0.1.0.bundle``: its sha256 is checked, then AppWorld's own ``unpack_bundle``
     unpacks it (into a scratch folder first, moved into place only when it holds ``data/``);
   - ``appworld download data``, where the network allows.

Every step reports through a ``report(line)`` callback; failures raise ``SetupError`` naming the
step and quoting the failing command's output.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from sage_rl.integrations.appworld.paths import (
    APPWORLD_VERSION,
    DATA_BUNDLE_SHA256,
    AppWorldPaths,
    SetupError,
    data_status,
    venv_status,
)

Report = Callable[[str], None]

_UNPACK = (
    "import sys\n"
    "from appworld.common.constants import PASSWORD, SALT\n"
    "from appworld.common.utils import unpack_bundle\n"
    "unpack_bundle(bundle_file_path=sys.argv[1], base_directory=sys.argv[2], password=PASSWORD, salt=SALT)\n"
)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _run(step: str, cmd: list[str], paths: AppWorldPaths, timeout_s: float = 1800) -> str:
    try:
        proc = subprocess.run(
            cmd, env=paths.env(), cwd=paths.root, capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SetupError(f"{step} failed: {' '.join(cmd)}: {e}") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise SetupError(f"{step} failed (exit {proc.returncode}): {' '.join(cmd)}: {' | '.join(tail)}")
    return proc.stdout


def ensure_venv(paths: AppWorldPaths, report: Report, python: str = sys.executable) -> None:
    """Steps 1-3: the venv, the pinned appworld package, and its decrypted app code."""
    paths.root.mkdir(parents=True, exist_ok=True)
    if paths.python.exists():
        report(f"[1/4] virtualenv: {paths.venv} exists")
    else:
        report(f"[1/4] virtualenv: creating {paths.venv}")
        _run("creating the AppWorld virtualenv", [python, "-m", "venv", str(paths.venv)], paths)
    if any(paths.venv.glob(f"lib/python3*/site-packages/appworld-{APPWORLD_VERSION}.dist-info")):
        report(f"[2/4] appworld=={APPWORLD_VERSION}: installed")
    else:
        report(f"[2/4] appworld=={APPWORLD_VERSION}: installing with pip (about a minute)")
        pip = [str(paths.python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        _run("pip install appworld", [*pip, f"appworld=={APPWORLD_VERSION}"], paths)
    ok, msg = venv_status(paths)
    if ok:
        report("[3/4] appworld install: app code already unpacked")
    else:
        report("[3/4] appworld install: unpacking the encrypted app code (inside the venv only)")
        _run("appworld install", [str(paths.venv / "bin" / "appworld"), "install"], paths)
        ok, msg = venv_status(paths)
        if not ok:
            raise SetupError(f"appworld install ran but the app code is still missing: {msg}")


def install_bundle(
    paths: AppWorldPaths, bundle: Path, report: Report, expected_sha256: str = DATA_BUNDLE_SHA256
) -> None:
    """Step 4 from a local bundle: verify its sha256, unpack it with AppWorld's own function."""
    bundle = bundle.expanduser().resolve()  # the unpacking runs in paths.root, not in our cwd
    if not bundle.is_file():
        raise SetupError(f"data bundle not found: {bundle}")
    digest = sha256_of(bundle)
    if digest != expected_sha256.lower():
        raise SetupError(
            f"data bundle {bundle} has sha256 {digest}, expected {expected_sha256}; refusing to unpack it"
        )
    report(f"[4/4] data: {bundle.name} sha256 verified ({digest[:12]}...); unpacking")
    with tempfile.TemporaryDirectory(dir=paths.root, prefix=".unpack-") as scratch:
        unpacked = Path(scratch).resolve() / "data"
        _run(
            "unpacking the data bundle",
            [str(paths.python), "-c", _UNPACK, str(bundle), str(unpacked.parent)],
            paths,
        )
        if not unpacked.is_dir():
            raise SetupError(f"data bundle {bundle} does not contain a data/ folder")
        shutil.rmtree(paths.data, ignore_errors=True)
        unpacked.rename(paths.data)


def download_data(paths: AppWorldPaths, report: Report) -> None:
    """Step 4 from the network: ``appworld download data`` (it replaces an existing data folder)."""
    report("[4/4] data: appworld download data (about 15 s where the network allows)")
    out = _run(
        "appworld download data",
        [str(paths.venv / "bin" / "appworld"), "download", "data", "--root", str(paths.root)],
        paths,
    )
    if "Failed to download" in out:
        raise SetupError(f"appworld download data failed: {out.strip().splitlines()[-1]}")


def setup(
    paths: AppWorldPaths,
    report: Report,
    bundle: Path | None = None,
    download: bool = False,
    force: bool = False,
    expected_sha256: str = DATA_BUNDLE_SHA256,
) -> tuple[bool, str]:
    """Run the steps; return the data status ``(ok, line)``. Existing data is replaced only with
    ``force``. Without ``bundle`` or ``download``, the data step only reports what is there."""
    if bundle is not None and download:
        raise SetupError("give either a data bundle or --download, not both")
    ensure_venv(paths, report)
    have_data, msg = data_status(paths)
    if have_data and not force and (bundle is not None or download):
        report(f"[4/4] data: already present, kept (use --force to replace): {msg}")
    elif bundle is not None:
        install_bundle(paths, bundle, report, expected_sha256)
    elif download:
        download_data(paths, report)
    else:
        report(f"[4/4] data: {'present' if have_data else 'not installed'} (no bundle or download asked for)")
    return data_status(paths)
