"""Per-token KL penalties written with the arithmetic of AReaL, slime, NeMo-RL and TRL (our
own code): their clamps, the order of clamp and importance weight, and their compute dtype.

Each factory returns ``fn(log_prob, ref_log_prob[, weight])`` for ``check_kl_penalty``; the
weight is the checker's ``weights=`` tensor, which carries the gradient of a ratio
``π_θ / π_x`` when the framework differentiates through it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

K123 = ("k1", "k2", "k3")


def areal(estimator: str, apply_clamp: bool = True):
    """AReaL ``KLEstimator``: float32 whatever the input dtype; ``apply_clamp`` clamps the
    output of every estimator to ``[-10, 10]`` (no clamp on the log ratio)."""

    def fn(log_prob, ref_log_prob):
        log_ratio = log_prob.float() - ref_log_prob.float()
        if estimator == "k2":
            log_ratio = log_ratio**2 / 2.0
        elif estimator == "k3":
            log_ratio = -log_ratio
            log_ratio = log_ratio.exp() - 1 - log_ratio
        return log_ratio.clamp(min=-10, max=10) if apply_clamp else log_ratio

    return fn


def slime(kl_loss_type: str, weighted: bool = False):
    """slime ``compute_approx_kl``: float32; the importance ratio multiplies the estimate,
    then ``low_var_kl`` (only) is clamped to ``[-10, 10]``."""

    def kl(log_prob, ref_log_prob, importance_ratio=None):
        log_ratio = log_prob.float() - ref_log_prob.float()
        if kl_loss_type == "k1":
            out = log_ratio
        elif kl_loss_type == "k2":
            out = log_ratio**2 / 2.0
        else:
            log_ratio = -log_ratio
            out = log_ratio.exp() - 1 - log_ratio
        if importance_ratio is not None:
            out = importance_ratio * out
        if kl_loss_type == "low_var_kl":
            out = torch.clamp(out, min=-10, max=10)
        return out

    if weighted:
        return lambda log_prob, ref_log_prob, ratio: kl(log_prob, ref_log_prob, ratio)
    return lambda log_prob, ref_log_prob: kl(log_prob, ref_log_prob)


def nemo_rl(kl_type: str, input_clamp: float | None = 20.0, output_clamp: float | None = 10.0):
    """NeMo-RL ``calculate_kl`` with its defaults: the log ratio ``ref - logp`` clamped to
    ``±input_clamp`` (the weight detached where that clamp is active), the estimate times
    the importance weight, then clamped to ``±output_clamp``; in the inputs' dtype."""

    def fn(log_prob, ref_log_prob, weights=None):
        logr = ref_log_prob - log_prob
        if input_clamp is not None:
            clamped = logr.clamp(min=-input_clamp, max=input_clamp)
            if weights is not None:
                weights = torch.where(logr == clamped, weights, weights.detach())
            logr = clamped
        if kl_type == "k1":
            kl = -logr
        elif kl_type == "k2":
            kl = torch.square(logr) / 2
        else:
            kl = torch.exp(logr) - 1 - logr
        if weights is not None:
            kl = weights * kl
        if output_clamp is not None:
            kl = kl.clamp(min=-output_clamp, max=output_clamp)
        return kl

    return fn


def nemo_rl_default(kl_type: str):
    """NeMo-RL's KL term with ``use_on_policy_kl_approximation=False`` (its default): the
    weight ``exp(logp - logp.detach())`` (value 1), ``nan_to_num``'d, into ``calculate_kl``
    with its default clamps (``nemo_rl/algorithms/loss/loss_functions.py``)."""

    def fn(log_prob, ref_log_prob):
        weights = torch.exp(log_prob - log_prob.detach())
        weights = torch.nan_to_num(weights, nan=0.0, posinf=0.0, neginf=0.0)
        return nemo_rl(kl_type)(log_prob, ref_log_prob, weights)

    return fn


def trl_inline(use_bias_correction_kl: bool = False):
    """TRL ``GRPOTrainer._compute_loss``'s KL lines, wrapped into a function: the exact k3
    ``exp(ref - logp) - (ref - logp) - 1``, times ``coef_1 = exp(logp - old)`` (with its
    gradient) under ``use_bias_correction_kl``."""

    def kl(per_token_logps, ref_per_token_logps):
        return (
            torch.exp(ref_per_token_logps - per_token_logps)
            - (ref_per_token_logps - per_token_logps)
            - 1
        )

    if use_bias_correction_kl:
        return lambda logps, ref_logps, coef_1: kl(logps, ref_logps) * coef_1
    return kl


@dataclass(frozen=True)
class Config:
    """One framework setting: its function, what ``check_kl_penalty`` is told, and the
    ``kl_batches`` options that fit it."""

    name: str
    fn: Callable[..., Any]
    estimator: str
    check: dict[str, Any] = field(default_factory=dict)
    batches: dict[str, Any] = field(default_factory=dict)


_WEIGHTED = {"is_weights": True}
_NEMO_CLAMPS = {"input_clamp": 20.0, "output_clamp": 10.0}


def _slime(estimator: str, weighted: bool) -> Config:
    check: dict[str, Any] = {"output_clamp": 10.0 if estimator == "low_var_kl" else None}
    if weighted:
        # A float32 estimate times a float64 ratio: float64 out, float32 precision.
        check.update(weights="is_weights", compute_dtype=torch.float32)
    name = f"slime {estimator}" + (" use_unbiased_kl" if weighted else "")
    return Config(name, slime(estimator, weighted), estimator, check, _WEIGHTED if weighted else {})


FAMILIES: dict[str, list[Config]] = {
    "AReaL": [
        *(Config(f"AReaL {e} apply_clamp", areal(e), e, {"output_clamp": 10.0}) for e in K123),
        *(Config(f"AReaL {e}", areal(e, False), e, {"output_clamp": None}) for e in K123),
    ],
    "NeMo-RL": [
        *(Config(f"NeMo-RL {e}", nemo_rl(e), e, _NEMO_CLAMPS) for e in K123),
        *(
            Config(
                f"NeMo-RL {e} default",
                nemo_rl_default(e),
                e,
                {**_NEMO_CLAMPS, "score_function": True},
            )
            for e in K123
        ),
        Config(
            "NeMo-RL k3 without clamps", nemo_rl("k3", None, None), "k3", {"output_clamp": None}
        ),
        *(
            Config(
                f"NeMo-RL {e} weighted",
                nemo_rl(e),
                e,
                {**_NEMO_CLAMPS, "weights": "is_weights"},
                _WEIGHTED,
            )
            for e in K123
        ),
    ],
    "slime": [_slime(e, w) for e in ("k1", "k2", "k3", "low_var_kl") for w in (False, True)],
    "TRL": [
        Config("TRL k3", trl_inline(), "k3", {"output_clamp": None}),
        Config(
            "TRL k3 use_bias_correction_kl",
            trl_inline(True),
            "k3",
            {"output_clamp": None, "weights": "is_weights"},
            _WEIGHTED,
        ),
    ],
}
"""Every framework setting of the conformance test, by framework."""

UNCLAMPED_K3 = [
    config
    for configs in FAMILIES.values()
    for config in configs
    if config.estimator == "k3" and config.check.get("output_clamp", "auto") is None
]
"""The settings that compute an unclamped k3 at every position and leave masking to the
caller: ``exp`` of the padding's log ratio, finite on the padding real code leaves there."""
