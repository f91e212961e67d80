"""Lean activations: the decoder's MLP and RMSNorm keep only their inputs for backward (issue 32).

Autograd keeps what each elementary op needs. For a SwiGLU MLP ``down(silu(gate(x)) * up(x))``
that is ``x``, ``gate(x)``, ``up(x)``, ``silu(gate(x))`` and their product: four tensors of the MLP's
width (1,536 for SmolLM2) per token and layer. For an RMSNorm ``w * (x * rsqrt(mean(x^2) + eps))``
it is ``x`` and the normalised ``x``. On the main job's 2,037-token SFT row these were ~1.1 GB of
the step's ~2.7 GB of saved activations (docs/LOG.md).

Here each is one autograd function that keeps ``x``, ``gate(x)``, ``up(x)`` (the MLP) or ``x`` and
the per-token ``rsqrt`` (the norm), and recomputes the rest in backward: two element-wise ops per
MLP, one per norm, against a step of matrix products. The forward is the module's own, op for op
(the same values to the bit); the gradients are the same up to float rounding
(tests/test_lean.py).

Only modules known to compute exactly that are switched (``MLPS``, ``NORMS``: Llama, Qwen2,
Mistral) and only when their projections are plain bias-free ``nn.Linear`` layers (a LoRA-wrapped
projection keeps the module's own forward), and under autocast they run their own forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

MLPS = ("LlamaMLP", "Qwen2MLP", "MistralMLP")
NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm")


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


class SwiGLU(torch.autograd.Function):
    """``down(silu(gate(x)) * up(x))`` keeping ``x``, ``gate(x)`` and ``up(x)`` for backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor):
        g, u = F.linear(x, w_gate), F.linear(x, w_up)
        ctx.save_for_backward(x, g, u, w_gate, w_up, w_down)
        return F.linear(F.silu(g) * u, w_down)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):
        x, g, u, w_gate, w_up, w_down = ctx.saved_tensors
        need_x, need_g, need_u, need_d = ctx.needs_input_grad
        s = F.silu(g)
        dp = dy @ w_down  # d/d(silu(g) * u)
        d_down = _flat(dy).T @ _flat(s * u) if need_d else None
        du = dp * s
        sig = torch.sigmoid(g)
        dg = dp * u * (sig * (1 + g * (1 - sig)))  # silu'(g), as torch's silu_backward
        dx = dg @ w_gate + du @ w_up if need_x else None
        d_gate = _flat(dg).T @ _flat(x) if need_g else None
        d_up = _flat(du).T @ _flat(x) if need_u else None
        return dx, d_gate, d_up, d_down


class RMSNorm(torch.autograd.Function):
    """``w * (x * rsqrt(mean(x^2) + eps))`` (in float32, cast back as transformers does) keeping
    ``x`` and the per-token ``rsqrt`` for backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, eps: float):
        xf = x.to(torch.float32)
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, w, rstd)
        return w * (xf * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):
        x, w, rstd = ctx.saved_tensors
        xhat = x.to(torch.float32) * rstd
        dw = None
        if ctx.needs_input_grad[1]:
            dw = (dy.to(torch.float32) * xhat).reshape(-1, w.shape[-1]).sum(0).to(w.dtype)
        dx = None
        if ctx.needs_input_grad[0]:
            dxhat = (dy * w).to(torch.float32)
            dx = (rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True))).to(x.dtype)
        return dx, dw, None


def _plain(*layers: Any) -> bool:
    return all(type(m) is torch.nn.Linear and m.bias is None for m in layers)


def _mlp_forward(m: Any):
    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled(x.device.type):  # mixed precision: the module's own casts
            return type(m).forward(m, x)
        return SwiGLU.apply(x, m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight)

    return forward


def _norm_forward(m: Any):
    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled(x.device.type):
            return type(m).forward(m, x)
        return RMSNorm.apply(x, m.weight, m.variance_epsilon)

    return forward


def switchable(model: Any) -> list[tuple[Any, Any]]:
    """``(module, lean forward)`` for every MLP and RMSNorm of ``model`` that computes exactly what
    ``SwiGLU`` / ``RMSNorm`` do."""
    out = []
    for m in model.modules():
        if "forward" in vars(m):  # already replaced on the instance (a hook): leave it be
            continue
        name = type(m).__name__
        if name in MLPS and type(getattr(m, "act_fn", None)).__name__ in ("SiLU", "SiLUActivation"):
            if _plain(m.gate_proj, m.up_proj, m.down_proj):
                out.append((m, _mlp_forward(m)))
        elif name in NORMS and hasattr(m, "variance_epsilon"):
            out.append((m, _norm_forward(m)))
    return out


@contextlib.contextmanager
def lean_activations(model: Any, enabled: bool = True) -> Iterator[int]:
    """Inside the block, ``model``'s MLPs and RMSNorms run as ``SwiGLU`` / ``RMSNorm``; yields how
    many modules were switched (0 when ``enabled`` is false)."""
    found = switchable(model) if enabled else []
    for m, fn in found:
        m.forward = fn  # an instance attribute: nn.Module.__call__ finds it before the class's
    try:
        yield len(found)
    finally:
        for m, _ in found:
            del m.forward
