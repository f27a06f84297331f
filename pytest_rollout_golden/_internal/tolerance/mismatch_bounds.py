"""Absolute bounds on the train–inference mismatch metrics: the defaults the field
publishes, the one spec grammar (``metric<=value``), and how the layers combine.

A bound is a ceiling: a metric passes when ``value <= bound`` (a NaN never passes).
Layers, highest first::

    golden.check_mismatch(bounds=)                 call
    @pytest.mark.golden(mismatch_bounds={...})     marker
    --golden-mismatch-bound metric<=value          cli (repeatable)
    ini golden_mismatch_bounds (one per line)      ini
    DEFAULT_BOUNDS (published thresholds)          default

A bound of ``inf`` switches a bound off (the run lists it as ``METRIC<=inf``); NaN and
``-inf`` are refused (no value passes them). Torch-free: the plugin checks the specs at
start-up without importing torch. The metrics themselves are computed by
:mod:`.mismatch`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..wording import close_match

METRIC_NAMES: tuple[str, ...] = (
    "token_mult_prob_error",
    "abs_logprob_diff_mean",
    "abs_logprob_diff_max",
    "abs_logprob_diff_seq_mean",
    "k1_kl",
    "k3_kl",
    "gen_kl_error",
    "policy_kl_error",
    "log_ppl_diff",
    "log_ppl_abs_diff",
    "ppl_ratio",
    "chi2_token",
    "seq_abs_logprob_diff_max",
    "seq_k3_kl_max",
    "seq_token_mult_prob_error_max",
    "ratio_outside_fraction",
)
"""Every metric :func:`.mismatch.metrics` returns, in its order."""

PREFIX = "mismatch/"
"""The prefix under which ``golden.check_mismatch`` records the metrics."""


@dataclasses.dataclass(frozen=True)
class Bound:
    """``metric <= value``, and where the number comes from."""

    value: float
    source: str

    def holds(self, observed: float) -> bool:
        """Whether ``observed`` is within the bound (NaN is not), or the bound is off."""
        return self.off or observed <= self.value

    @property
    def off(self) -> bool:
        """Whether the bound is switched off (``inf``)."""
        return math.isinf(self.value)


DEFAULT_BOUNDS: dict[str, Bound] = {
    "token_mult_prob_error": Bound(
        1.05,
        "NeMo-RL CI: max(train/token_mult_prob_error) < 1.05 (tests/test_suites; "
        "docs: investigate above 1.05)",
    ),
    "gen_kl_error": Bound(0.002, "NeMo-RL CI: max(train/gen_kl_error) < 0.002 (tests/functional)"),
    "k3_kl": Bound(0.01, "Prime-RL: mismatch KL r - log r - 1 < 0.01"),
    "abs_logprob_diff_mean": Bound(
        0.0104, "SkyRL CI: mean |logprob diff| <= 0.0104 (5% over its last 10 CI runs)"
    ),
    "abs_logprob_diff_seq_mean": Bound(
        0.1, "slime --ci-test: train/train_rollout_logprob_abs_diff <= 0.1"
    ),
}
"""The field's published thresholds (``docs/guide/recording.md`` has the table)."""


def parse_value(value: Any, where: str) -> float:
    """A bound's number: finite or ``inf`` (off), not NaN nor ``-inf``, which no value
    passes, not a bool (ValueError naming ``where``)."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: a bound must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {value!r} is not a number") from None
    if math.isnan(number) or number == -math.inf:
        raise ValueError(
            f"{where}: a bound cannot be {'NaN' if number != number else '-inf'}: no value "
            "passes it; give a number, "
            "or inf, which switches the bound off"
        )
    return number


def check_name(name: str, where: str) -> str:
    """``name`` (a ``mismatch/`` prefix dropped) if it is a mismatch metric, else ValueError."""
    key = name.strip().removeprefix(PREFIX)
    if key not in METRIC_NAMES:
        raise ValueError(
            f"{where}: {name!r} is not a mismatch metric{close_match(key, METRIC_NAMES)}; "
            f"the metrics are {', '.join(METRIC_NAMES)}"
        )
    return key


def split_spec(text: str, source: str, form: str = "METRIC<=VALUE") -> tuple[str, float]:
    """``"NAME<=VALUE"`` -> ``("NAME", value)`` (:func:`parse_value`); ValueError naming
    ``source`` and the ``form`` expected."""
    name, sep, value = text.partition("<=")
    if not sep or not name.strip() or not value.strip():
        raise ValueError(f"{source}: {text!r} is not of the form {form}")
    return name.strip(), parse_value(value.strip(), f"{source} {text!r}")


def parse_spec(text: str, source: str) -> tuple[str, float]:
    """``"gen_kl_error<=0.001"`` -> ``("gen_kl_error", 0.001)`` (ValueError naming ``source``)."""
    name, value = split_spec(text, source)
    return check_name(name, source), value


def layer(entries: Mapping[str, Any] | Iterable[str] | None, source: str) -> dict[str, Bound]:
    """The bounds of one layer: a mapping ``{metric: value}`` (marker, call) or spec lines
    (ini, cli); blank lines and ``#`` comments are skipped."""
    if not entries:
        return {}
    out: dict[str, Bound] = {}
    if isinstance(entries, Mapping):
        for name, value in entries.items():
            if not isinstance(name, str):
                raise ValueError(f"{source}: metric names must be strings, got {name!r}")
            key = check_name(name, source)
            out[key] = Bound(parse_value(value, f"{source} {name!r}"), source)
        return out
    for text in spec_lines(entries):
        key, value = parse_spec(text, source)
        out[key] = Bound(value, source)
    return out


def spec_lines(lines: str | Iterable[str]) -> Iterator[str]:
    """The specs among ini or command-line ``lines``: blank lines and ``#`` comments skipped."""
    for line in [lines] if isinstance(lines, str) else lines:
        text = line.split("#", 1)[0].strip()
        if text:
            yield text


def resolve(
    *layers: Mapping[str, Bound], base: Mapping[str, Bound] = DEFAULT_BOUNDS
) -> dict[str, Bound]:
    """The bounds in force: ``layers`` highest first over ``base`` (the defaults); a
    bound of ``inf`` stays, switched off (:attr:`Bound.off`), so that the run can say so."""
    merged = dict(base)
    for entries in reversed(layers):
        merged.update(entries)
    return merged


MARKER_SOURCE = "@pytest.mark.golden(mismatch_bounds=)"
CLI_SOURCE = "--golden-mismatch-bound"
INI_SOURCE = "ini golden_mismatch_bounds"
CALL_SOURCE = "golden.check_mismatch(bounds=)"


def session_bounds(
    marker: Mapping[str, Any] | None, cli: Iterable[str], ini: Iterable[str]
) -> dict[str, Bound]:
    """The bounds of one test: the marker's over ``--golden-mismatch-bound`` over the ini's
    over the defaults (ValueError naming the source of a bad entry)."""
    if marker is not None and not isinstance(marker, Mapping):
        raise ValueError(f"{MARKER_SOURCE} must be a dict {{metric: bound}}, got {marker!r}")
    return resolve(layer(marker, MARKER_SOURCE), layer(cli, CLI_SOURCE), layer(ini, INI_SOURCE))
