"""Hypothesis strategies for realistic rollout batches and rollout-correction thresholds.

Every generated number is a small integer scaled by a power of two (log-probs are multiples
of 1/16 nat), drawn from plain hypothesis integers, so failing examples shrink to small,
readable batches: few rows, short rows, on-policy values, one or two interesting tokens.

Profiles: importing this module registers the hypothesis profiles ``ci`` (derandomized, 50
examples, no deadline, prints the reproduction blob) and ``dev`` (25 examples, no deadline)
through :func:`register_profiles` (the same function the pytest plugin calls at start-up;
re-registering is harmless). Select one with ``--hypothesis-profile``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from hypothesis import strategies as st

from ._internal.hypothesis_profiles import register_profiles
from .quant.strategies import BLOCK_KINDS, quantization_weights
from .reference.advantages import response_span
from .reference.correction import RS_CRITERIA
from .reference.masking import as_bool_mask

__all__ = [
    "BLOCK_KINDS",
    "GRID",
    "PAD_LOG_PROB_DEPTH",
    "critic_batches",
    "is_thresholds",
    "kl_batches",
    "quantization_weights",
    "register_profiles",
    "reward_batches",
    "rollout_batches",
    "rs_configs",
    "rs_criteria",
    "rs_thresholds",
    "value_batches",
]

GRID = 16
"""Log-probabilities, log ratios and drifts are multiples of ``1 / GRID`` nat."""

PAD_LOG_PROB_DEPTH = 16
"""Realistic padding of a log-prob field lies in ``[-PAD_LOG_PROB_DEPTH, 0]`` nats: what a
model gives a pad token, so ``exp`` of the difference of two log-prob fields stays below
``e^16 ≈ 8.9e6``, finite in float64, float32 and bfloat16 (not float16, whose ``exp``
overflows above 11 nats)."""

_EXTREME = 25 * GRID  # a 25-nat log ratio: beyond the ±20 safety clamp
_GARBAGE_CYCLE = (1.0, -2.0, 3.0, 5.0, -1.5)
_FIELDS = ("old_log_probs", "rollout_log_probs", "log_probs", "advantages")
_LOG_PROB_FIELDS = _FIELDS[:3]


def _one_of(value: Any, default: Sequence[Any]) -> st.SearchStrategy[Any]:
    if value is None:
        return st.sampled_from(list(default))
    if isinstance(value, list | tuple):
        return st.sampled_from(list(value))
    return st.just(value)


def rollout_batches(
    *,
    min_batch: int = 1,
    max_batch: int = 6,
    min_len: int = 1,
    max_len: int = 12,
    dtype: torch.dtype | Sequence[torch.dtype] = torch.float64,
    padding: Literal["right", "left", "either"] = "either",
    off_policy: float = 3.0,
    policy_drift: float = 2.0,
    extreme_ratios: bool = True,
    mask_dtype: torch.dtype | Sequence[torch.dtype] | None = None,
    allow_empty_rows: bool = True,
    advantages: Literal["token", "sequence", "either"] = "either",
    max_groups: int = 3,
    garbage: bool | Literal["extreme"] | Collection[str] = True,
    device: str | torch.device = "cpu",
    group_size: int | None = None,
) -> st.SearchStrategy[dict[str, torch.Tensor]]:
    """Rollout batches: dicts of ``old_log_probs``, ``rollout_log_probs``, ``log_probs``,
    ``response_mask``, ``advantages`` (all ``[B, T]``) and ``uid`` (int64 ``[B]``).

    * ``B`` in ``[min_batch, max_batch]``, padded length ``T`` in ``[min_len, max_len]``; each
      row has a valid length in ``[0, T]`` (``[1, T]`` without ``allow_empty_rows``), the
      batch has at least one valid token, and the padding sits on one side (``padding``).
    * Valid log-probs are ≤ 0, down to about -8 nats. ``|log π_train - log π_rollout|`` per
      token spans ``[0, off_policy]`` nats, so ratios cross any realistic threshold; with
      ``extreme_ratios`` up to two tokens get a 25-nat log ratio (beyond the ±20 clamp).
      ``log_probs`` (the current policy) differs from ``old_log_probs`` by up to
      ``policy_drift`` nats, enough to hit the PPO clip and the dual clip (ratio > 3).
    * Padding positions hold what real code leaves there (``garbage=True``, the default):
      ``advantages`` hold **garbage**, non-zero finite values of either sign up to a few
      thousand in magnitude (an uninitialised buffer); each log-prob field holds, drawn per
      field, zeros or the log-probs a model gives pad tokens: finite, ≤ 0, down to
      :data:`PAD_LOG_PROB_DEPTH` nats, different in every tensor. Code that exponentiates a
      log ratio at every position and masks afterwards is correct on such batches, and code
      that lets padding into a sum or a mean is still caught. ``garbage="extreme"`` puts
      garbage in every field, positive "log-probs" of thousands included, which no model
      produces (only for code that must survive any padding, say a ``torch.empty`` buffer);
      a collection of field names puts garbage in those fields only and zeros elsewhere
      (``garbage={"advantages"}``); ``garbage=False`` puts zeros everywhere. The checkers
      vary the padding only in fields whose padding is not all zeros, and keep realistic
      padding realistic.
    * ``advantages`` are multiples of 1/4 in ``[-3, 3]``, per token or constant per sequence.
    * ``uid`` holds group ids in ``[0, max_groups)``; with ``group_size=n`` the groups are
      contiguous blocks of ``n`` rows instead (``uid = row // n``, the ``view(-1, n)`` layout
      of TRL, slime and ROLL) and ``B`` is a multiple of ``n`` within the bounds.
    * ``dtype`` is the float dtype of the token tensors (or a list to draw from);
      ``mask_dtype`` that of the mask (default: drawn from bool, int64 and ``dtype``).

    The tensors are plain (no ``requires_grad``); checkers that need gradients make their own
    leaf copies.
    """
    _check_rollout_options(min_batch, max_batch, min_len, max_len, padding, advantages)
    ratio_steps = round(off_policy * GRID)
    drift_steps = round(policy_drift * GRID)
    dirty, realistic = _padding_kinds(garbage)
    sizes = _batch_sizes(min_batch, max_batch, group_size)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, torch.Tensor]:
        frame = _draw_frame(draw, dtype, mask_dtype, sizes, min_len, max_len, padding)
        lengths = _draw_lengths(draw, frame, allow_empty_rows)
        if sum(lengths) == 0:
            lengths[0] = 1
        level = draw(
            st.sampled_from(["token", "sequence"] if advantages == "either" else [advantages])
        )
        valid_values = _draw_valid_values(
            draw, lengths, level, ratio_steps, drift_steps, extreme_ratios
        )
        scale = draw(st.integers(1, 1000)) / 4 if dirty else 0.0
        depths = {key: _draw_pad_depth(draw) for key in sorted(realistic)}
        uid = _draw_uid(draw, frame.size, max_groups, group_size)
        out = _padded_fields(frame, lengths, valid_values, _Padding(dirty, scale, depths), device)
        out["uid"] = torch.tensor(uid, dtype=torch.int64, device=device)
        return out

    return build()


def _check_rollout_options(
    min_batch: int, max_batch: int, min_len: int, max_len: int, padding: str, advantages: str
) -> None:
    if not 1 <= min_batch <= max_batch:
        raise ValueError(f"need 1 <= min_batch <= max_batch, got {min_batch}, {max_batch}")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")
    if padding not in ("right", "left", "either"):
        raise ValueError(f"padding must be 'right', 'left' or 'either', got {padding!r}")
    if advantages not in ("token", "sequence", "either"):
        raise ValueError(f"advantages must be 'token', 'sequence' or 'either', got {advantages!r}")


@dataclass(frozen=True)
class _Frame:
    """What every batch strategy draws first: the dtypes, ``B``, ``T`` and the padding side."""

    float_dtype: torch.dtype
    mask_type: torch.dtype
    size: int
    width: int
    side: str


def _draw_frame(
    draw: st.DrawFn,
    dtype: torch.dtype | Sequence[torch.dtype],
    mask_dtype: torch.dtype | Sequence[torch.dtype] | None,
    sizes: st.SearchStrategy[int],
    min_len: int,
    max_len: int,
    padding: str,
) -> _Frame:
    float_dtype = draw(_one_of(dtype, ()))
    mask_type = draw(_one_of(mask_dtype, (torch.bool, torch.int64, float_dtype)))
    size = draw(sizes)
    width = draw(st.integers(min_len, max_len))
    side = draw(st.sampled_from(["right", "left"] if padding == "either" else [padding]))
    return _Frame(float_dtype, mask_type, size, width, side)


def _draw_lengths(draw: st.DrawFn, frame: _Frame, allow_empty_rows: bool) -> list[int]:
    """The valid length of each row, in ``[0, T]`` (``[1, T]`` without empty rows)."""
    shortest = 0 if allow_empty_rows else 1
    return draw(
        st.lists(st.integers(shortest, frame.width), min_size=frame.size, max_size=frame.size)
    )


def _draw_ints(draw: st.DrawFn, low: int, high: int, count: int) -> list[int]:
    return draw(st.lists(st.integers(low, high), min_size=count, max_size=count))


def _draw_uid(draw: st.DrawFn, size: int, max_groups: int, group_size: int | None) -> list[int]:
    """Group ids: drawn from ``[0, max_groups)``, or contiguous blocks of ``group_size``."""
    if group_size is None:
        return _draw_ints(draw, 0, max_groups - 1, size)
    return [row // group_size for row in range(size)]


def _draw_valid_values(
    draw: st.DrawFn,
    lengths: list[int],
    level: str,
    ratio_steps: int,
    drift_steps: int,
    extreme_ratios: bool,
) -> dict[str, list]:
    """The valid tokens' log-probs and advantages of :func:`rollout_batches`, in order."""
    n = sum(lengths)
    base = _draw_ints(draw, 0, 8 * GRID, n)
    ratio = _draw_ints(draw, -ratio_steps, ratio_steps, n)
    drift = _draw_ints(draw, -drift_steps, drift_steps, n)
    adv = _draw_ints(draw, -12, 12, n if level == "token" else len(lengths))
    if extreme_ratios:
        spikes = draw(st.lists(st.tuples(st.integers(0, n - 1), st.booleans()), max_size=2))
        for position, up in spikes:
            ratio[position] = _EXTREME if up else -_EXTREME
    valid_values = _valid_log_probs(base, ratio, drift)
    valid_values["advantages"] = _valid_advantages(adv, level, lengths)
    return valid_values


def _valid_log_probs(base: list[int], ratio: list[int], drift: list[int]) -> dict[str, list]:
    """The old, rollout and current log-probs of the valid tokens, from grid steps."""
    # Valid token k of the batch: the larger of (old, rollout) is -base, the other one is
    # |ratio| lower, so old - rollout == ratio exactly and both stay <= 0.
    old_valid, rollout_valid, current_valid = [], [], []
    for a, j, d in zip(base, ratio, drift, strict=True):
        old = -a if j >= 0 else -a + j
        rollout = old - j
        current = old + d if old + d <= 0 else old - d
        old_valid.append(old / GRID)
        rollout_valid.append(rollout / GRID)
        current_valid.append(current / GRID)
    return {
        "old_log_probs": old_valid,
        "rollout_log_probs": rollout_valid,
        "log_probs": current_valid,
    }


def _valid_advantages(adv: list[int], level: str, lengths: list[int]) -> list[float]:
    """Advantages of the valid tokens: one per token, or each row's repeated over the row."""
    if level == "token":
        return [v / 4 for v in adv]
    return [adv[row] / 4 for row, length in enumerate(lengths) for _ in range(length)]


def _padding_mask(lengths: list[int], width: int, side: str) -> torch.Tensor:
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, length in enumerate(lengths):
        if side == "right":
            mask[row, :length] = True
        else:
            mask[row, width - length :] = True
    return mask


@dataclass(frozen=True)
class _Padding:
    """What the padding of each field of :func:`rollout_batches` holds: garbage of ``scale``
    in the ``dirty`` fields, pad-token log-probs down to ``depths[key]`` nats in the log-prob
    fields named there (zeros at depth 0), zeros elsewhere."""

    dirty: frozenset[str]
    scale: float
    depths: dict[str, float]

    def fill(self, key: str, field: int, size: int, width: int) -> torch.Tensor:
        if key in self.dirty:
            return _junk(size, width, self.scale, field)
        return _pad_log_probs(size, width, self.depths.get(key, 0.0), field)


def _padded_fields(
    frame: _Frame,
    lengths: list[int],
    valid_values: dict[str, list],
    padding: _Padding,
    device: str | torch.device,
) -> dict[str, torch.Tensor]:
    """The ``[B, T]`` token fields and mask: valid values in place, ``padding`` around."""
    mask = _padding_mask(lengths, frame.width, frame.side)
    out: dict[str, torch.Tensor] = {}
    for field, key in enumerate(_FIELDS):
        values = padding.fill(key, field, frame.size, frame.width)
        values[mask] = torch.tensor(valid_values[key], dtype=torch.float64)
        out[key] = values.to(dtype=frame.float_dtype, device=device)
    out["response_mask"] = mask.to(dtype=frame.mask_type, device=device)
    return out


def _draw_pad_depth(draw: st.DrawFn) -> float:
    """How deep a log-prob field's padding goes: 0 (zeros, a quarter of the draws, and where
    examples shrink to) or a multiple of ``1 / GRID`` up to :data:`PAD_LOG_PROB_DEPTH`."""
    if draw(st.integers(0, 3)) == 0:
        return 0.0
    return draw(st.integers(1, PAD_LOG_PROB_DEPTH * GRID)) / GRID


def _padding_kinds(
    garbage: bool | Literal["extreme"] | Collection[str],
) -> tuple[frozenset[str], frozenset[str]]:
    """The fields of :func:`rollout_batches` with garbage in their padding, and those with
    realistic padding log-probs."""
    if garbage is True:
        return frozenset(_FIELDS) - frozenset(_LOG_PROB_FIELDS), frozenset(_LOG_PROB_FIELDS)
    if garbage == "extreme":
        return frozenset(_FIELDS), frozenset()
    return _garbage_fields(garbage, _FIELDS), frozenset()


def _garbage_fields(garbage: bool | Collection[str], fields: Sequence[str]) -> frozenset[str]:
    """The fields that get garbage in their padding."""
    if isinstance(garbage, bool):
        return frozenset(fields) if garbage else frozenset()
    if isinstance(garbage, str):
        garbage = [garbage]
    chosen = frozenset(garbage)
    unknown = sorted(chosen - set(fields))
    if unknown:
        raise ValueError(f"garbage names unknown fields {unknown}; the fields are {list(fields)}")
    return chosen


def _batch_sizes(min_batch: int, max_batch: int, group_size: int | None) -> st.SearchStrategy[int]:
    """Row counts in the bounds; multiples of ``group_size`` when it is given."""
    if group_size is None:
        return st.integers(min_batch, max_batch)
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    low, high = -(-min_batch // group_size), max_batch // group_size
    if low > high:
        raise ValueError(
            f"no multiple of group_size={group_size} in [{min_batch}, {max_batch}] rows"
        )
    return st.integers(low, high).map(lambda groups: groups * group_size)


REWARD_VALUES = (0.0, 0.1, 0.2, 0.5, 1.0, -0.3, 0.7)
"""Reward values of :func:`reward_batches`: few (so groups often tie, and a group's std is
often exactly 0) and mostly not dyadic (so float32 group statistics of float64 scores are
visibly inexact: the mean of ``[0.1, 0.1, 0.1]`` in float32 is ``0.1 + 1.5e-9``)."""


def reward_batches(
    *,
    min_batch: int = 1,
    max_batch: int = 8,
    max_len: int = 6,
    dtype: torch.dtype | Sequence[torch.dtype] = torch.float64,
    mask_dtype: torch.dtype | Sequence[torch.dtype] | None = None,
    rewards: Literal["outcome", "dense", "either"] = "either",
    max_groups: int = 3,
    padding: Literal["right", "left", "either"] = "either",
    allow_empty_rows: bool = False,
    garbage: bool = False,
    group_size: int | None = None,
) -> st.SearchStrategy[dict[str, torch.Tensor]]:
    """Inputs of an advantage estimator: ``token_level_rewards`` and ``response_mask``
    (``[B, T]``) and ``uid`` (int64 ``[B]``, group ids in ``[0, max_groups)``, so some groups
    are singletons and some labels unused).

    Every row has at least one valid token, unless ``allow_empty_rows`` (then rows may have
    none, as :func:`rollout_batches` and RS-filtered batches do; such a row scores 0).
    ``"outcome"`` rewards put one value from :data:`REWARD_VALUES` on the row's last valid
    token; ``"dense"`` put one on every valid token. Padding rewards are exactly zero
    (estimators such as verl's sum the whole row), or garbage with ``garbage=True``.
    ``group_size=n``: groups are contiguous blocks of ``n`` rows (``uid = row // n``) and
    ``B`` is a multiple of ``n``.
    """
    if not 1 <= min_batch <= max_batch:
        raise ValueError(f"need 1 <= min_batch <= max_batch, got {min_batch}, {max_batch}")
    sizes = _batch_sizes(min_batch, max_batch, group_size)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, torch.Tensor]:
        frame = _draw_frame(draw, dtype, mask_dtype, sizes, 1, max_len, padding)
        size, width, side = frame.size, frame.width, frame.side
        kind = draw(st.sampled_from(["outcome", "dense"] if rewards == "either" else [rewards]))
        lengths = _draw_lengths(draw, frame, allow_empty_rows)
        values = torch.zeros(size, width, dtype=torch.float64)
        mask = torch.zeros(size, width, dtype=torch.bool)
        for row, length in enumerate(lengths):
            cols = range(length) if side == "right" else range(width - length, width)
            mask[row, list(cols)] = True
            targets = list(cols) if kind == "dense" else list(cols)[-1:]
            for col in targets:
                values[row, col] = draw(st.sampled_from(REWARD_VALUES))
        if garbage:
            values = torch.where(mask, values, _junk(size, width, draw(st.integers(1, 1000)) / 4))
        uid = _draw_uid(draw, size, max_groups, group_size)
        return {
            "token_level_rewards": values.to(frame.float_dtype),
            "response_mask": mask.to(frame.mask_type),
            "uid": torch.tensor(uid, dtype=torch.int64),
        }

    return build()


def _cycle(size: int, width: int, field: int) -> torch.Tensor:
    """Float64 ``[size, width]`` of :data:`_GARBAGE_CYCLE` values, a pattern per ``field``."""
    rows = torch.arange(size).unsqueeze(-1)
    cols = torch.arange(width).unsqueeze(0)
    cycle = torch.tensor(_GARBAGE_CYCLE, dtype=torch.float64)
    return cycle[(7 * rows + 3 * cols + field) % len(_GARBAGE_CYCLE)]


def _junk(size: int, width: int, scale: float, field: int = 0) -> torch.Tensor:
    """Float64 garbage ``[size, width]``: non-zero, either sign, up to ``5·scale·(1 + field)``."""
    return _cycle(size, width, field) * scale * (1 + field)


def _pad_log_probs(size: int, width: int, depth: float, field: int) -> torch.Tensor:
    """Float64 pad-token log-probs ``[size, width]``: in ``[-depth, -depth / 5]`` (zeros at
    depth 0), a pattern per ``field``."""
    cycle = _cycle(size, width, field).abs()
    if depth == 0:
        return torch.zeros_like(cycle)
    return -depth * cycle / cycle.new_tensor(_GARBAGE_CYCLE).abs().max()


def kl_batches(
    *, is_weights: bool = False, **options: Any
) -> st.SearchStrategy[dict[str, torch.Tensor]]:
    """:func:`rollout_batches` (same options) with ``ref_log_probs``, the reference policy's
    log-probs: the rollout log-probs, so ``log_probs - ref_log_probs`` spans a few nats, with
    spikes of about 25 (beyond k3's clamp at 10 and the ±20 log clamp).

    With ``is_weights`` the batch also holds ``is_weights``, the importance weight of an
    importance-weighted KL: the ratio ``exp(log_probs - old_log_probs)`` on valid tokens
    (slime's ``importance_ratio``, TRL's ``coef_1``), computed in float64 and rounded to the
    batch's dtype; padding holds positive garbage where ``log_probs`` holds garbage. Such a
    batch also gets a spike where a clamp of the log ratio under a clamp of the weighted
    estimate can be seen: one valid token whose reference lies ``m`` nats below the policy
    (``m`` in ``[20.5, 24]``), and on every token with ``|log_probs - ref_log_probs| > 20``
    a weight of ``e^-c`` (``c`` in ``[3.5, 6]``, the old log-prob raised above the current
    one, both lowered together when needed to stay ≤ 0), so that ``w·k`` stays under an
    output clamp of 10 for k1, k2 and k3 (``w·½·24² < 10`` needs ``w < 0.035``). Without
    weights an output clamp of 10 hides a clamp of the log ratio at 20 entirely (k1, k2 and
    k3 all exceed 10 there)."""
    if not is_weights:
        return rollout_batches(**options).map(_with_ref_log_probs)
    steps = st.tuples(
        st.integers(0, 2**16),
        st.integers(round(20.5 * GRID), 24 * GRID),
        st.integers(round(3.5 * GRID), 6 * GRID),
    )
    return st.tuples(rollout_batches(**options), steps).map(
        lambda drawn: _with_weighted_spikes(_with_ref_log_probs(drawn[0]), *drawn[1])
    )


def _with_ref_log_probs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {**batch, "ref_log_probs": batch["rollout_log_probs"].clone()}


def _with_weighted_spikes(
    batch: dict[str, torch.Tensor], pick: int, depth: int, drop: int
) -> dict[str, torch.Tensor]:
    """``batch`` with a spike of ``depth / GRID`` nats below the policy on its ``pick``-th
    valid token (modulo their number), a weight ``e^(-drop / GRID)`` on every spike, and
    ``is_weights = exp(log_probs - old_log_probs)`` (see :func:`kl_batches`)."""
    valid = as_bool_mask(batch["response_mask"])
    dtype = batch["log_probs"].dtype
    lp, old, ref = (
        batch[k].to(torch.float64) for k in ("log_probs", "old_log_probs", "ref_log_probs")
    )
    flat = valid.flatten().nonzero().flatten()
    chosen = torch.zeros_like(valid).flatten()
    chosen[flat[pick % flat.numel()]] = True
    ref = torch.where(chosen.view_as(valid), lp - depth / GRID, ref)
    spikes = valid & ((lp - ref).abs() > 20)
    lower = (lp + drop / GRID).clamp(min=0)
    lp = torch.where(spikes, lp - lower, lp)
    ref = torch.where(spikes, ref - lower, ref)
    old = torch.where(spikes, lp + drop / GRID, old)
    log_ratio = lp - old
    junk = torch.where(batch["log_probs"] != 0, 1.0 + log_ratio.abs(), 0.0)
    fields = {"log_probs": lp, "old_log_probs": old, "ref_log_probs": ref}
    out = {**batch, **{k: v.to(dtype) for k, v in fields.items()}}
    out["is_weights"] = torch.where(valid, log_ratio.exp(), junk).to(dtype)
    return out


def value_batches(
    *,
    min_batch: int = 1,
    max_batch: int = 6,
    max_len: int = 10,
    dtype: torch.dtype | Sequence[torch.dtype] = torch.float64,
    mask_dtype: torch.dtype | Sequence[torch.dtype] | None = None,
    padding: Literal["right", "left", "either"] = "either",
    rewards: Literal["outcome", "dense", "either"] = "either",
    holes: bool = True,
    allow_empty_rows: bool = True,
    garbage: bool = True,
    bootstrap: bool = False,
    hole_values: bool = False,
) -> st.SearchStrategy[dict[str, torch.Tensor]]:
    """Inputs of GAE: ``token_level_rewards``, ``values`` and ``response_mask`` (``[B, T]``),
    and with ``bootstrap`` ``last_values`` (``[B]``, the value after the last token of a
    truncated response).

    Values are multiples of 1/8 in ``[-2, 2]``; rewards come from :data:`REWARD_VALUES`, on the
    last valid token (``"outcome"``) or on every valid token (``"dense"``). With ``holes`` the
    span of a row may contain masked tokens (tool observations of a multi-turn response),
    which GAE must skip. Padding and holes hold garbage in rewards and values (zeros with
    ``garbage=False``). With ``hole_values`` the holes hold what a framework whose GAE takes no
    mask (slime, ROLL) steps through instead: reward 0 and a value from the same grid
    (``check_gae(masked_tokens="step")``).
    """
    if not 1 <= min_batch <= max_batch:
        raise ValueError(f"need 1 <= min_batch <= max_batch, got {min_batch}, {max_batch}")
    sizes = st.integers(min_batch, max_batch)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, torch.Tensor]:
        frame = _draw_frame(draw, dtype, mask_dtype, sizes, 1, max_len, padding)
        size, width, side = frame.size, frame.width, frame.side
        kind = draw(st.sampled_from(["outcome", "dense"] if rewards == "either" else [rewards]))
        lengths = _draw_lengths(draw, frame, allow_empty_rows)
        if sum(lengths) == 0:
            lengths[0] = 1
        mask = torch.zeros(size, width, dtype=torch.bool)
        reward = torch.zeros(size, width, dtype=torch.float64)
        value = torch.zeros(size, width, dtype=torch.float64)
        for row, length in enumerate(lengths):
            cols = list(range(length) if side == "right" else range(width - length, width))
            if holes and length > 2:
                dropped = draw(st.lists(st.booleans(), min_size=length - 2, max_size=length - 2))
                middle = [c for c, d in zip(cols[1:-1], dropped, strict=True) if not d]
                cols = [cols[0], *middle, cols[-1]]
            mask[row, cols] = True
            for col in cols if kind == "dense" else cols[-1:]:
                reward[row, col] = draw(st.sampled_from(REWARD_VALUES))
            for col in range(cols[0], cols[-1] + 1) if hole_values and cols else cols:
                value[row, col] = draw(st.integers(-16, 16)) / 8
        scale = draw(st.integers(1, 1000)) / 4 if garbage else 0.0
        meaningful = response_span(mask) if hole_values else mask
        out = {
            "token_level_rewards": torch.where(meaningful, reward, _junk(size, width, scale, 1)),
            "values": torch.where(meaningful, value, _junk(size, width, scale, 2)),
        }
        out = {key: tensor.to(frame.float_dtype) for key, tensor in out.items()}
        out["response_mask"] = mask.to(frame.mask_type)
        if bootstrap:
            last = draw(st.lists(st.integers(-16, 16), min_size=size, max_size=size))
            last_values = torch.tensor(last, dtype=torch.float64).div(8)
            out["last_values"] = last_values.to(frame.float_dtype)
        return out

    return build()


def critic_batches(
    *,
    min_batch: int = 1,
    max_batch: int = 6,
    max_len: int = 10,
    dtype: torch.dtype | Sequence[torch.dtype] = torch.float64,
    mask_dtype: torch.dtype | Sequence[torch.dtype] | None = None,
    padding: Literal["right", "left", "either"] = "either",
    allow_empty_rows: bool = True,
    garbage: bool = True,
) -> st.SearchStrategy[dict[str, torch.Tensor]]:
    """Inputs of a value loss: ``vpreds`` (the critic's new predictions), ``values`` (the
    rollout critic's, which the clip range is centred on), ``returns`` and ``response_mask``
    (``[B, T]``).

    ``values`` and ``returns`` are multiples of 1/8 in ``[-2, 2]``; ``vpreds`` is ``values``
    plus a multiple of 1/16 in ``[-1, 1]``, so that a clip range of 0.1 to 0.5 has tokens
    inside and outside it, on both sides of the return. Padding holds garbage in every float
    field (zeros with ``garbage=False``).
    """
    if not 1 <= min_batch <= max_batch:
        raise ValueError(f"need 1 <= min_batch <= max_batch, got {min_batch}, {max_batch}")
    sizes = st.integers(min_batch, max_batch)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, torch.Tensor]:
        frame = _draw_frame(draw, dtype, mask_dtype, sizes, 1, max_len, padding)
        lengths = _draw_lengths(draw, frame, allow_empty_rows)
        if sum(lengths) == 0:
            lengths[0] = 1
        mask = _padding_mask(lengths, frame.width, frame.side)
        count = sum(lengths)
        values = torch.tensor(_draw_ints(draw, -16, 16, count), dtype=torch.float64) / 8
        offsets = torch.tensor(_draw_ints(draw, -16, 16, count), dtype=torch.float64) / 16
        returns = torch.tensor(_draw_ints(draw, -16, 16, count), dtype=torch.float64) / 8
        scale = draw(st.integers(1, 1000)) / 4 if garbage else 0.0
        out = {}
        for field, (key, valid) in enumerate(
            {"vpreds": values + offsets, "values": values, "returns": returns}.items()
        ):
            full = _junk(frame.size, frame.width, scale, field)
            full[mask] = valid
            out[key] = full.to(frame.float_dtype)
        out["response_mask"] = mask.to(frame.mask_type)
        return out

    return build()


def is_thresholds(
    *,
    truncation: bool = True,
    icepop: bool = True,
    two_sided: bool = False,
    one_sided: bool = False,
) -> st.SearchStrategy[float | str | tuple[float, float]]:
    """IS thresholds: truncation floats in ``[1.125, 6]``, IcePop ``"lower_upper"`` strings
    with ``lower`` in ``[1/16, 15/16]`` and ``upper`` in ``[1.125, 6]``, with ``one_sided``
    also one-sided IcePop ``"0_upper"`` / ``"lower_inf"``, and (``two_sided``) two-sided
    truncation pairs ``(lower, upper)`` from the same ranges."""
    options: list[st.SearchStrategy[float | str | tuple[float, float]]] = []
    bounds = st.tuples(st.integers(1, 15), st.integers(9, 48))
    if truncation:
        options.append(st.integers(9, 48).map(lambda k: k / 8))
    if icepop:
        options.append(bounds.map(lambda p: f"{p[0] / 16!r}_{p[1] / 8!r}"))
    if icepop and one_sided:
        options.append(st.integers(9, 48).map(lambda k: f"0_{k / 8!r}"))
        options.append(st.integers(1, 15).map(lambda k: f"{k / 16!r}_inf"))
    if two_sided:
        options.append(bounds.map(lambda p: (p[0] / 16, p[1] / 8)))
    if not options:
        raise ValueError("enable truncation, icepop, two_sided or several")
    return st.one_of(options)


def _threshold_part(name: str, one_sided: bool = False) -> st.SearchStrategy[str]:
    if name.endswith("k1"):
        # Deliberately asymmetric bounds (lower != 1/upper): reciprocal-symmetric bounds
        # would hide a criterion that keeps 1/upper <= ratio <= 1/lower instead.
        bounds = st.tuples(st.integers(2, 15), st.integers(9, 32)).map(
            lambda p: f"{p[0] / 16!r}_{p[1] / 8!r}"
        )
        bare = st.integers(9, 32).map(lambda k: repr(k / 8))
        if not one_sided:
            return st.one_of(bounds, bare)
        upper_only = st.integers(9, 32).map(lambda k: f"0_{k / 8!r}")
        lower_only = st.integers(2, 15).map(lambda k: f"{k / 16!r}_inf")
        return st.one_of(bounds, bare, upper_only, lower_only)
    return st.integers(1, 64).map(lambda k: repr(k / 16))


def rs_thresholds(criterion: str, *, one_sided: bool = False) -> st.SearchStrategy[str]:
    """One threshold per comma-separated part of ``criterion``, comma-joined.

    k1 parts get ``"lower_upper"`` ratio bounds (asymmetric) or a bare upper bound ≥ 1.125,
    and with ``one_sided`` also ``"0_upper"`` and ``"lower_inf"``; k2/k3 parts a positive
    upper bound in ``[1/16, 4]``.
    """
    names = [part.strip() for part in criterion.split(",")]
    return st.tuples(*(_threshold_part(name, one_sided) for name in names)).map(",".join)


def rs_criteria(*, max_parts: int = 2) -> st.SearchStrategy[str]:
    """RS criterion strings: 1 to ``max_parts`` distinct criteria, comma-combined."""
    return st.lists(st.sampled_from(RS_CRITERIA), min_size=1, max_size=max_parts, unique=True).map(
        ",".join
    )


def rs_configs(
    *, max_parts: int = 2, one_sided: bool = False
) -> st.SearchStrategy[tuple[str, str]]:
    """``(criterion, threshold)`` pairs drawn from :func:`rs_criteria` / :func:`rs_thresholds`."""
    return rs_criteria(max_parts=max_parts).flatmap(
        lambda criterion: rs_thresholds(criterion, one_sided=one_sided).map(
            lambda threshold: (criterion, threshold)
        )
    )


register_profiles()
