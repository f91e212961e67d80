"""The noise control for an RL update: is a change in greedy TGC the update's direction, or would
any change of its size do the same?

Greedy decoding of a model trained on a varied expert (three names for each helper, several code
shapes) sits on near-ties: a small change of the weights flips some of them, and the greedy path
after a flip is one the model would sample, whose success is its sampled success rather than the
greedy path's. This script writes models whose update has the RL update's size but not its
direction, to be evaluated beside the trained one (``sage-rl eval``, the same settings):

- ``signflip``: each element of the update ``trained - start`` with a random sign (the same
  element sizes, per tensor the same norm; a random direction);
- ``negate``: ``start - (trained - start)``, the update reversed.

If ``signflip`` loses what the trained model loses, the loss is the size of the change, not what
RL learned; if ``negate`` loses as much, the direction carries nothing the evaluation sees.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/perturb_control.py --start runs/laptop35/sft/final \\
        --trained runs/laptop35/grpo_lib/checkpoints/step_000002/model --mode signflip --seed 0 --out /tmp/ctl/signflip0

Prints the update's norm, the written change's norm and their cosine (1 for the trained model
itself, -1 for ``negate``, ~0 for ``signflip``).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

WEIGHTS = "model.safetensors"


def perturbed(start: dict[str, torch.Tensor], trained: dict[str, torch.Tensor], mode: str, seed: int) -> dict:
    """``start + d`` per tensor, where ``d`` is the update ``trained - start`` with random signs
    (``signflip``, from ``seed``) or reversed (``negate``); in each tensor's own dtype."""
    if start.keys() != trained.keys():
        raise SystemExit(
            f"perturb_control: the two models hold different tensors ({set(start) ^ set(trained)})"
        )
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(start):
        delta = trained[name].float() - start[name].float()
        if mode == "signflip":
            signs = torch.randint(0, 2, delta.shape, generator=gen).float() * 2 - 1
            delta = delta * signs
        elif mode == "negate":
            delta = -delta
        else:
            raise SystemExit(f"perturb_control: mode {mode!r} is not signflip or negate")
        out[name] = (start[name].float() + delta).to(start[name].dtype).contiguous()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--start", type=Path, required=True, help="the model RL started from (a Hugging Face folder)"
    )
    ap.add_argument("--trained", type=Path, required=True, help="the model after the RL update")
    ap.add_argument("--mode", choices=("signflip", "negate"), required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    for folder in (a.start, a.trained):
        if not (folder / WEIGHTS).is_file():
            raise SystemExit(
                f"perturb_control: {folder / WEIGHTS} does not exist (one safetensors file per model)"
            )
    start, trained = load_file(a.start / WEIGHTS), load_file(a.trained / WEIGHTS)
    out = perturbed(start, trained, a.mode, a.seed)
    a.out.mkdir(parents=True, exist_ok=True)
    for path in a.start.iterdir():  # config, tokenizer, generation settings: the start's
        if path.is_file() and path.name != WEIGHTS:
            shutil.copyfile(path, a.out / path.name)
    save_file(out, str(a.out / WEIGHTS), metadata={"format": "pt"})
    # in float64: float32's sums over 135M entries read a reversed update's cosine as -0.9855
    upd = torch.cat([(trained[k].double() - start[k].double()).flatten() for k in start])
    chg = torch.cat([(out[k].double() - start[k].double()).flatten() for k in start])
    cos = float(torch.dot(upd, chg) / (upd.norm() * chg.norm()).clamp_min(1e-300))
    print(f"update norm {upd.norm():.6g}, written change norm {chg.norm():.6g}, cosine {cos:+.4f}; {a.out}")


if __name__ == "__main__":
    main()
