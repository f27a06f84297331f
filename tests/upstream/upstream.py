"""Import the numerics modules of the real verl 0.9.1 and OpenRLHF 0.11.2 without their runtimes
(and vLLM 0.33.0's output classes: :func:`vllm_module`).

The packages come from the package index, installed with ``pip install --no-deps`` together
with the small pure-Python packages their numerics modules import (``.ci/run`` does it; the
list is in ``docs/numerics.md``). Three heavy imports are replaced by minimal stubs, each
only when the real package is not installed, so the code under test is upstream's own:

* ``ray``: ``verl.protocol`` imports it and names ``ray.ObjectRef`` in an annotation;
* ``transformers`` (and ``transformers.modeling_outputs``): verl's utilities import a dozen
  class names, used in type hints and model loading, never by the numerics under test;
* ``deepspeed``: ``openrlhf.models.utils`` imports it for ``set_z3_leaf_modules`` only.

``openrlhf/models/__init__.py`` imports the actor model (peft, flash-attn, transformers);
``openrlhf.models.loss`` and ``openrlhf.models.utils`` are loaded from the installed package
directory without running that ``__init__``.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path

VERL_VERSION = "0.9.1"
TRL_VERSION = "1.16.0"
OPENRLHF_VERSION = "0.11.2"

_STUBS = {
    "ray": ["ObjectRef"],
    "transformers": [
        "AutoConfig",
        "AutoModel",
        "AutoModelForCausalLM",
        "AutoModelForImageTextToText",
        "AutoModelForSequenceClassification",
        "AutoModelForTokenClassification",
        "AutoModelForVision2Seq",
        "GenerationConfig",
        "MistralForSequenceClassification",
        "PreTrainedModel",
        "PreTrainedTokenizer",
        "PretrainedConfig",
    ],
    "transformers.modeling_outputs": ["CausalLMOutputWithPast"],
    "deepspeed": [],
}


class Missing(Exception):
    """An upstream package is not installed (at the pinned version)."""


def _stub(name: str) -> None:
    top = name.split(".")[0]
    if name in sys.modules:
        return
    loaded = sys.modules.get(top)
    if loaded is not None and not getattr(loaded, "_upstream_stub", False):
        return  # the real package is imported
    if loaded is None and importlib.util.find_spec(top) is not None:
        return  # the real package is installed
    module = types.ModuleType(name)
    module.__path__ = []  # a package, so that submodule stubs attach
    # a spec, so that a real package probing for it (transformers probes deepspeed with
    # importlib.util.find_spec) reads it as present but without a distribution
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module._upstream_stub = True  # type: ignore[attr-defined]
    for attribute in _STUBS[name]:
        setattr(module, attribute, type(attribute, (), {"__module__": name}))
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


def _require(distribution: str, version: str) -> None:
    try:
        found = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise Missing(
            f"{distribution} is not installed; the upstream lane needs "
            f"`pip install --no-deps {distribution}=={version}` (see .ci/run)"
        ) from None
    if found != version:
        raise Missing(
            f"{distribution} {found} is installed; the upstream lane is pinned to {version}"
        )


def verl_modules() -> tuple[types.ModuleType, types.ModuleType]:
    """``verl.trainer.ppo.core_algos`` and ``verl.trainer.ppo.rollout_corr_helper``."""
    _require("verl", VERL_VERSION)
    for name in _STUBS:
        _stub(name)
    try:
        core = importlib.import_module("verl.trainer.ppo.core_algos")
        helper = importlib.import_module("verl.trainer.ppo.rollout_corr_helper")
    except ModuleNotFoundError as error:
        raise Missing(f"verl's numerics need {error.name!r} (see .ci/run)") from error
    return core, helper


def openrlhf_loss() -> types.ModuleType:
    """``openrlhf.models.loss``, loaded without ``openrlhf/models/__init__.py``."""
    _require("openrlhf", OPENRLHF_VERSION)
    _stub("deepspeed")
    if "openrlhf.models.loss" in sys.modules:
        return sys.modules["openrlhf.models.loss"]
    root = importlib.import_module("openrlhf")
    package = types.ModuleType("openrlhf.models")
    package.__path__ = [str(Path(root.__file__).parent / "models")]
    sys.modules["openrlhf.models"] = package
    return importlib.import_module("openrlhf.models.loss")


def openrlhf_gae() -> Callable[..., typing.Any]:
    """``RemoteExperienceMaker.get_advantages_and_returns`` of OpenRLHF 0.11.2, compiled on
    its own from the installed ``openrlhf/trainer/ppo_utils/experience_maker.py``: that
    module imports Ray actor groups, vLLM and DeepSpeed, the method only torch (and never
    reads ``self``, which gets ``None``)."""
    _require("openrlhf", OPENRLHF_VERSION)
    import torch

    root = Path(importlib.import_module("openrlhf").__file__).parent
    path = root / "trainer" / "ppo_utils" / "experience_maker.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    (method,) = (
        node
        for cls in tree.body
        if isinstance(cls, ast.ClassDef) and cls.name == "RemoteExperienceMaker"
        for node in cls.body
        if isinstance(node, ast.FunctionDef) and node.name == "get_advantages_and_returns"
    )
    namespace: dict[str, typing.Any] = {"torch": torch, "Tuple": tuple}
    exec(compile(ast.Module(body=[method], type_ignores=[]), str(path), "exec"), namespace)
    return functools.partial(namespace["get_advantages_and_returns"], None)


def trl_grpo_trainer() -> type:
    """TRL's ``GRPOTrainer`` class (its ``_compute_loss`` is called on a stand-in trainer).

    TRL needs the real transformers, accelerate and datasets (``tests/realtrainer/
    requirements-trl.txt``); nothing is stubbed for it.
    """
    _require("trl", TRL_VERSION)
    try:
        module = importlib.import_module("trl.trainer.grpo_trainer")
    except ModuleNotFoundError as error:
        raise Missing(
            f"TRL needs {error.name!r} (pip install --no-deps -r "
            "tests/realtrainer/requirements-trl.txt)"
        ) from error
    return module.GRPOTrainer


VLLM_VERSION = "0.33.0"


def vllm_module() -> types.ModuleType:
    """The ``vllm`` package of vLLM 0.33.0, with ``vllm.outputs``, ``vllm.logprobs``,
    ``vllm.config.model`` and the engine's output processor imported.

    Installed with ``--no-deps`` beside torch 2.13.0+cpu in a folder of its own
    (``tests/upstream/requirements-vllm.txt``), which ``test_vllm_lane.py`` puts on the path
    of a subprocess: these modules import on CPU, the model runner and sampler do not
    (``vllm._C`` is CUDA-built). Importing ``vllm`` sets a few
    ``TORCHINDUCTOR_*`` / ``TRITON_*`` environment variables; they are put back, so that
    the tests sharing this process see the environment they started with.
    """
    try:
        _require("vllm", VLLM_VERSION)
    except Missing as missing:
        raise Missing(f"{missing}; tests/upstream/test_vllm_lane.py runs these tests") from None
    saved = dict(os.environ)
    try:
        for name in ("vllm.outputs", "vllm.logprobs", "vllm.config.model",
                     "vllm.v1.engine.output_processor"):  # fmt: skip
            importlib.import_module(name)
    except ModuleNotFoundError as error:
        raise Missing(
            f"vLLM's output classes need {error.name!r} (pip install --no-deps -r "
            "tests/upstream/requirements-vllm.txt)"
        ) from error
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return importlib.import_module("vllm")
