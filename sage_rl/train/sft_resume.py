"""Resume points of an SFT run: an interrupted ``train_sft`` started again continues where it stopped.

Every ``output.save_every_s`` seconds of training the run writes ``<output.dir>/resume/``:

    weights.safetensors   the trainable parameters
    best.safetensors      the best held-out weights so far (``output.keep=best``), a hard link
    optimizer.pt          AdamW's state (moments and step counts)
    state.json            the step, the losses and held-out evaluations so far, the best-weights
                          bookkeeping, the metrics file's length, the torch RNG, and a fingerprint

A resumed run loads them, truncates ``metrics.jsonl`` to the rows of the steps already taken, skips
the micro-batches those steps consumed (the data order is a function of the seed and the epoch) and
goes on: the same weights, step for step, as a run that was never stopped. The folder is replaced
atomically (written beside, then renamed), and removed when the run ends. The fingerprint is the
config (less ``output``) and the encoded data: a resume point of another run is an error that names
what differs, never silently mixed in; a damaged one is an error that names the file. The config
holds ``optim.dtype: auto``, not what it resolved to: a run resumed on a CPU where it resolves
otherwise goes on in that precision, with a warning, and its result says ``dtype: mixed`` and from
which step each ran (``dtype_by_step``).

A stop by SIGINT (Ctrl-C) or SIGTERM (a session's end) loses nothing since the last step
(``StopRequest``): the step in progress ends, a resume point for it is written (where resume points
are on), and the run raises ``SFTStopped``. A second signal stops it at once, as without this.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import os
import shutil
import signal
import threading
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from sage_rl.files import load_failure
from sage_rl.train.sft_schedule import BestWeights

log = logging.getLogger(__name__)

STATE, WEIGHTS, OPTIMIZER, BEST = "state.json", "weights.safetensors", "optimizer.pt", "best.safetensors"


class ResumeError(ValueError):
    """A resume point that cannot be used. The message names the file and what is wrong."""


@dataclass(frozen=True)
class Reached:
    """What the loop has done by ``step``."""

    step: int
    losses: list[float]
    evals: dict[int, dict[str, float]]  # step -> held-out losses
    metrics_offset: int  # bytes of metrics.jsonl written by then
    dtypes: tuple[tuple[int, str], ...] = ()  # (first step, compute dtype) of each stretch so far


def fingerprint(config: dict[str, Any], encoded: list[tuple[int, ...]]) -> str:
    """sha256 of the config and of every encoded example's ids. Left out: ``output`` (where and how
    often to write), where the run computes (``optim.threads``, ``optim.device``: a run may resume
    on another machine) and ``optim.lean_activations`` (what backward keeps, not what it computes)."""
    how = ("threads", "device", "lean_activations")
    optim = {k: v for k, v in config.get("optim", {}).items() if k not in how}
    kept = {**{k: v for k, v in config.items() if k != "output"}, "optim": optim}
    h = hashlib.sha256(json.dumps(kept, sort_keys=True).encode())
    for ids in encoded:
        h.update(array("q", [len(ids), *ids]).tobytes())
    return h.hexdigest()


def stretches(
    before: tuple[tuple[int, str], ...], start: int, amp: torch.dtype | None
) -> tuple[tuple[int, str], ...]:
    """The run's (first step, compute dtype) stretches once it goes on from ``start`` in ``amp``: a
    resume point written where ``optim.dtype: auto`` resolved otherwise (another CPU) says so."""
    now = str(amp or torch.float32).removeprefix("torch.")
    if before and before[-1][1] == now:
        return before
    if before:
        log.warning("SFT resumes at step %d in %s; steps before ran in %s", start + 1, now, before[-1][1])
    return (*before, (start + 1, now))


class SFTStopped(KeyboardInterrupt):
    """SFT ended early on a signal, after a step and its resume point (``StopRequest``)."""


class StopRequest:
    """While entered (in the main thread: signals reach no other), SIGINT and SIGTERM set
    ``signal`` instead of ending the process, so that the training loop can end after its step
    (either one the process ignores, as a background job its SIGINT, stays ignored).
    A second signal gets the handler from before (Ctrl-C's ``KeyboardInterrupt``, SIGTERM's exit)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signal: int | None = None
        self._before: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():  # a signal ignored stays ignored
            kept = [s for s in self.SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
            self._before = {s: signal.signal(s, self._on_signal) for s in kept}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._before.items():
            signal.signal(s, handler)
        self._before = {}

    def stop_after(self, step: int, total: int, resumes: bool) -> None:
        """Raise ``SFTStopped`` if a signal came (call it after the step's resume point)."""
        if self.signal is not None:
            again = "resumes there" if resumes else "starts again (output.save_every_s: null)"
            raise SFTStopped(f"SFT stopped by a signal after step {step} of {total}; it {again}")

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.signal is None:
            self.signal = signum
            log.warning("SFT: %s; stopping after this step (again to stop now)", signal.Signals(signum).name)
            return
        self.__exit__()
        signal.raise_signal(signum)  # the handler from before, now in place


class ResumePoints:
    """Writes and reads ``folder`` (``<output.dir>/resume``) for one run, identified by ``fingerprint``."""

    def __init__(self, folder: Path, fingerprint: str, every_s: float | None) -> None:
        self.folder = folder
        self.fingerprint = fingerprint
        self.every_s = every_s
        self._last = time.monotonic()

    def due(self) -> bool:
        """``every_s`` seconds since the last resume point (or the start)."""
        return self.every_s is not None and time.monotonic() - self._last >= self.every_s

    def save(
        self, model: torch.nn.Module, opt: torch.optim.Optimizer, best: BestWeights, done: Reached
    ) -> None:
        """Write a resume point for ``done`` (atomically: a crash mid-write leaves the previous one);
        nothing where resume points are off (``every_s`` None)."""
        if self.every_s is None:
            return
        tmp = self.folder.with_name(self.folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        params = {n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}
        save_file(params, str(tmp / WEIGHTS))
        torch.save(opt.state_dict(), tmp / OPTIMIZER)
        if best.spill is not None and best.spill.exists():  # the best weights as of this step
            _link(best.spill, tmp / BEST)  # a hard link: BestWeights replaces its file, never rewrites it
        rng = io.BytesIO()
        torch.save(torch.get_rng_state(), rng)
        state = {
            "fingerprint": self.fingerprint,
            "step": done.step,
            "losses": done.losses,
            "evals": {str(k): v for k, v in done.evals.items()},
            "metrics_offset": done.metrics_offset,
            "dtypes": [list(d) for d in done.dtypes],
            "best": {"best_loss": best.best_loss, "best_step": best.best_step, "bad_evals": best.bad_evals},
            "rng": base64.b64encode(rng.getvalue()).decode(),
        }
        (tmp / STATE).write_text(json.dumps(state), encoding="utf-8")
        old = self.folder.with_name(self.folder.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if self.folder.exists():
            self.folder.rename(old)
        tmp.rename(self.folder)
        shutil.rmtree(old, ignore_errors=True)
        self._last = time.monotonic()

    def load(self, model: torch.nn.Module, opt: torch.optim.Optimizer, best: BestWeights) -> Reached | None:
        """Restore the newest resume point into ``model``, ``opt``, ``best`` and the torch RNG;
        None when there is none."""
        if not (self.folder / STATE).exists():
            self._orphan_check()
            return None
        state = self._read_state()
        if state.get("fingerprint") != self.fingerprint:
            raise ResumeError(
                f"{self.folder} is a resume point of another SFT run (its config, less output, or its "
                f"data differ from this one's): delete the folder to start this run over, or run the "
                f"config that wrote it"
            )
        try:
            weights = load_file(str(self.folder / WEIGHTS))
            opt_state = torch.load(self.folder / OPTIMIZER, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any damage to either file is the same error to a user
            raise ResumeError(
                f"{self.folder}: cannot read {WEIGHTS} or {OPTIMIZER} ({load_failure(err)})"
            ) from err
        params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        if set(weights) != set(params):
            raise ResumeError(f"{self.folder / WEIGHTS} does not hold this model's trainable parameters")
        with torch.no_grad():
            for name, value in weights.items():
                params[name].copy_(value.to(params[name].device))
        opt.load_state_dict(opt_state)
        torch.set_rng_state(torch.load(io.BytesIO(base64.b64decode(state["rng"])), weights_only=True))
        if (self.folder / BEST).exists() and best.spill is not None:
            _link(self.folder / BEST, best.spill)
        b = state["best"]
        best.best_loss, best.best_step, best.bad_evals = b["best_loss"], b["best_step"], b["bad_evals"]
        if not best.resumed():
            raise ResumeError(
                f"{self.folder} names step {b['best_step']}'s weights as the best, but {best.spill} is gone"
            )
        evals = {int(k): v for k, v in state["evals"].items()}
        return Reached(
            state["step"], list(state["losses"]), evals, int(state["metrics_offset"]), state["dtypes"]
        )

    def _read_state(self) -> dict[str, Any]:
        path = self.folder / STATE
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            for key in ("fingerprint", "step", "losses", "evals", "metrics_offset", "best", "rng"):
                state[key]  # noqa: B018 - presence check
            # (first step, dtype) stretches; a point written before they were kept: one, unrecorded
            state["dtypes"] = tuple((int(a), str(b)) for a, b in state.get("dtypes") or [(1, "unrecorded")])
            return state
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ResumeError(
                f"{path} is damaged ({type(err).__name__}: {err}): delete {self.folder} to start over"
            ) from err

    def _orphan_check(self) -> None:
        """A crash between the two renames of ``save`` leaves only ``resume.old``: say so."""
        old = self.folder.with_name(self.folder.name + ".old")
        if (old / STATE).exists():
            raise ResumeError(
                f"{old} holds the last resume point: rename it to {self.folder.name} to resume from it"
            )

    def clear(self) -> None:
        """The run ended: its resume points are no longer needed (they are ~3x the weights' size)."""
        for name in ("", ".tmp", ".old"):
            shutil.rmtree(self.folder.with_name(self.folder.name + name), ignore_errors=True)


def _link(src: Path, dst: Path) -> None:
    """``dst`` becomes ``src``'s content (a hard link; a copy where the file system has none), atomically."""
    tmp = dst.with_name(dst.name + ".linking")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    tmp.replace(dst)
