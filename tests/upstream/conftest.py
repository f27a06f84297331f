"""The upstream conformance lane: the checkers against the real verl, OpenRLHF and TRL code.

Skipped, with the reason, when the pinned packages are not installed (``.ci/run`` installs
them).
"""

from __future__ import annotations

import pytest
import upstream


@pytest.fixture(scope="session")
def verl():
    """``(core_algos, rollout_corr_helper)`` of verl 0.9.1."""
    try:
        return upstream.verl_modules()
    except upstream.Missing as missing:
        pytest.skip(str(missing))


@pytest.fixture(scope="session")
def openrlhf_loss():
    """``openrlhf.models.loss`` of OpenRLHF 0.11.2."""
    try:
        return upstream.openrlhf_loss()
    except upstream.Missing as missing:
        pytest.skip(str(missing))


@pytest.fixture(scope="session")
def openrlhf_gae():
    """OpenRLHF 0.11.2's ``get_advantages_and_returns(values, rewards, action_mask, gamma,
    lambd)``."""
    try:
        return upstream.openrlhf_gae()
    except upstream.Missing as missing:
        pytest.skip(str(missing))


@pytest.fixture(scope="session")
def trl_grpo():
    """``trl.trainer.grpo_trainer.GRPOTrainer`` of TRL 1.16.0."""
    try:
        return upstream.trl_grpo_trainer()
    except upstream.Missing as missing:
        pytest.skip(str(missing))


@pytest.fixture(scope="session")
def vllm():
    """The ``vllm`` package of vLLM 0.33.0 (its output classes and output processor)."""
    try:
        return upstream.vllm_module()
    except upstream.Missing as missing:
        pytest.skip(str(missing))
