"""``sage-rl sft``'s work: load the model and the chat examples, fine-tune, save (docs/sft.md)."""

from __future__ import annotations

from sage_rl.train.sft_config import SFTConfig


def run_sft(cfg: SFTConfig, show_progress: bool = True) -> dict:
    """Load the model and the data, train, save (``cfg.output.dir``); returns the result as a
    dict. Bad data or an unloadable model raise ``ValueError``, ``RuntimeError`` or ``OSError``;
    another process in its folder ``RunInUse`` (runs/claim.py)."""
    from sage_rl.runs.claim import claim

    with claim(cfg.output.dir):
        return _run_sft(cfg, show_progress)


def _run_sft(cfg: SFTConfig, show_progress: bool) -> dict:
    import torch

    from sage_rl.agent.render import ChatRenderer
    from sage_rl.data.records import read_jsonl
    from sage_rl.engine.threads import pick_threads
    from sage_rl.models import load_model
    from sage_rl.runs.console import err
    from sage_rl.train.sft import train_sft

    before = torch.get_num_threads()
    try:
        examples = read_jsonl(cfg.data.path)[: cfg.data.limit]
        model, tokenizer = load_model(cfg.model, device=cfg.optim.device)
        rethread = None
        if cfg.optim.threads:
            torch.set_num_threads(cfg.optim.threads)
        elif model.device.type == "cpu":  # null: the cores other processes leave free (engine/threads.py)
            torch.set_num_threads(pick_threads())
            err.print(f"sft: {torch.get_num_threads()} torch threads (optim.threads=null: the free cores)")

            asked: int | None = None  # a count other than the current one, asked for at the last check

            def rethread(step: int) -> None:  # and again before every step: a neighbour comes and goes
                nonlocal asked
                n = pick_threads(samples=3)  # 0.1 s of probes: one busy moment can be a blip
                if n == torch.get_num_threads():
                    asked = None
                elif n == asked:  # twice in a row: a change, not a blip
                    torch.set_num_threads(n)
                    asked = None
                    err.print(f"sft: step {step}: {n} torch threads (the free cores changed)")
                else:
                    asked = n

        _, result = train_sft(
            model, tokenizer, examples, cfg, ChatRenderer(tokenizer).conversation, show_progress, rethread
        )
    finally:  # the stages after it (the recipe's) choose their own
        torch.set_num_threads(before)
    return result.to_dict()
