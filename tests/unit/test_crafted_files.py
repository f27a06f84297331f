"""Damaged or crafted golden files: a GoldenFormatError naming the file and the remedy, never more.

Files here are crafted by hand, like an attacker or a hand edit would, and most
are "re-signed": their checksum is recomputed so that they get past the
verification to the parsing code behind it. Whatever the file holds, loading
it raises GoldenFormatError (or loads), never another exception, and never
allocates more than the file's size can justify.
"""

from __future__ import annotations

import copy
import json
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xxhash
from hypothesis import HealthCheck, given, settings, strategies as st

from pytest_rollout_golden import store
from pytest_rollout_golden._internal.golden.golden import Golden
from pytest_rollout_golden._internal.results import Mode
from pytest_rollout_golden.errors import (
    GoldenError,
    GoldenFormatError,
    GoldenMismatch,
    UnsupportedValueError,
)
from pytest_rollout_golden.store import location

REMEDY = "--update-golden"
DEEP = 200_000


def assert_names_file_and_remedy(exc: pytest.ExceptionInfo[BaseException], path: Path) -> None:
    message = str(exc.value)
    assert str(path) in message, message
    assert REMEDY in message, message


# --------------------------------------------------------------------------- crafting


def write_safetensors(path: Path, header: Any, data: bytes = b"", *, sign: bool = True) -> Path:
    """A safetensors file with ``header`` (any JSON, or raw text), re-signed when possible."""
    if sign and isinstance(header, dict) and isinstance(header.get("__metadata__"), dict):
        metadata = {k: v for k, v in header["__metadata__"].items() if k != "prg.digest"}
        header = {**header, "__metadata__": metadata}
        hasher = xxhash.xxh3_128(store.canonical_header(header))
        hasher.update(data)
        header["__metadata__"] = {**metadata, "prg.digest": hasher.hexdigest()}
    blob = header.encode() if isinstance(header, str) else json.dumps(header).encode()
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + data)
    return path


def with_layout(layout: Any, tensors: dict[str, Any] | None = None) -> tuple[dict, bytes]:
    """Header and data of a file holding ``tensors`` (name -> float32 list) and ``layout``."""
    header: dict[str, Any] = {
        "__metadata__": {"prg.layout": layout if isinstance(layout, str) else json.dumps(layout)}
    }
    data = b""
    for name, values in (tensors or {}).items():
        raw = np.asarray(values, dtype="<f4").tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": [len(values)],
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    return header, data


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


ONE_F32 = {"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}

# name -> (header, data, signed)
SAFETENSORS_CASES: dict[str, tuple[Any, bytes, bool]] = {
    "header nested 200k deep": (f'{{"x": {nested(DEEP)}}}', b"", False),
    "header nested past the depth limit": (
        f'{{"x": {nested(store.MAX_JSON_DEPTH + 1)}}}',
        b"",
        False,
    ),
    "header is a list": ("[1, 2]", b"", False),
    "__metadata__ is a list": ({"__metadata__": [1, 2]}, b"", False),
    "__metadata__ value is a number": ({"__metadata__": {"prg.layout": 5}}, b"", False),
    "float data_offsets": (
        {"x": {"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4.0]}},
        b"\0" * 4,
        False,
    ),
    "boolean in a shape": (
        {"x": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}},
        b"\0",
        False,
    ),
    "entry is a string": ({"x": "F32"}, b"", False),
    "dtype is a list": (
        {"x": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}},
        b"\0" * 4,
        False,
    ),
    "65 dimensions": (
        {"x": {"dtype": "U8", "shape": [1] * 65, "data_offsets": [0, 1]}},
        b"\0",
        False,
    ),
    "empty tensor of astronomic extent": (
        {"x": {"dtype": "F32", "shape": [0, 2**40, 2**40], "data_offsets": [0, 0]}},
        b"",
        False,
    ),
    "NaN constant in the header": ('{"x": NaN}', b"", False),
    "layout is not JSON": (*with_layout("{not json", {"x": [1.0]}), True),
    "layout nested 200k deep": (*with_layout(nested(DEEP), {"x": [1.0]}), True),
    "layout nested past the depth limit": (
        *with_layout(nested(store.MAX_JSON_DEPTH + 1), {"x": [1.0]}),
        True,
    ),
    "layout numpy node without a key": (*with_layout({"t": "numpy"}, {"x": [1.0]}), True),
    "layout numpy key is a list": (*with_layout({"t": "numpy", "k": ["x"]}, {"x": [1.0]}), True),
    "layout names a missing tensor": (*with_layout({"t": "numpy", "k": "y"}, {"x": [1.0]}), True),
    "layout device is a number": (
        *with_layout({"t": "torch", "k": "x", "device": 0}, {"x": [1.0]}),
        True,
    ),
    "layout device cuda:-1": (
        *with_layout({"t": "torch", "k": "x", "device": "cuda:-1"}, {"x": [1.0]}),
        True,
    ),
    "layout class is a number": (
        *with_layout(
            {
                "t": "dataproto",
                "cls": 5,
                "batch": None,
                "non_tensor_batch": {"t": "dict", "items": []},
                "meta_info": {"t": "dict", "items": []},
            }
        ),
        True,
    ),
    "layout dtype is not a numpy dtype": (
        *with_layout({"t": "ndarray", "dtype": "no-such", "shape": [1], "v": ["a"]}),
        True,
    ),
    "layout value overflows its dtype": (
        *with_layout({"t": "npscalar", "dtype": "<i1", "v": 100_000}),
        True,
    ),
    "layout ndarray of <U500000000": (
        *with_layout({"t": "ndarray", "dtype": "<U500000000", "shape": [8], "v": ["a"] * 8}),
        True,
    ),
    "layout npscalar of <U500000000": (
        *with_layout({"t": "npscalar", "dtype": "<U500000000", "v": "a"}),
        True,
    ),
}


@pytest.mark.parametrize("case", SAFETENSORS_CASES)
def test_crafted_safetensors_file_is_a_format_error(tmp_path, case):
    header, data, signed = SAFETENSORS_CASES[case]
    path = write_safetensors(tmp_path / "crafted.safetensors", header, data, sign=signed)
    tracemalloc.start()
    try:
        with pytest.raises(GoldenFormatError) as exc:
            store.load_batch(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert_names_file_and_remedy(exc, path)
    # numpy and torch report their buffers to tracemalloc: nothing big was allocated
    assert peak < 64 * path.stat().st_size + (64 << 20), f"peak {peak} B for {case}"


def test_signed_crafting_reaches_the_parser(tmp_path):
    """Control: the crafting helper signs correctly, so the cases above get past the checksum."""
    header, data = with_layout(
        {"t": "dict", "items": [["a", {"t": "torch", "k": "x"}]]}, {"x": [2]}
    )
    path = write_safetensors(tmp_path / "signed.safetensors", header, data)
    assert store.load_batch(path)["a"].tolist() == [2.0]


def test_allocation_is_bounded_by_the_file_size_not_refused_below_it(tmp_path):
    """A legitimately padded string array still loads: the bound scales with the file."""
    value = {"s": np.array(["a", "b" * 300], dtype="<U300")}
    path = tmp_path / "strings.safetensors"
    store.save_batch(path, value)
    back = store.load_batch(path)
    assert back["s"].dtype == np.dtype("<U300") and back["s"].tolist() == ["a", "b" * 300]


def test_recording_a_batch_too_deep_to_read_back_is_refused(tmp_path):
    deep: Any = 1
    for _ in range(store.MAX_JSON_DEPTH):
        deep = [deep]
    with pytest.raises(UnsupportedValueError, match="nests more than"):
        store.save_batch(tmp_path / "deep.safetensors", {"x": deep})
    assert not (tmp_path / "deep.safetensors").exists()


# --------------------------------------------------------------------------- manifests


def manifest_with(**files: Any) -> dict[str, Any]:
    return {"format": store.FORMAT, "schema": store.SCHEMA, "files": files}


DIGEST = "0" * 32
OURS = f'"format": "{store.FORMAT}", "schema": {store.SCHEMA}'
MANIFEST_CASES: dict[str, Any] = {
    "entry without digest": manifest_with(**{"metrics.json": {"kind": "metrics"}}),
    "entry is a string": manifest_with(**{"metrics.json": "abc"}),
    "digest is a number": manifest_with(**{"metrics.json": {"digest": 5}}),
    "digest is empty": manifest_with(**{"metrics.json": {"digest": ""}}),
    "file name leaves the golden": manifest_with(**{"../x.json": {"digest": DIGEST}}),
    "file name is the manifest": manifest_with(**{"manifest.json": {"digest": DIGEST}}),
    "step is a boolean": manifest_with(
        **{"r.safetensors": {"kind": "rollout", "name": "r", "step": True, "digest": DIGEST}}
    ),
    "step is a string": manifest_with(
        **{"r.safetensors": {"kind": "rollout", "name": "r", "step": "0", "digest": DIGEST}}
    ),
    "rollout without name": manifest_with(
        **{"r.safetensors": {"kind": "rollout", "step": 0, "digest": DIGEST}}
    ),
    "fingerprint is a list": {**manifest_with(), "fingerprint": [1]},
    "nested 200k deep": "{" + OURS + f', "x": {nested(DEEP)}}}',
    "Infinity constant": "{" + OURS + ', "files": {}, "x": Infinity}',
}


@pytest.mark.parametrize("case", MANIFEST_CASES)
def test_crafted_manifest_is_a_format_error(tmp_path, case):
    content = MANIFEST_CASES[case]
    path = tmp_path / location.MANIFEST
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(GoldenFormatError) as exc:
        store.read_manifest(tmp_path)
    assert_names_file_and_remedy(exc, path)


# --------------------------------------------------------------------------- metrics.json


def record(directory: Path, metrics: dict[str, Any] | None = None) -> None:
    assert replay(directory, Mode.AUTO, metrics).status == "recorded"


def rewrite_signed(directory: Path, filename: str, text: str) -> None:
    """Replace ``filename`` by ``text`` and re-sign it in the manifest (a careful hand edit)."""
    (directory / filename).write_text(text)
    manifest_path = directory / location.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][filename]["digest"] = store.json_digest(text.encode())
    manifest_path.write_text(json.dumps(manifest))


def replay(directory: Path, mode: Mode = Mode.AUTO, metrics: dict[str, Any] | None = None) -> Any:
    golden = Golden(directory, mode=mode)
    try:
        golden.rollout(lambda: {"x": torch.arange(4.0)})
        golden.check(metrics or {"pg_loss": 0.5, "kl": torch.tensor(0.25)})
    except BaseException:
        golden.finish(error=True)  # as the plugin does: releases the golden's lock
        raise
    return golden.finish()


METRICS_CASES = {
    "value is the string NaN": '{"steps": {"0": {"pg_loss": "NaN", "kl": 0.25}}}',
    "extra Infinity": '{"steps": {"0": {"pg_loss": 0.5, "kl": 0.25, "x": Infinity}}}',
    "NaN constant": '{"steps": {"0": {"pg_loss": NaN, "kl": 0.25}}}',
    "step key step0": '{"steps": {"step0": {"pg_loss": 0.5, "kl": 0.25}}}',
    "step key 00": '{"steps": {"00": {"pg_loss": 0.5, "kl": 0.25}}}',
    "steps is a list": '{"steps": [{"pg_loss": 0.5}]}',
    "step is a list": '{"steps": {"0": [0.5]}}',
    "value is a list": '{"steps": {"0": {"pg_loss": [0.5], "kl": 0.25}}}',
    "value is null": '{"steps": {"0": {"pg_loss": null, "kl": 0.25}}}',
    "unknown dtype": '{"steps": {"0": {"pg_loss": {"dtype": "float128", "value": 0.5}}}}',
    "dtype torch lacks": '{"steps": {"0": {"pg_loss": {"dtype": "float8_e9", "value": 0.5}}}}',
    "value overflows its dtype": '{"steps": {"0": {"pg_loss": {"dtype": "int8", "value": 999}}}}',
    "shape does not match values": (
        '{"steps": {"0": {"pg_loss": {"dtype": "float32", "shape": [3], "values": [1.0]}}}}'
    ),
    "bare integer beyond int64": '{"steps": {"0": {"pg_loss": 18446744073709551615}}}',
    "nested 200k deep": '{"steps": {"0": {"pg_loss": ' + nested(DEEP) + "}}}",
}


@pytest.mark.parametrize("case", METRICS_CASES)
def test_crafted_metrics_json_fails_and_update_repairs_it(tmp_path, case):
    directory = tmp_path / "golden"
    record(directory)
    rewrite_signed(directory, "metrics.json", METRICS_CASES[case])
    path = directory / "metrics.json"
    with pytest.raises(GoldenFormatError) as exc:
        replay(directory)
    assert_names_file_and_remedy(exc, path)

    assert replay(directory, Mode.UPDATE).status == "updated"
    assert json.loads(path.read_text()) == {
        "steps": {"0": {"pg_loss": 0.5, "kl": {"dtype": "float32", "value": 0.25}}}
    }
    assert replay(directory, Mode.STRICT).status == "replayed"


def test_format_error_names_the_step_and_metric(tmp_path):
    directory = tmp_path / "golden"
    record(directory)
    rewrite_signed(directory, "metrics.json", METRICS_CASES["value is the string NaN"])
    with pytest.raises(GoldenFormatError, match=r"step 0, metric 'pg_loss'"):
        replay(directory)


@pytest.mark.parametrize("case", ["entry without digest", "entry is a string"])
def test_update_golden_repairs_a_crafted_manifest(tmp_path, case):
    directory = tmp_path / "golden"
    record(directory)
    manifest = json.loads((directory / location.MANIFEST).read_text())
    manifest["files"]["metrics.json"] = MANIFEST_CASES[case]["files"]["metrics.json"]
    (directory / location.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(GoldenFormatError) as exc:
        replay(directory)
    assert_names_file_and_remedy(exc, directory / location.MANIFEST)
    assert replay(directory, Mode.UPDATE).status == "recorded"
    assert replay(directory, Mode.STRICT).status == "replayed"


# --------------------------------------------------------------------------- random edits

WORDS = [
    "",
    "nan",
    "inf",
    "NaN",
    "x",
    "0",
    "-1",
    "F32",
    "I64",
    "float32",
    "<U9",
    "<i1",
    "O",
    "numpy",
    "torch",
    "ndarray",
    "npscalar",
    "bytes",
    "tuple",
    "dict",
    "float",
    "dataproto",
    "tensordict",
    "cuda:0",
    "cuda:x",
    "ids",
    "arr",
    "value",
]
JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(WORDS),
)
JSON_VALUE = st.recursive(
    JSON_LEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)


def _containers(value: Any, path: tuple = ()) -> list[tuple]:
    """Paths of every dict/list inside ``value``."""
    out = []
    if isinstance(value, (dict, list)):
        out.append(path)
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            out.extend(_containers(v, (*path, k)))
    return out


@st.composite
def edited(draw: st.DrawFn, original: Any) -> Any:
    """``original`` after 1-3 structural edits: replace, delete, insert or wrap a node."""
    value = copy.deepcopy(original)
    for _ in range(draw(st.integers(1, 3))):
        paths = _containers(value)
        path = draw(st.sampled_from(paths))
        parent: Any = value
        for k in path:
            parent = parent[k]
        keys = list(parent.keys()) if isinstance(parent, dict) else list(range(len(parent)))
        action = draw(st.sampled_from(["replace", "delete", "insert", "wrap"]))
        if action == "insert" or not keys:
            if isinstance(parent, dict):
                parent[draw(st.sampled_from([*keys, "t", "k", "dtype", "x", "0"]))] = draw(
                    JSON_VALUE
                )
            else:
                parent.append(draw(JSON_VALUE))
            continue
        key = draw(st.sampled_from(keys))
        if action == "replace":
            parent[key] = draw(JSON_VALUE)
        elif action == "delete":
            del parent[key]
        else:
            parent[key] = draw(st.sampled_from([[parent[key]], {"t": parent[key]}]))
    return value


def _valid_batch_file(path: Path) -> None:
    store.save_batch(
        path,
        {
            "ids": torch.arange(3),
            "arr": np.arange(2, dtype=np.float32),
            "uid": np.array(["a", "bc"], dtype=object),
            "s": np.str_("x"),
            "t": (1, 2.5, b"z"),
        },
    )


def _read_header(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FUZZ
@given(data=st.data())
def test_random_edits_of_a_safetensors_header_and_layout(tmp_path, data):
    original = tmp_path / "valid.safetensors"
    if not original.exists():
        _valid_batch_file(original)
    header, payload = _read_header(original)
    layout = json.loads(header["__metadata__"]["prg.layout"])
    if data.draw(st.booleans(), label="edit the layout"):
        header["__metadata__"]["prg.layout"] = json.dumps(data.draw(edited(layout)))
    else:
        header = data.draw(edited(header))
    path = write_safetensors(tmp_path / "edited.safetensors", header, payload)
    try:
        store.load_batch(path)
    except GoldenFormatError as exc:
        assert str(path) in str(exc) and REMEDY in str(exc)


@FUZZ
@given(data=st.data())
def test_random_edits_of_a_manifest_and_metrics(tmp_path_factory, data):
    directory = tmp_path_factory.mktemp("golden")
    record(directory, {"pg_loss": 0.5, "v": torch.tensor([1.0, 2.0]), "n": np.int8(3)})
    target = data.draw(st.sampled_from([location.MANIFEST, "metrics.json"]))
    document = json.loads((directory / target).read_text())
    text = json.dumps(data.draw(edited(document)))
    if target == location.MANIFEST:
        (directory / target).write_text(text)
    else:
        rewrite_signed(directory, target, text)
    metrics = {"pg_loss": 0.5, "v": torch.tensor([1.0, 2.0]), "n": np.int8(3)}
    for mode in (Mode.AUTO, Mode.STRICT):
        try:
            replay(directory, mode, metrics)
        except GoldenFormatError as exc:
            assert REMEDY in str(exc)
        except (GoldenError, GoldenMismatch):  # a missing recording or a drift: no crash
            pass
    replay(directory, Mode.UPDATE, metrics)  # the remedy always works
    assert replay(directory, Mode.STRICT, metrics).status == "replayed"


# --------------------------------------------------------------------------- metric values


@pytest.mark.filterwarnings("ignore:Sparse CSR:UserWarning", "ignore:torch.quantize:UserWarning")
def test_rejected_metric_values_name_the_metric(tmp_path):
    cases = {
        "sparse": torch.eye(2).to_sparse(),
        "csr": torch.eye(2).to_sparse_csr(),
        "quantized": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8),
        "long_double": np.longdouble(0.5),
        "long_double_array": np.ones(2, dtype=np.longdouble),
    }
    for name, value in cases.items():
        golden = Golden(tmp_path / name)
        with pytest.raises(UnsupportedValueError, match=rf"metric '{name}' at step 0"):
            golden.check({name: value})
        golden.finish(error=True)


def test_a_metric_name_must_be_a_string(tmp_path):
    golden = Golden(tmp_path / "g", mode=Mode.AUTO)
    with pytest.raises(UnsupportedValueError, match=r"metric 1 at step 0: a metric name must"):
        golden.check({1: 0.5})
    golden.finish(error=True)


def test_bad_seeds_are_usage_errors(project):
    project.write(
        """
import pytest


def test_a(deterministic):
    pass
"""
    )
    project.pytester.makeini("[pytest]\ngolden_seed = -1\n")
    result = project.run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini golden_seed must be an integer in [[]0, 2**32), got '-1'*"])


@pytest.mark.parametrize("seed", ['"abc"', "-1", "2**32", "1.5", "None"])
def test_bad_marker_seed_errors_each_test_that_has_it(project, seed):
    project.write(
        f"""
import pytest


@pytest.mark.golden(seed={seed})
def test_a(golden, deterministic):
    golden.check({{"x": 1.0}})


@pytest.mark.golden(seed={seed})
def test_b(deterministic):
    pass


def test_c():
    pass
"""
    )
    result = project.run()
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines(
        ["*test_it.py::test_a: @pytest.mark.golden: seed= must be an integer in [[]0, 2**32)*"]
    )
    out = result.stdout.str() + result.stderr.str()
    assert "KeyError" not in out
    assert not project.golden.exists()


def test_bad_marker_seed_under_xdist_errors_each_test_without_teardown_noise(project):
    project.write(
        """
import pytest


@pytest.mark.golden(seed="abc")
def test_a(golden):
    golden.check({"x": 1.0})


def test_b():
    pass
"""
    )
    result = project.run_subprocess("-n", "2")
    result.assert_outcomes(passed=1, errors=1)
    out = result.stdout.str()
    assert "test_it.py::test_a: @pytest.mark.golden: seed= must be an integer in [0, 2**32)" in out
    assert "KeyError" not in out
    assert not project.golden.exists()


# --------------------------------------------------------------------------- through pytest

TRAIN = """
import torch


def test_train(golden, generated):
    batch = golden.rollout(lambda: generated("rollout", {"x": torch.linspace(0, 1, 8)}))
    golden.check({"pg_loss": float(batch["x"].sum()), "kl": 0.125})
"""


@pytest.mark.parametrize("damage", ["metrics NaN", "manifest entry without digest", "layout"])
def test_crafted_golden_fails_with_the_remedy_and_update_repairs_it(project, damage):
    project.write(TRAIN)
    project.run().assert_outcomes(passed=1)
    assert project.calls() == ["rollout"]
    directory = project.golden_dir("test_train")
    if damage == "metrics NaN":
        damaged = directory / "metrics.json"
        rewrite_signed(directory, "metrics.json", '{"steps": {"0": {"pg_loss": "NaN", "kl": 1}}}')
    elif damage == "manifest entry without digest":
        damaged = directory / location.MANIFEST
        manifest = json.loads(damaged.read_text())
        del manifest["files"]["metrics.json"]["digest"]
        damaged.write_text(json.dumps(manifest))
    else:
        damaged = directory / "rollout-rollout-step000000.safetensors"
        header, payload = _read_header(damaged)
        header["__metadata__"]["prg.layout"] = nested(DEEP)
        write_safetensors(damaged, header, payload)
        manifest_path = directory / location.MANIFEST
        manifest = json.loads(manifest_path.read_text())
        digest = _read_header(damaged)[0]["__metadata__"]["prg.digest"]
        manifest["files"][damaged.name]["digest"] = digest  # re-signed in the manifest too
        manifest_path.write_text(json.dumps(manifest))

    result = project.run()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "GoldenFormatError" in out and f"golden/test_it/test_train/{damaged.name}" in out
    assert "run `pytest --update-golden` locally" in out
    assert "RecursionError" not in out and "KeyError" not in out
    assert project.calls() == [], "a damaged golden must not be silently re-recorded"
    assert project.counts(result)["failed"] == 1

    updated = project.run("--update-golden")
    updated.assert_outcomes(passed=1)
    # The rollout is an input: kept unless it (or the manifest listing it) is the damage.
    assert project.calls() == ([] if damage == "metrics NaN" else ["rollout"])
    assert project.counts(updated)["failed"] == 0
    project.run("--golden-strict").assert_outcomes(passed=1)
    assert project.calls() == []


@pytest.mark.parametrize("verb", ["show", "diff"])
def test_cli_reports_a_crafted_metrics_json_by_file_step_and_metric(tmp_path, capsys, verb):
    from pytest_rollout_golden.cli import main

    directory = tmp_path / "a" / "g"
    record(directory)
    rewrite_signed(directory, "metrics.json", METRICS_CASES["value is the string NaN"])
    args = [str(directory)] if verb == "show" else [str(tmp_path / "a"), str(tmp_path / "a")]
    assert main([verb, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"{directory / 'metrics.json'}: step 0" in err
    assert "metric 'pg_loss'" in err and REMEDY in err
