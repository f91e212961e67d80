"""LoRA adapters through peft, for the GRPO trainer and SFT alike."""

from __future__ import annotations

from typing import Any

from sage_rl.train.config import LoraConfig


def with_lora(model: Any, cfg: LoraConfig | None) -> Any:
    """``model`` wrapped with fresh LoRA adapters (a causal-LM peft model); unchanged for None."""
    if cfg is None:
        return model
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets = cfg.targets if cfg.targets == "all-linear" else list(cfg.targets)
    peft_cfg = PeftLoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets, task_type="CAUSAL_LM"
    )
    return get_peft_model(model, peft_cfg)
