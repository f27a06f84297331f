"""Deterministic settings for replay, and the environment fingerprint a golden records."""

from __future__ import annotations

import contextlib
import os
import platform
import random
import sys
import warnings
from collections.abc import Iterator
from typing import Any

DETERMINISTIC_ENV = {
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "NCCL_ALGO": "Ring",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
    # Read by torch._inductor.config when it is first imported: a test that compiles
    # gets inductor's deterministic mode without every test paying that import.
    "TORCHINDUCTOR_DETERMINISTIC": "1",
}
_INDUCTOR_CONFIG = "torch._inductor.config"


@contextlib.contextmanager
def deterministic(seed: int = 0, *, warn_only: bool = False) -> Iterator[int]:
    """Seed every RNG and switch on deterministic algorithms; restore everything on exit.

    Seeds Python's ``random``, numpy and torch (all CUDA devices too), calls
    ``torch.use_deterministic_algorithms(True, warn_only=warn_only)``, sets
    cuDNN deterministic and non-benchmark, and exports ``CUBLAS_WORKSPACE_CONFIG``,
    ``NCCL_ALGO=Ring`` and ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``. Enter it before
    the model and the process groups are built: libraries such as Transformer
    Engine and NCCL read their variables once. Inductor's ``deterministic`` setting
    is applied too, without importing inductor when nothing uses it.
    """
    import numpy as np
    import torch

    saved_env = {k: os.environ.get(k) for k in DETERMINISTIC_ENV}
    if (
        "transformer_engine" in sys.modules
        and os.environ.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO") != "0"
    ):
        warnings.warn(
            "transformer_engine was imported before deterministic() set "
            "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 and may have read it already; export it "
            "before importing transformer_engine",
            stacklevel=3,
        )
    py_state, np_state = random.getstate(), np.random.get_state()
    torch_state = torch.random.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    algorithms = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    try:
        os.environ.update(DETERMINISTIC_ENV)
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)  # seeds every CUDA device as well
        _set_deterministic_algorithms(torch, True, warn_only)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        yield seed
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.random.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        _set_deterministic_algorithms(torch, algorithms[0], algorithms[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


def _set_deterministic_algorithms(torch: Any, mode: bool, warn_only: bool) -> None:
    """``torch.use_deterministic_algorithms`` minus its import of inductor (~1 s).

    If inductor is loaded, its setting follows ``mode`` as torch would set it;
    if not, ``TORCHINDUCTOR_DETERMINISTIC`` (exported by :func:`deterministic`)
    sets it when inductor is first imported.
    """
    inductor_config = sys.modules.get(_INDUCTOR_CONFIG)
    if inductor_config is not None:
        inductor_config.deterministic = mode
    torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)


def fingerprint() -> dict[str, Any]:
    """What the numbers of a run depend on besides the code: versions, device, flags."""
    import torch

    cuda = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "device": torch.cuda.get_device_name() if cuda else f"cpu ({platform.machine()})",
        "cpu_threads": torch.get_num_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "platform": f"{platform.system()}-{platform.machine()}",
        **_accelerator(cuda),
    }


def _accelerator(cuda: bool) -> dict[str, Any]:
    """The accelerator's architecture, which decides a golden's lane (:mod:`.lanes`): the
    compute capability of a CUDA device, the gfx architecture of a ROCm one."""
    if not cuda:
        return {}
    import torch

    if torch.version.hip:
        arch = torch.cuda.get_device_properties(0).gcnArchName
        return {"hip": torch.version.hip, "gpu_arch": arch}
    return {"capability": "{}.{}".format(*torch.cuda.get_device_capability())}


def fingerprint_changes(recorded: dict[str, Any] | None, current: dict[str, Any]) -> list[str]:
    """Human lines for every fingerprint field that differs, e.g. ``torch: 2.3.0 -> 2.4.0``.

    A field the recorded fingerprint does not hold (it was added to fingerprints after the
    recording) is not a change: nothing says it differed."""
    if not recorded:
        return []
    keys = list(recorded)
    return [
        f"{k}: {recorded.get(k)} -> {current.get(k)}"
        for k in keys
        if recorded.get(k) != current.get(k)
    ]
