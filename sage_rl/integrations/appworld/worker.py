"""AppWorld's processes: one zygote per suite, one worker per episode, one evaluator per evaluation.

Runs under the AppWorld virtualenv's Python (``.venv-appworld/bin/python worker.py SOCKET``), never
in sage-rl's own environment: AppWorld pins pydantic<2, freezes the process clock and patches
builtins while executing (PLATFORM.md). So this file and its helpers (``episode.py``: what an
episode worker runs; ``scoring.py``: what an evaluator runs; ``layers.py``; ``snapshots.py``) import only the standard library, ``appworld`` and
the sandbox's layer modules.

The *zygote* imports AppWorld, builds its API routes, imports the standard library and makes (and
closes) one world, once (seconds); it enters a new network namespace, and forks one child per
connection to ``SOCKET`` (milliseconds). A child's first
request decides what it is:

- an **episode worker** (``reset``): it loads one task with AppWorld, without its ground truth,
  in a private AppWorld root inside its scratch folder; then it applies the sandbox's layers
  (``layers.py``): from then on it reads only system, Python and venv folders, writes only its
  scratch folder, has no network, runs as ``nobody`` (when started as root) with rlimits, and an
  environment holding no variable of the parent's. Agent code runs here. After each request that
  changed its world it forks a snapshot of itself (``snapshots.py``), which takes over if the
  worker is killed or dies.
- an **evaluator** (``prepare``, then ``evaluate``; ``scoring.py``): prepared while the episode
  runs (the task, its ground truth and start state loaded, the clock frozen at the task's date),
  it copies the files AppWorld saved for an episode (its state after the last cell, its logs)
  into a destination AppWorld root, and scores them there with AppWorld's own
  ``evaluate_task``, as ``appworld evaluate`` does. It runs no agent code, and is under Landlock
  too: it reads the task data and writes only that destination folder.

Protocol on a child's connection: the child first sends ``{"ok": true, "ready": true, "pid"}``;
then each request is one JSON object on one line, and so is each answer, which echoes the
request's ``id``. A snapshot that took over sends ``{"ok": true, "restored": true, "pid"}`` unasked. Everything that writes to stdout
(AppWorld's warnings, prints outside a captured cell) goes to stderr instead.

Requests (``op`` and its fields) -> answer fields (besides ``ok``):
- ``reset`` task_id, experiment, scratch, data, cell_timeout_s, max_interactions,
  max_api_calls_per_interaction, output_chars, sandbox, limits -> instruction, isolation, output_dir
- ``execute`` code -> output, failed, timed_out, completed, defined
- ``lost`` code, output: record a cell whose worker was killed, as AppWorld records a failed
  cell (it counts as an interaction) -> completed
- ``prepare`` task_id, experiment, dest_root, data, sandbox, limits, readable -> (nothing)
- ``evaluate`` source, save_report (and ``prepare``'s fields when it was not sent) -> passes,
  failures, num_tests, success, difficulty, reloaded (the apps whose saved changes it loaded),
  kept (how many apps' databases it kept from ``prepare``'s no-op)
- ``ping`` -> (nothing: its answer tells the parent every earlier request was answered)
An episode worker runs until the parent kills its process group (it has nothing unsaved: AppWorld
saves its state after every cell); an evaluator exits after its one answer.
A failing request answers ``{"ok": false, "error": "<Type>: <message>"}``.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import importlib.util
import json
import os
import pkgutil
import select
import selectors
import shutil
import signal
import socket
import sys
import traceback

# Run as a script from inside the sage_rl package: drop the script's folder from the import path
# so sibling modules can never shadow a library AppWorld imports.
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0]) == _HERE:
    sys.path.pop(0)


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(
        f"sage_rl_appworld_{name}", os.path.join(_HERE, f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


layers = _sibling("layers")
scoring = _sibling("scoring")
snapshots = _sibling("snapshots")

_episode = _sibling("episode")
Episode, PENDING, Evaluator = _episode.Episode, _episode.PENDING, scoring.Evaluator

#: Requests after which the worker takes a new snapshot.
CHANGES_WORLD = ("reset", "execute", "lost")
_PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)


def handle(episode: Episode, evaluator: Evaluator, request: dict) -> dict:
    op = request.get("op")
    try:
        if op == "reset":
            out = episode.reset(request)
        elif op == "execute":
            out = episode.execute(request["code"])
        elif op == "lost":
            out = episode.lost(request["code"], request["output"])
        elif op == "prepare":
            out = evaluator.prepare(request)
        elif op == "evaluate":
            out = evaluator.evaluate(request)
        elif op == "ping":
            out = {}
        else:
            raise ValueError(f"unknown op {op!r}")
    except Exception as e:  # the worker must answer every request, whatever AppWorld raised
        traceback.print_exc(file=sys.stderr)
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return {"ok": True, **out}


def serve(conn: socket.socket, network: str, paths: tuple[list[str], list[str]]) -> None:
    """Answer requests on ``conn`` until an evaluation is answered or the input ends."""
    rfile, wfile = conn.makefile("r"), conn.makefile("w")

    def send(message: dict, lead: str = "") -> None:
        wfile.write(lead + json.dumps(message) + "\n")
        wfile.flush()

    episode, evaluator = Episode(network, paths), Evaluator(network, paths)
    send({"ok": True, "ready": True, "pid": os.getpid()})
    for line in rfile:
        if not line.strip():
            continue
        request = json.loads(line)
        op = request.get("op")
        answer = {**handle(episode, evaluator, request), "id": request.get("id")}
        send(answer)
        # Let the parent read it now. Its wake-up is a "sync" one (a socket's): the kernel puts it
        # on this core, expecting this process to sleep next; it forks its snapshot instead, and
        # the parent waited for the scheduler's slice (2-3 ms of an idle cell's ~11).
        os.sched_yield()
        if op == "evaluate":
            return
        if answer["ok"] and op in CHANGES_WORLD and episode.snapshots.take(lambda: _readable(conn)):
            episode.revive()  # this is the snapshot: the worker died; carry on in its place
            # A leading newline ends whatever the dead worker may have half written.
            send({"ok": True, "restored": True, "pid": os.getpid()}, lead="\n")


def _readable(conn: socket.socket) -> bool:
    """Whether the next request has arrived on ``conn`` (the parent sends one at a time, after the
    previous answer: none waits in the reader's buffer)."""
    return bool(select.select([conn], [], [], 0)[0])


#: Standard modules never preloaded: side effects at import, GUI, tests, other platforms, removed.
_STDLIB_SKIP = frozenset((
    "antigravity", "this", "__hello__", "__phello__", "idlelib", "tkinter", "_tkinter", "turtle",
    "turtledemo", "test", "lib2to3", "ensurepip", "venv", "pydoc_data", "distutils", "readline",
    "curses", "_curses", "_curses_panel", "dbm", "msilib", "winreg", "winsound", "nt", "msvcrt",
    "_winapi", "_msi", "_overlapped", "xxsubtype", "xxlimited", "_xxtestfuzz", "_testcapi",
    "_testinternalcapi", "_testbuffer", "_testimportmultiple", "_testmultiphase", "_ctypes_test",
    "_testclinic",
))  # fmt: skip


def preload_stdlib() -> None:
    """Import the standard library (about 550 modules: half a second and ~35 MB, once, shared).
    A worker that dropped to ``nobody`` may not read a base Python installed under a private
    folder (``/root/.pyenv``), so a module first imported later (``datetime.strptime`` imports
    ``_strptime``; agent code imports ``difflib``) would fail where AppWorld alone works."""
    for name in sorted(sys.stdlib_module_names - _STDLIB_SKIP):
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not on this platform or not built here
            continue
        for info in pkgutil.walk_packages(getattr(module, "__path__", None) or [], name + "."):
            if {"test", "tests", "idle_test", "__main__"} & set(info.name.split(".")):
                continue
            with contextlib.suppress(Exception):
                importlib.import_module(info.name)


def preload() -> None:
    """Import AppWorld and build every app's API routes (most of a world's first construction),
    and the standard library, once, in the zygote; forked children inherit it all copy-on-write."""
    import anyio.from_thread  # noqa: F401
    import pytest  # noqa: F401 - AppWorld's evaluator imports it at its first test (0.1 s)
    from appworld.apps import get_all_apps
    from appworld.common.utils import import_apis_module
    from appworld.environment import AppWorld  # noqa: F401
    from appworld.evaluator import evaluate_task  # noqa: F401

    for app in get_all_apps():
        import_apis_module(app)
    PENDING.install()
    preload_stdlib()


def warm_up(tmp: str) -> None:
    """Make and close one world (of the first task in the data, without its ground truth, its
    outputs in ``tmp``): a child's first ``AppWorld(...)`` then costs what a later one does in a
    process (IPython, pydantic and SQLAlchemy set up once, here). No thread outlives it."""
    from appworld.environment import AppWorld

    root, data = os.path.join(tmp, "warm-up"), os.path.join(os.environ["APPWORLD_ROOT"], "data")
    try:
        task_id = min(os.listdir(os.path.join(data, "tasks")))
        os.makedirs(root)
        os.symlink(data, os.path.join(root, "data"))
        real_root = os.environ["APPWORLD_ROOT"]
        scoring.use_root(root)
        try:
            AppWorld(task_id, experiment_name="warm-up", load_ground_truth=False).close()
        finally:
            AppWorld.close_all()
            scoring.use_root(real_root)
    except Exception:  # noqa: BLE001 - only an optimization: a broken task fails at its own reset
        traceback.print_exc(file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def fork_child(conn: socket.socket, listener: socket.socket, network: str, paths) -> None:
    """In the zygote: fork; the child serves ``conn`` and exits, the parent goes back to accepting."""
    if os.fork() != 0:
        conn.close()
        return
    try:
        listener.close()
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the zygote's stdin is the parent's pipe
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setpgid(0, 0)  # its own group: the parent kills an episode's processes together
        serve(conn, network, paths)
    finally:
        os._exit(0)


def kill_children() -> None:
    """SIGKILL every child of the zygote: workers, and the orphans it adopted as a subreaper
    (snapshots, anything agent code forked). Repeated, since killing one may orphan others."""
    me = str(os.getpid())
    for _ in range(5):
        found = False
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    ppid = f.read().rsplit(")", 1)[1].split()[1]
            except (OSError, IndexError):
                continue
            if ppid == me:
                found = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        if not found:
            return


def zygote(socket_path: str) -> None:
    """Preload AppWorld, enter a new network namespace, listen on ``socket_path`` and fork one
    child per connection. Says ``ready`` on stdout once listening; when its stdin closes (its
    parent is gone or closed the suite) it kills its children, removes its folder and exits."""
    protocol_out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints from AppWorld now go to stderr, not into a protocol
    preload()
    warm_up(os.path.dirname(socket_path))
    # Out of the collector's reach: a collection in a child would otherwise write to every
    # preloaded object, copying the whole shared heap (half a second per reset).
    gc.freeze()
    network, note = layers.enter_network_namespace()
    paths = layers.readable_paths()
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphaned snapshots come back to us
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    os.chmod(socket_path, 0o600)  # a worker that dropped to nobody cannot fork itself new children
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps finished children
    ready = {"ok": True, "ready": True, "pid": os.getpid(), "network": network, "note": note}
    protocol_out.write(json.dumps(ready) + "\n")
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                fork_child(conn, listener, network, paths)
            elif not os.read(sys.stdin.fileno(), 4096):
                kill_children()
                # Its folder holds only its socket, its log and its children's scratch: gone
                # even when sage-rl was killed and could not remove it.
                shutil.rmtree(os.path.dirname(socket_path), ignore_errors=True)
                os._exit(0)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: worker.py SOCKET_PATH")
    zygote(sys.argv[1])
