"""Token logprobs under the model being trained: the plain path over (B, T, V) logits and the
chunked LM head that computes them for generated tokens only.

Both work on a ``TokenBatch`` (``train/batch.py``): logits at position t predict the token at t + 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sage_rl.train.batch import TokenBatch
from sage_rl.train.prefix import KV, as_cache


def token_logprobs(
    logits_BTV: torch.Tensor, target_BT: torch.Tensor, with_entropy: bool, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target_t | prefix) from logits whose last column is dropped (it predicts past the end),
    and the entropy of each predictive distribution (detached) when asked. The policy is
    softmax(logits / temperature): the distribution the rollouts were sampled from."""
    if logits_BTV.shape[1] != target_BT.shape[1] + 1:
        raise ValueError(f"logits cover {logits_BTV.shape[1]} positions, expected {target_BT.shape[1] + 1}")
    logits_BTV = logits_BTV[:, :-1].float()
    if temperature != 1.0:
        logits_BTV = logits_BTV / temperature
    lse_BT = torch.logsumexp(logits_BTV, dim=-1)
    logp_BT = logits_BTV.gather(-1, target_BT.unsqueeze(-1)).squeeze(-1) - lse_BT
    entropy_BT = _entropy(logits_BTV.detach(), lse_BT.detach()) if with_entropy else None
    return logp_BT, entropy_BT


@torch.no_grad()
def _entropy(logits_BTV: torch.Tensor, lse_BT: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """H = lse - sum_v p_v z_v, a few positions at a time: one (B, chunk, V) buffer, not (B, T, V)."""
    parts = []
    for t in range(0, logits_BTV.shape[1], chunk):
        z = logits_BTV[:, t : t + chunk]
        parts.append(lse_BT[:, t : t + chunk] - (torch.softmax(z, dim=-1) * z).sum(-1))
    return torch.cat(parts, dim=1)


# --------------------------------------------------------------------------------------------
# Chunked LM head: logprobs of the generated tokens only, without a (B, T, V) logits tensor
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkedHead:
    """The model split as decoder (-> final hidden states) + output projection, when that split
    reproduces the model's own logits (checked once by ``ChunkedHead.of``; models that scale or
    soft-cap logits fail the check and use the plain path)."""

    decoder: Any
    head: Any
    chunk: int = 1024  # generated tokens per projection tile
    #: logits (tokens x vocab) that may be kept for backward (2**28 fp32 = 1 GiB); above, tiles are
    #: recomputed in backward instead (one more head forward, memory ~ chunk x vocab)
    max_saved_logits: int = 2**28

    @classmethod
    @torch.no_grad()
    def of(cls, model: Any, device: torch.device) -> ChunkedHead | None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        get_decoder, head = getattr(base, "get_decoder", None), model.get_output_embeddings()
        if get_decoder is None or not isinstance(head, torch.nn.Linear):
            return None
        ids = torch.tensor([[1, 2, 3, 4, 5]], device=device)
        try:
            split = head(get_decoder()(input_ids=ids).last_hidden_state)
            whole = model(input_ids=ids).logits
        except (TypeError, AttributeError, RuntimeError):
            return None
        return cls(get_decoder(), head) if torch.allclose(split, whole, atol=1e-5, rtol=1e-4) else None

    def logprobs(
        self,
        b: TokenBatch,
        with_entropy: bool,
        past: KV | None = None,
        temperature: float = 1.0,
        **model_kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logp_BT, entropy_BT) over the trained window; zero off the mask (masked out later).
        ``past``: the keys/values of ``b.prefix_ids`` (train/prefix.py), when the batch has one;
        ``temperature``: as in ``token_logprobs``; ``model_kwargs``: handed to the decoder."""
        T = b.ids_BT.shape[1]
        hidden = self.decoder(
            input_ids=b.ids_BT,
            attention_mask=b.attn_full_BT,
            past_key_values=as_cache(past, b.ids_BT.shape[0]),
            use_cache=past is not None,
            **model_kwargs,
        ).last_hidden_state
        window = hidden[:, T - b.logits_to_keep : T - 1]  # position t predicts target t + 1
        sel = b.mask_BT.bool()
        h_ND, target_N = window[sel], b.target_BT[sel]
        n, c = len(target_N), self.chunk
        if n * self.head.out_features <= self.max_saved_logits:
            tiles = [self._tile(h_ND, target_N, temperature)] if n else []
        else:  # recompute each tile's logits in backward instead of keeping them
            tiles = [
                torch.utils.checkpoint.checkpoint(
                    self._tile, h_ND[i : i + c], target_N[i : i + c], temperature, use_reentrant=False
                )
                for i in range(0, n, c)
            ]
        logp_N, ent_N = [lp for lp, _ in tiles], [e for _, e in tiles]
        logp_BT = torch.zeros(b.mask_BT.shape, dtype=torch.float32, device=hidden.device)
        logp_BT = logp_BT.masked_scatter(sel, torch.cat(logp_N)) if logp_N else logp_BT + 0.0 * hidden.sum()
        entropy_BT = None
        if with_entropy:
            entropy_BT = (
                torch.zeros_like(logp_BT).masked_scatter(sel, torch.cat(ent_N))
                if ent_N
                else torch.zeros_like(logp_BT)
            )
        return logp_BT, entropy_BT

    def _tile(
        self, h_ND: torch.Tensor, target_N: torch.Tensor, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits_NV = self.head(h_ND).float()
        if temperature != 1.0:
            logits_NV = logits_NV / temperature
        lse_N = torch.logsumexp(logits_NV, dim=-1)
        logp_N = logits_NV.gather(-1, target_N.unsqueeze(-1)).squeeze(-1) - lse_N
        with torch.no_grad():
            ent_N = lse_N - (torch.softmax(logits_NV, dim=-1) * logits_NV).sum(-1)
        return logp_N, ent_N.detach()
