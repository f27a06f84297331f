"""Off-Policy Sequence Masking (OPSM, DeepSeek-V3.2): drop a sequence with a negative
advantage whose policy has moved too far from the one that sampled it.

Read from slime (THUDM/slime at 624b824a, ``slime/utils/ppo_utils.py::compute_opsm_mask``,
applied as ``pg_loss * opsm_mask`` in ``slime/backends/megatron_utils/loss.py``; flags
``--use-opsm``, ``--opsm-delta`` default 1e-4) and TRL (huggingface/trl at f2cd5771,
``GRPOTrainer.get_off_policy_mask``, ``off_policy_mask_threshold``), which agree: a token
is dropped when its advantage is ``< 0`` and its sequence's mean ``old - logp`` over valid
tokens exceeds ``delta``.
"""

from __future__ import annotations

from torch import Tensor

from .masking import masked_mean


def opsm_keep_mask(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    delta: float = 1e-4,
) -> Tensor:
    """Bool ``[B, T]``: ``False`` where ``A < 0`` and the row's ``mean_valid(old - logp) >
    delta`` (a forward-KL estimate; 0 for a row without valid tokens), ``True`` elsewhere
    (padding included: the loss's own mask removes it). ``old_log_prob`` is what the
    framework compares with: slime's old (or rollout) log-probs, TRL's sampling log-probs.
    """
    seq_kl = masked_mean(old_log_prob - log_prob, response_mask, dim=-1)
    drop = (advantages < 0) & (seq_kl > delta).unsqueeze(-1)
    return ~drop
