"""Train–inference mismatch: how far the trainer's log probs of the sampled tokens are from
the rollout engine's, as the metrics each framework logs, in float64.

Notation: ``d = log_probs - rollout_log_probs`` per valid token (trainer minus engine,
``log r`` with ``r = π_train / π_rollout``), means over the valid tokens of the batch
unless a name says ``seq``. Formulas and their sources:

================================  =========================================================
``token_mult_prob_error``         ``mean exp(|d|)``; NeMo-RL ``ClippedPGLossFn``
                                  (``nemo_rl/algorithms/loss/loss_functions.py``:
                                  ``masked_mean(exp(|gen - prev| · mask), mask)``)
``gen_kl_error``                  ``mean(exp(d) - 1 - d)``: KL(P_gen ‖ P_train), k3; NeMo-RL
                                  ``calculate_kl(logprobs=gen, logprobs_reference=train,
                                  kl_type="k3", no clamps)``, ``logr = reference - logprobs``
                                  (``nemo_rl/algorithms/utils.py``); equal to Prime-RL's
                                  ``mismatch_kl``: ``r - log r - 1`` with ``r = exp(train -
                                  inference)`` (``prime_rl/trainer/rl/loss.py``)
``policy_kl_error``               ``mean(exp(-d) - 1 + d)``: KL(P_train ‖ P_gen), k3; NeMo-RL
                                  ``calculate_kl(logprobs=train, logprobs_reference=gen)``
``k3_kl``                         verl ``rollout_corr/k3_kl``: ``gen_kl_error`` with ``d``
                                  clamped to ±20 first (``rollout_corr_helper.py``)
``k1_kl``                         verl ``rollout_corr/kl``: ``mean(-d)`` (k1 of KL(rollout ‖
                                  train); may be negative)
``abs_logprob_diff_mean``         ``mean |d|``: SkyRL's CI metric, TRL
                                  ``sampling/sampling_logp_difference/mean``
``abs_logprob_diff_max``          ``max |d|``: TRL ``sampling/sampling_logp_difference/max``
``abs_logprob_diff_seq_mean``     mean over sequences of each one's mean ``|d|``: slime
                                  ``train_rollout_logprob_abs_diff``
                                  (``sum_of_sample_mean(|old - rollout|)`` over the samples)
``log_ppl_diff``,                 verl: per sequence ``mean(rollout) - mean(train)`` (the
``log_ppl_abs_diff``,             difference of log perplexities), averaged over sequences
``ppl_ratio``                     (signed, absolute); ``ppl_ratio`` = mean of its ``exp``
``chi2_token``                    verl: ``mean exp(2d) - 1`` (``d`` clamped to ±20)
``seq_abs_logprob_diff_max``,     worst sequence: the largest per-sequence mean of ``|d|``,
``seq_k3_kl_max``,                of ``exp(d) - 1 - d``, of ``exp(|d|)`` (NeMo-RL logs a
``seq_token_mult_prob_error_max`` ``max_seq_mult_prob_error`` of the last kind)
``ratio_outside_fraction``        fraction of valid tokens with ``r`` outside ``[1/c, c]``
                                  (``c = ratio_bound``, default 2: IcePop's ``[0.5, 2]``)
================================  =========================================================

verl's diagnostics come from :func:`.reference.correction.offpolicy_metrics`, not a copy.
Padding never contributes, whatever it holds (garbage, ``±inf``, NaN); the mask may be
bool, integer or float (non-zero = valid). A batch without a valid token gives 0 for every
metric (as a masked mean does).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from ._internal.tolerance.mismatch_bounds import METRIC_NAMES
from .reference.correction import METRIC_PREFIX, offpolicy_metrics
from .reference.masking import as_bool_mask, masked_max, masked_mean, valid_rows

__all__ = [
    "METRIC_NAMES",
    "Locations",
    "locate",
    "metrics",
    "sampled_log_probs",
]

RATIO_BOUND = 2.0
"""Default ``c`` of ``ratio_outside_fraction``: IcePop's ``[0.5, 2]``, verl's default
IS truncation 2.0."""


def _inputs(
    log_probs: Tensor, rollout_log_probs: Tensor, response_mask: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(train, rollout, valid, d)`` in float64, ``d`` zero on padding."""
    if log_probs.shape != rollout_log_probs.shape or log_probs.shape != response_mask.shape:
        raise ValueError(
            "log_probs, rollout_log_probs and response_mask must have one shape, got "
            f"{tuple(log_probs.shape)}, {tuple(rollout_log_probs.shape)} and "
            f"{tuple(response_mask.shape)}"
        )
    if log_probs.dim() != 2:
        raise ValueError(f"expected [batch, tokens] tensors, got shape {tuple(log_probs.shape)}")
    valid = as_bool_mask(response_mask.detach()).cpu()
    train = log_probs.detach().to("cpu", torch.float64)
    rollout = rollout_log_probs.detach().to("cpu", torch.float64)
    zero = torch.zeros((), dtype=torch.float64)
    train = torch.where(valid, train, zero)  # padding may hold inf or NaN: never let it in
    rollout = torch.where(valid, rollout, zero)
    return train, rollout, valid, train - rollout


def metrics(
    log_probs: Tensor,
    rollout_log_probs: Tensor,
    response_mask: Tensor,
    *,
    ratio_bound: float = RATIO_BOUND,
) -> dict[str, float]:
    """Every mismatch metric of the module docstring, as Python floats computed in float64.

    ``log_probs``: the trainer's log probs of the sampled tokens ``[B, T]``;
    ``rollout_log_probs``: the engine's; ``response_mask``: the valid tokens.
    """
    if not (math.isfinite(ratio_bound) and ratio_bound > 1):
        raise ValueError(f"ratio_bound must be a finite number > 1, got {ratio_bound!r}")
    train, rollout, valid, d = _inputs(log_probs, rollout_log_probs, response_mask)
    rows = valid_rows(valid)
    verl = offpolicy_metrics(train, rollout, valid)

    def mean(values: Tensor) -> float:
        return float(masked_mean(values, valid))

    def worst_row(values: Tensor) -> float:
        per_row = masked_mean(values, valid, dim=-1)[rows]
        return float(per_row.max()) if per_row.numel() else 0.0

    abs_d = d.abs()
    k3_forward = torch.expm1(d) - d  # exp(d) - 1 - d, accurate for small d
    k3_reverse = torch.expm1(-d) + d
    mult = torch.exp(abs_d)
    per_row_abs = masked_mean(abs_d, valid, dim=-1)[rows]
    outside = (abs_d > math.log(ratio_bound)).to(torch.float64)
    out = {
        "token_mult_prob_error": mean(mult),
        "abs_logprob_diff_mean": mean(abs_d),
        "abs_logprob_diff_max": float(masked_max(abs_d.flatten(), valid.flatten(), dim=0)),
        "abs_logprob_diff_seq_mean": float(per_row_abs.mean()) if per_row_abs.numel() else 0.0,
        "k1_kl": verl[f"{METRIC_PREFIX}kl"],
        "k3_kl": verl[f"{METRIC_PREFIX}k3_kl"],
        "gen_kl_error": mean(k3_forward),
        "policy_kl_error": mean(k3_reverse),
        "log_ppl_diff": verl[f"{METRIC_PREFIX}log_ppl_diff"],
        "log_ppl_abs_diff": verl[f"{METRIC_PREFIX}log_ppl_abs_diff"],
        "ppl_ratio": verl[f"{METRIC_PREFIX}ppl_ratio"],
        "chi2_token": verl[f"{METRIC_PREFIX}chi2_token"],
        "seq_abs_logprob_diff_max": worst_row(abs_d),
        "seq_k3_kl_max": worst_row(k3_forward),
        "seq_token_mult_prob_error_max": worst_row(mult),
        "ratio_outside_fraction": mean(outside),
    }
    assert tuple(out) == METRIC_NAMES
    return out


# --------------------------------------------------------------------------- locations


@dataclasses.dataclass(frozen=True)
class Locations:
    """Where a batch's mismatch sits: its worst sequences and tokens, worst first.

    ``sequences``: ``(row, mean |d|, valid tokens)``; ``tokens``: ``(row, position,
    trainer log prob, engine log prob, d)``.
    """

    sequences: list[tuple[int, float, int]]
    tokens: list[tuple[int, int, float, float, float]]


def locate(
    log_probs: Tensor, rollout_log_probs: Tensor, response_mask: Tensor, *, count: int = 3
) -> Locations:
    """The ``count`` sequences with the largest mean ``|d|`` and tokens with the largest ``|d|``
    (a non-finite ``d`` counts as the largest)."""
    train, rollout, valid, d = _inputs(log_probs, rollout_log_probs, response_mask)
    size = torch.where(valid, d.abs().nan_to_num(nan=math.inf), -1.0)
    per_row = torch.where(valid_rows(valid), masked_mean(size.clamp(min=0), valid, dim=-1), -1.0)
    n_rows = int(valid_rows(valid).sum())
    order = torch.argsort(per_row, descending=True, stable=True)[: min(count, n_rows)]
    sequences = [(int(b), float(per_row[b]), int(valid[b].sum())) for b in order]
    flat = torch.argsort(size.flatten(), descending=True, stable=True)[
        : min(count, int(valid.sum()))
    ]
    width = d.shape[-1]
    tokens = []
    for index in flat.tolist():
        b, t = divmod(index, width)
        tokens.append((b, t, float(train[b, t]), float(rollout[b, t]), float(d[b, t])))
    return Locations(sequences, tokens)


# --------------------------------------------------------------------------- trainer side


def sampled_log_probs(logits: Tensor, tokens: Tensor, *, temperature: float = 1.0) -> Tensor:
    """``log_softmax(logits / temperature)`` gathered at ``tokens``, in float32 or wider.

    ``logits`` ``[..., V]`` are the scores *predicting* each token of ``tokens`` ``[...]``
    (for a causal LM, ``model(input_ids).logits[:, t - 1]`` predicts ``input_ids[:, t]``:
    shift before calling). Use the engine's sampling temperature when the engine reports
    processed log probs (vLLM ``logprobs_mode="processed_logprobs"``, SGLang, verl's
    rollout), 1.0 when it reports raw ones (vLLM's default ``raw_logprobs``).
    """
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(
            f"temperature must be a finite number > 0 (greedy decoding has no log probs to "
            f"match), got {temperature!r}"
        )
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} must be tokens {tuple(tokens.shape)} plus a vocab axis"
        )
    dtype = torch.promote_types(logits.dtype, torch.float32)
    scaled = logits.to(dtype) / temperature
    return torch.log_softmax(scaled, dim=-1).gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
