"""LoRA adapters (peft) in the native runner: the effective weight of a wrapped projection.

A peft LoRA ``Linear`` computes ``base(x) + sum_a B_a A_a x * scaling_a`` over its active adapters
(dropout is off in eval mode, where sampling runs). The native runner folds that sum into its own
copy of the weight, ``W + sum_a get_delta_weight(a)``, so that a model trained with LoRA samples as
fast as a plain one. Variants whose output is not of that form (DoRA, LoRA biases) are refused, and
such a model runs through its own forward.
"""

from __future__ import annotations

from typing import Any

import torch


def unwrap(model: Any) -> Any:
    """The transformers model inside a peft wrapper (``model`` itself when not wrapped)."""
    if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
        return model.get_base_model()
    return model


def is_lora_linear(m: Any) -> bool:
    return hasattr(m, "base_layer") and hasattr(m, "lora_A") and hasattr(m, "get_delta_weight")


def projection_problem(m: Any) -> str | None:
    """Why the native runner cannot fold ``m`` into one linear map (None when it can)."""
    if type(m) is torch.nn.Linear:
        return None
    if not (is_lora_linear(m) and type(m.base_layer) is torch.nn.Linear):
        return f"a projection is a {type(m).__name__}, not a torch.nn.Linear or a LoRA Linear"
    for a in _active(m):
        if getattr(m, "use_dora", {}).get(a) or getattr(m, "lora_bias", {}).get(a):
            return "DoRA or LoRA biases"
    return None


def _active(m: Any) -> list[str]:
    if m.merged or m.disable_adapters:  # merged: the base weight already holds the deltas
        return []
    return [a for a in m.active_adapters if a in m.lora_A]


def effective_linear(m: Any) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
    """``(weight, bias, folded)`` of the linear map ``m`` computes; ``folded`` says whether
    adapter deltas were added (the weight is then a new tensor, not the parameter)."""
    if type(m) is torch.nn.Linear:
        return m.weight.detach(), (m.bias.detach() if m.bias is not None else None), False
    base, active = m.base_layer, _active(m)
    weight = base.weight.detach()
    for a in active:
        weight = weight + m.get_delta_weight(a).detach().to(weight.dtype)
    return weight, (base.bias.detach() if base.bias is not None else None), bool(active)
