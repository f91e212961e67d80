"""The clipped surrogate against cases worked out by hand, and against TRL's GRPO loss."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from sage_rl.train.loss import LossAgg, clipped_surrogate, tis_weights

torch.set_num_threads(1)

# One token per row: (advantage, ratio) -> (per-token loss, d loss / d logp before the 1/B mean, clipped?)
# eps_low = eps_high = 0.2. loss = -min(s A, clip(s, 0.8, 1.2) A); gradient = -A s if unclipped else 0.
BRANCHES = [
    (+1.0, 1.5, -1.2, 0.0, "high"),  # A > 0, above 1 + eps: clipped
    (+1.0, 0.5, -0.5, -0.5, None),  # A > 0, below 1 - eps: NOT clipped (pessimistic bound keeps it)
    (+1.0, 1.1, -1.1, -1.1, None),  # A > 0, inside
    (-1.0, 1.5, +1.5, +1.5, None),  # A < 0, above 1 + eps: NOT clipped
    (-1.0, 0.5, +0.8, 0.0, "low"),  # A < 0, below 1 - eps: clipped
    (-1.0, 0.9, +0.9, +0.9, None),  # A < 0, inside
]


def one_token_rows(rows):
    adv_B = torch.tensor([r[0] for r in rows])
    old_BT = torch.full((len(rows), 1), -1.0)
    logp_BT = (old_BT + torch.log(torch.tensor([[r[1]] for r in rows]))).requires_grad_(True)
    return logp_BT, old_BT, adv_B, torch.ones(len(rows), 1)


def test_every_clip_branch_value_gradient_and_fraction():
    logp, old, adv, mask = one_token_rows(BRANCHES)
    n = len(BRANCHES)
    out = clipped_surrogate(logp, old, adv, mask, num_chains=n)
    assert out.loss.item() == pytest.approx(sum(r[2] for r in BRANCHES) / n)  # 0.4 / 6
    out.loss.backward()
    assert logp.grad[:, 0].tolist() == pytest.approx([r[3] / n for r in BRANCHES])
    assert out.clip_frac_high == pytest.approx(1 / 6)
    assert out.clip_frac_low == pytest.approx(1 / 6)
    assert (out.ratio_min, out.ratio_max) == pytest.approx((0.5, 1.5))
    assert out.ratio_mean == pytest.approx(6.0 / 6)


def test_separate_low_and_high_bounds():
    # eps_low 0.1, eps_high 0.3: s = 1.25 with A > 0 is inside; s = 0.85 with A < 0 is clipped to 0.9
    logp, old, adv, mask = one_token_rows([(+1.0, 1.25), (-1.0, 0.85)])
    out = clipped_surrogate(logp, old, adv, mask, eps_low=0.1, eps_high=0.3, num_chains=1)
    assert out.loss.item() == pytest.approx(-1.25 + 0.9)
    assert (out.clip_frac_low, out.clip_frac_high) == (0.5, 0.0)


def two_rows_with_padding(pad_value: float):
    # row 0: ratios (1.0, 1.1) + one padded position; row 1: ratios (0.9, 0.95, 1.15). A = 1: loss_t = -s.
    ratios = torch.tensor([[1.0, 1.1, pad_value], [0.9, 0.95, 1.15]])
    old = torch.full((2, 3), -2.0)
    logp = (old + ratios.log()).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    return logp, old, torch.ones(2), mask


def test_aggregations():
    logp, old, adv, mask = two_rows_with_padding(1.0)
    # token means: row 0 -(1.0+1.1)/2 = -1.05, row 1 -(0.9+0.95+1.15)/3 = -1.0
    one_chain = clipped_surrogate(logp, old, adv, mask, num_chains=1)  # the two rows are positions of 1 chain
    assert one_chain.loss.item() == pytest.approx(-2.05)
    two_chains = clipped_surrogate(logp, old, adv, mask, num_chains=2)  # each row its own chain
    assert two_chains.loss.item() == pytest.approx(-1.025)
    with pytest.raises(ValueError, match="pass num_chains"):  # never guessed from the rows
        clipped_surrogate(logp, old, adv, mask)
    tok = clipped_surrogate(logp, old, adv, mask, agg=LossAgg.TOKEN_MEAN)
    assert tok.loss.item() == pytest.approx(-5.1 / 5)
    assert tok.num_tokens == 5
    # a micro-batch passes the whole batch's normalisers: the parts sum to the whole, for both modes
    for agg, whole in ((LossAgg.TOKEN_MEAN, tok), (LossAgg.SEQ_MEAN_TOKEN_MEAN, one_chain)):
        parts = [
            clipped_surrogate(
                logp[i : i + 1],
                old[i : i + 1],
                adv[i : i + 1],
                mask[i : i + 1],
                agg=agg,
                num_chains=1,
                num_tokens=5,
            )
            for i in range(2)
        ]
        assert sum(p.loss.item() for p in parts) == pytest.approx(whole.loss.item())


def test_masked_positions_change_nothing():
    a_logp, old, adv, mask = two_rows_with_padding(1.0)
    b_logp, _, _, _ = two_rows_with_padding(7.0)  # a wild ratio in the padded slot
    a = clipped_surrogate(a_logp, old, adv, mask, num_chains=2)
    b = clipped_surrogate(b_logp, old, adv, mask, num_chains=2)
    assert a.loss.item() == pytest.approx(b.loss.item())
    assert b.ratio_max == pytest.approx(1.15)
    b.loss.backward()
    assert b_logp.grad[0, 2].item() == 0.0
    assert b_logp.grad[1, 2].item() != 0.0


def test_empty_row_contributes_zero():
    logp = torch.zeros(2, 2, requires_grad=True)
    out = clipped_surrogate(
        logp,
        torch.zeros(2, 2),
        torch.tensor([1.0, 1.0]),
        torch.tensor([[1.0, 1.0], [0.0, 0.0]]),
        num_chains=2,
    )
    assert out.loss.item() == pytest.approx(-1.0 / 2)


def test_kl_to_reference_k3():
    logp = torch.full((1, 1), math.log(0.5), requires_grad=True)
    ref = torch.full((1, 1), math.log(0.25))
    zero_adv = torch.zeros(1)
    out = clipped_surrogate(
        logp, logp.detach(), zero_adv, torch.ones(1, 1), num_chains=1, ref_logp_BT=ref, kl_coef=0.1
    )
    k3 = 0.5 - math.log(0.5) - 1.0  # exp(d) - d - 1 with d = log 0.25 - log 0.5 = log 0.5
    assert out.loss.item() == pytest.approx(0.1 * k3)
    assert out.kl_ref == pytest.approx(k3)
    off = clipped_surrogate(logp, logp.detach(), zero_adv, torch.ones(1, 1), num_chains=1, ref_logp_BT=ref)
    assert off.loss.item() == 0.0


def test_approx_kl_diagnostic():
    logp, old, adv, mask = one_token_rows([(1.0, 2.0)])
    out = clipped_surrogate(logp, old, adv, mask, num_chains=1)
    assert out.approx_kl == pytest.approx(1.0 - math.log(2.0))


def test_shape_errors_name_the_tensors():
    with pytest.raises(ValueError, match="adv must be"):
        clipped_surrogate(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="old_logp"):
        clipped_surrogate(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3))


# --- cross-check with TRL ------------------------------------------------------------------------


class _IdentityAccelerator:
    """What GRPOTrainer._compute_loss asks of accelerate, for one process."""

    def reduce(self, t, reduction="sum"):
        return t

    def gather(self, t):
        return t

    gather_for_metrics = gather


def _trl_loss(grpo_trainer_cls, loss_type, logp_BT, old_BT, adv_B, mask_BT, eps_low, eps_high, beta, ref_BT):
    """Run TRL's own GRPOTrainer._compute_loss on given per-token logprobs (the model call is replaced
    by one that returns them), on a stand-in holding exactly the attributes that method reads."""
    B, T = logp_BT.shape
    stand_in = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp_BT, torch.zeros(B, T), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=beta,
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False),
        loss_type=loss_type,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        use_vllm=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        accelerator=_IdentityAccelerator(),
        _metrics={"train": defaultdict(list)},
    )
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask_BT.long(),
        "advantages": adv_B,
        "old_per_token_logps": old_BT,
    }
    if beta:
        inputs["ref_per_token_logps"] = ref_BT
    loss = grpo_trainer_cls._compute_loss(stand_in, None, inputs)
    return loss, stand_in._metrics["train"]


@pytest.mark.parametrize(
    ("loss_type", "agg", "beta"),
    [
        ("grpo", LossAgg.SEQ_MEAN_TOKEN_MEAN, 0.0),
        ("bnpo", LossAgg.TOKEN_MEAN, 0.0),
        ("grpo", LossAgg.SEQ_MEAN_TOKEN_MEAN, 0.04),
    ],
)
def test_agrees_with_trl_grpo_loss(loss_type, agg, beta):
    trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")
    g = torch.Generator().manual_seed(0)
    B, T = 6, 9
    old = -torch.rand(B, T, generator=g) * 3
    logp_data = old + (torch.rand(B, T, generator=g) - 0.5) * 0.8  # ratios in about [0.67, 1.5]: all branches
    ref = old + (torch.rand(B, T, generator=g) - 0.5) * 0.4
    adv = torch.randn(B, generator=g)
    lengths = torch.tensor([9, 5, 1, 7, 3, 8])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()

    ours_logp = logp_data.clone().requires_grad_(True)
    ours = clipped_surrogate(
        ours_logp,
        old,
        adv,
        mask,
        eps_low=0.2,
        eps_high=0.28,
        agg=agg,
        num_chains=B,
        ref_logp_BT=ref,
        kl_coef=beta,
    )
    ours.loss.backward()
    trl_logp = logp_data.clone().requires_grad_(True)
    trl_loss, metrics = _trl_loss(
        trl_grpo.GRPOTrainer, loss_type, trl_logp, old, adv, mask, 0.2, 0.28, beta, ref
    )
    trl_loss.backward()

    assert ours.loss.item() == pytest.approx(trl_loss.item(), rel=1e-6, abs=1e-7)
    assert torch.allclose(ours_logp.grad, trl_logp.grad, atol=1e-7)
    assert ours.clip_frac_low == pytest.approx(metrics["clip_ratio/low_mean"][0])
    assert ours.clip_frac_high == pytest.approx(metrics["clip_ratio/high_mean"][0])
    assert ours.clip_frac_low + ours.clip_frac_high > 0  # the case exercises the clip branches


def test_tis_weights_by_hand():
    old = torch.tensor([[0.0, -1.0, -2.0]])
    sampler = torch.tensor([[-1.0, -0.5, -2.0]])
    # exp(1) = 2.718 -> capped at 2; exp(-0.5) = 0.6065; exp(0) = 1
    w = tis_weights(old, sampler, cap=2.0)
    assert w.tolist()[0] == pytest.approx([2.0, math.exp(-0.5), 1.0], abs=1e-6)
    assert not w.requires_grad
    with pytest.raises(ValueError, match="cap must be > 0"):
        tis_weights(old, sampler, cap=0.0)
    with pytest.raises(ValueError, match="differ in shape"):
        tis_weights(old, sampler[:, :2], cap=2.0)


def test_tis_weights_scale_each_tokens_surrogate():
    # on-policy (s = 1): l_t = -w_t A; seq_mean_token_mean over 1 sample of 2 masked tokens, 1 chain
    logp = torch.tensor([[0.0, -1.0, -3.0]], requires_grad=True)
    w = tis_weights(logp.detach(), torch.tensor([[-1.0, -0.5, 0.0]]), cap=2.0)  # [2, 0.6065, e^-3]
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = clipped_surrogate(logp, logp.detach(), torch.tensor([1.5]), mask, num_chains=1, weight_BT=w)
    # L = -(2 * 1.5 + 0.60653 * 1.5) / 2 = -1.95490; dL/dlogp_t = -w_t * A / 2 (s = 1)
    assert out.loss.item() == pytest.approx(-(2.0 + math.exp(-0.5)) * 1.5 / 2, abs=1e-6)
    out.loss.backward()
    assert logp.grad.tolist()[0] == pytest.approx([-1.5, -math.exp(-0.5) * 0.75, 0.0], abs=1e-6)
    with pytest.raises(ValueError, match="weight"):
        clipped_surrogate(logp, logp.detach(), torch.tensor([1.5]), mask, num_chains=1, weight_BT=w[:, :2])
