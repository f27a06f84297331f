"""Per-token KL penalties written with the arithmetic of AReaL, slime, NeMo-RL and TRL (our
own code): their clamps, the order of clamp and importance weight, and their compute dtype.

Each factory returns ``fn(log_prob, ref_log_prob[, weight])`` for ``check_kl_penalty``; the
weight is the checker's ``weights=`` tensor, which carries the gradient of a ratio
``π_θ / π_x`` when the framework differentiates through it.
"""

from __future__ import annotations

import torch


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
