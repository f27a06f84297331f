"""The public API, pinned: a name added to or dropped from an ``__all__`` is a decision that
changes this file (and the docs), not an accident."""

from __future__ import annotations

import importlib

import pytest

PUBLIC = {
    "pytest_rollout_golden": [
        "Comparison", "Golden", "GoldenError", "GoldenFormatError", "GoldenMismatch",
        "GoldenMissingError", "GoldenNaNWarning", "GoldenNotFetchedError",
        "GoldenToleranceWarning", "Mode", "Outcome", "RolloutBatch", "Tolerance",
        "UnsupportedValueError", "Verdict", "deterministic", "fingerprint", "load_batch",
        "optimizer_state", "same_math", "save_batch",
    ],
    "pytest_rollout_golden.store": ["load_batch", "save_batch"],
    "pytest_rollout_golden.dumps": ["checked_tensors", "flatten"],
    "pytest_rollout_golden.mismatch": [
        "Locations", "METRIC_NAMES", "locate", "metrics", "sampled_log_probs",
    ],
    "pytest_rollout_golden.vllm_batch": [
        "VllmSamplingWarning", "log_prob_temperature", "vllm_generate", "vllm_rollout",
    ],
    "pytest_rollout_golden.sglang_batch": [
        "log_prob_temperature", "sglang_generate", "sglang_rollout",
    ],
    "pytest_rollout_golden.quant": [
        "ELEMENTS", "FORMATS", "Element", "Format", "Quantized", "dequantize", "error_bound",
        "quantize", "resolve", "round_element",
    ],
    "pytest_rollout_golden.quant.manifest": [
        "SCHEMES", "SENSITIVE", "Manifest", "Rules", "audit", "build", "changes", "detect",
        "substring_only", "whole_match",
    ],
    "pytest_rollout_golden.quant.sync": ["Mismatch", "RoundTrip", "check_round_trip", "round_trip"],
}  # fmt: skip


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_the_public_names_are_pinned(module: str):
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(PUBLIC[module])
    for name in mod.__all__:
        assert getattr(mod, name) is not None


@pytest.mark.parametrize(
    "module",
    [
        "strategies",
        "invariants",
        "reference",
        "parallel",
        "mismatch",
        "vllm_batch",
        "sglang_batch",
        "quant",
        "quant.manifest",
        "quant.sync",
    ],
)
def test_every_public_module_is_in_the_api_reference_with_docstrings(module: str):
    """docs/reference/api.md renders these modules from their docstrings: every public
    function and class must have one."""
    import inspect
    from pathlib import Path

    api = (Path(__file__).parents[2] / "docs" / "reference" / "api.md").read_text()
    assert f"::: pytest_rollout_golden.{module}\n" in api
    mod = importlib.import_module(f"pytest_rollout_golden.{module}")
    bare = [
        name
        for name in mod.__all__
        if (inspect.isfunction(obj := getattr(mod, name)) or inspect.isclass(obj))
        and not (obj.__doc__ or "").strip()
    ]
    assert bare == [], f"{module}: no docstring: {bare}"
