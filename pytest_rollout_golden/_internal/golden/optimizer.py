"""Optimizer state by parameter name: what ``golden.check_optimizer`` records and compares.

torch.optim keys its state by parameter object (``optimizer.state``) or by position
(``optimizer.state_dict()``); a golden keys it by the parameter's name in the model, so
that a failure names ``policy.layers.0.weight/exp_avg`` and a recording does not depend on
the order the optimizer was given its parameters in. DTensor state (FSDP2) is gathered to
full tensors: a collective, so every rank of the mesh calls :func:`optimizer_state`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

MASTER_WEIGHT = "master_weight"  # the entry of fp32 master weights given as master_weights=


def optimizer_state(
    optimizer: Any,
    model: Any = None,
    *,
    master_weights: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """The optimizer's state as ``{parameter name: {entry: full tensor}}``, entries sorted.

    ``optimizer``: a ``torch.optim.Optimizer``; its ``state_dict()`` (integer keys, named
    through ``param_groups[i]["param_names"]`` where the optimizer was built from
    ``named_parameters()``, else through ``model``; or parameter names as keys, as
    ``torch.distributed.checkpoint``'s ``get_optimizer_state_dict`` writes them); or a
    mapping ``{parameter name: {entry: value}}`` already named. ``model``: the module whose
    parameters the optimizer updates, or ``(name, parameter)`` pairs (a mapping or an
    iterable such as ``named_parameters()``: pass the fp32 master copies by name where the
    optimizer holds those). An integer-keyed state dict is named in ``named_parameters()``
    order, the order ``Adam(model.parameters())`` numbers them in. ``master_weights``:
    ``{parameter name: fp32 tensor}`` kept outside the optimizer, added as the entry
    ``master_weight``.

    The tensors are copies, taken now (the optimizer updates its state in place). Entries
    holding ``None`` (SGD without momentum) are left out; numbers become 0-d tensors;
    DTensors are gathered (``full_tensor()``), so that every layout records the same
    tensors. Raises TypeError or ValueError naming what cannot be named.
    """
    if isinstance(optimizer, Mapping) and {"state", "param_groups"} <= optimizer.keys():
        named = _from_state_dict(optimizer, model)
    elif isinstance(optimizer, Mapping):
        named = _from_named(optimizer)
    elif hasattr(optimizer, "state") and hasattr(optimizer, "param_groups"):
        named = _from_optimizer(optimizer, model)
    else:
        raise TypeError(
            "optimizer state: expected a torch.optim optimizer, its state_dict() or a mapping "
            f"{{parameter name: {{entry: tensor}}}}, got {type(optimizer).__name__}"
        )
    for name, weight in (master_weights or {}).items():
        named.setdefault(str(name), {})[MASTER_WEIGHT] = weight
    return {
        name: {
            entry: _full(value, f"{name}/{entry}")
            for entry, value in sorted(entries.items())
            if value is not None
        }
        for name, entries in named.items()
    }


def flat(state: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``{"<parameter>/<entry>": tensor}``: the tensors of one ``check_optimizer`` call."""
    return {
        f"{name}/{entry}": value
        for name, entries in state.items()
        for entry, value in entries.items()
    }


def _from_optimizer(optimizer: Any, model: Any) -> dict[str, dict[str, Any]]:
    """The state of a live optimizer, named by parameter identity."""
    groups = optimizer.param_groups
    if model is None:
        if all("param_names" in g for g in groups):
            return {
                name: dict(optimizer.state.get(p, {}))
                for g in groups
                for name, p in zip(g["param_names"], g["params"], strict=True)
            }
        raise TypeError(
            "optimizer state: pass model= (the module whose parameters the optimizer updates): "
            "torch.optim keys its state by parameter, not by name"
        )
    names = {id(p): name for name, p in _named_parameters(model)}
    out = {}
    for index, p in enumerate(p for g in groups for p in g["params"]):
        if id(p) not in names:
            raise ValueError(
                f"optimizer state: parameter #{index} of the optimizer (shape "
                f"{tuple(p.shape)}) is not among model='s parameters; pass the module the "
                "optimizer updates, or its (name, parameter) pairs (fp32 master copies: "
                "model={name: master parameter})"
            )
        out[names[id(p)]] = dict(optimizer.state.get(p, {}))
    return out


def _from_state_dict(state_dict: Mapping[str, Any], model: Any) -> dict[str, dict[str, Any]]:
    """The state of an ``optimizer.state_dict()``, its keys named."""
    state = state_dict["state"]
    if all(isinstance(k, str) for k in state):
        return {k: dict(v) for k, v in state.items()}
    groups = state_dict["param_groups"]
    ids = [i for g in groups for i in g["params"]]
    if all("param_names" in g for g in groups):
        names = [n for g in groups for n in g["param_names"]]
    elif model is None:
        raise TypeError(
            "optimizer state: a state_dict() keyed by position needs model= to name its "
            "parameters (or an optimizer built from model.named_parameters())"
        )
    else:
        names = [name for name, _ in _named_parameters(model)]
        if len(names) != len(ids):
            raise ValueError(
                f"optimizer state: the state_dict() numbers {len(ids)} parameters, model= has "
                f"{len(names)}; pass the optimizer itself (it is named by parameter identity)"
            )
    by_id = dict(zip(ids, names, strict=True))
    return {by_id[i]: dict(state.get(i, {})) for i in ids}


def _from_named(named: Mapping[Any, Any]) -> dict[str, dict[str, Any]]:
    """An already named state, checked."""
    out = {}
    for name, entries in named.items():
        if not isinstance(name, str) or not isinstance(entries, Mapping):
            raise TypeError(
                "optimizer state: a named state maps each parameter name to {entry: tensor}; "
                f"got {name!r}: {type(entries).__name__}"
            )
        out[name] = dict(entries)
    return out


def _named_parameters(model: Any) -> Iterable[tuple[str, Any]]:
    if hasattr(model, "named_parameters"):
        return model.named_parameters()
    return model.items() if isinstance(model, Mapping) else model


def _full(value: Any, label: str) -> Any:
    """A copy of ``value`` as a whole tensor (the optimizer updates its state in place):
    a DTensor gathered, a number as a 0-d tensor."""
    import torch

    if isinstance(value, (bool, int, float)):
        return torch.tensor(value)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"optimizer state {label!r}: expected a tensor or a number, got {value!r}")
    full_tensor = getattr(value, "full_tensor", None)  # a DTensor
    return full_tensor().detach() if callable(full_tensor) else value.detach().clone()
