"""``rollout-golden``: verify, show and diff goldens outside pytest.

    rollout-golden verify [PATH ...]          check every checksum (exit 1 on any problem)
    rollout-golden show PATH                  a golden directory or one .safetensors file
    rollout-golden diff A B [--tolerance ...] compare two goldens or batch files (exit 1 on drift)

``diff`` uses the same comparison and tolerance rules as the plugin, so it is
the gate for dumps two runs wrote with :func:`~pytest_rollout_golden.save_batch`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from . import store
from .errors import GoldenError
from .location import find_goldens
from .tolerance import Layer, Resolver, builtin_layer, parse_spec


def _golden_dirs(paths: Sequence[Path]) -> Iterator[Path]:
    for path in paths:
        yield from find_goldens(path)


def _load_dir(directory: Path) -> dict[str, Any]:
    """Every file of a golden, verified: ``{filename: loaded content}``."""
    manifest = store.read_manifest(directory)
    if manifest is None:
        raise GoldenError(f"{directory}: no {store.MANIFEST}; not a golden directory")
    out = {}
    for filename, info in manifest["files"].items():
        path = directory / filename
        if not path.is_file():
            raise GoldenError(f"{path}: listed in {store.MANIFEST} but missing")
        if filename.endswith(".json"):
            out[filename] = store.read_json(path, expect_digest=info["digest"])
        else:
            out[filename] = store.load_batch(path, expect_digest=info["digest"])
    return out


def verify(paths: Sequence[Path]) -> int:
    problems = checked = 0
    for directory in _golden_dirs(paths):
        checked += 1
        try:
            files = _load_dir(directory)
        except GoldenError as exc:
            problems += 1
            print(f"FAIL {directory}: {exc}")
        else:
            print(f"ok   {directory} ({len(files)} files)")
    print(f"{checked} goldens checked, {problems} with problems")
    return 1 if problems or not checked else 0


def show(path: Path) -> int:
    if path.is_file():
        arrays, metadata = store.read_safetensors(path)
        for name, array in arrays.items():
            print(f"{name}: {str(array.dtype).removeprefix('torch.')}{list(array.shape)}")
        if "prg.layout" in metadata:
            print("layout:", metadata["prg.layout"][:2000])
        return 0
    manifest = store.read_manifest(path)
    if manifest is None:
        print(f"{path}: not a golden directory", file=sys.stderr)
        return 1
    print(f"golden {path} (test {manifest.get('test')})")
    print("fingerprint:", json.dumps(manifest.get("fingerprint")))
    files = _load_dir(path)
    for filename, content in files.items():
        if filename == "metrics.json":
            for step, metrics in content["steps"].items():
                for name, value in metrics.items():
                    print(f"  step {step:>4}  {name:<32} {json.dumps(value)[:100]}")
        else:
            info = manifest["files"][filename]
            print(
                f"  {filename}  ({info.get('kind')} {info.get('name')!r} step {info.get('step')})"
            )
    return 0


def diff(a: Path, b: Path, resolver: Resolver) -> int:
    """Compare golden ``b`` (or batch file) against ``a``; print the mismatches."""
    from . import codec
    from . import metrics as metric_codec
    from .compare import compare_named

    if a.is_file() and b.is_file():
        left = {a.name: store.load_batch(a)}
        right = {a.name: store.load_batch(b)}
    else:
        left, right = _load_dir(a), _load_dir(b)
    rows, failures = [], 0

    def record(label: str, ok: bool, text: str) -> None:
        nonlocal failures
        failures += not ok
        rows.append(f"{'ok  ' if ok else 'FAIL'} {label}: {text}")

    for filename in sorted(left.keys() | right.keys()):
        if filename not in left or filename not in right:
            record(filename, False, f"only in {a if filename in left else b}")
            continue
        if filename == "metrics.json":
            steps_a, steps_b = left[filename]["steps"], right[filename]["steps"]
            for step in sorted(steps_a.keys() | steps_b.keys(), key=int):
                ma, mb = steps_a.get(step, {}), steps_b.get(step, {})
                for name in sorted(ma.keys() | mb.keys()):
                    label = f"{name} step {step}"
                    if name not in ma or name not in mb:
                        record(label, False, f"only in {a if name in ma else b}")
                        continue
                    ea = metric_codec.decode(ma[name], where=label)
                    eb = metric_codec.decode(mb[name], where=label)
                    d, tol, _ = compare_named(name, ea, eb, resolver, check_dtype=False)
                    record(
                        label,
                        d.ok,
                        f"abs {d.abs_diff:.3g} rel {d.rel_diff:.3g} "
                        f"({tol.describe()}) {d.detail}".rstrip(),
                    )
            continue
        arrays_a, layout_a = codec.flatten(left[filename])
        arrays_b, layout_b = codec.flatten(right[filename])
        if layout_a != layout_b:
            record(filename, False, "structure or non-tensor values differ")
            continue
        for key in arrays_a:
            label = f"{filename}:{key}"
            d, tol, _ = compare_named(key, arrays_a[key], arrays_b[key], resolver, check_dtype=True)
            record(
                label,
                d.ok,
                f"abs {d.abs_diff:.3g} rel {d.rel_diff:.3g} ({tol.describe()})"
                + (("\n    " + d.detail.replace("\n", "\n    ")) if d.detail else ""),
            )
    for row in rows:
        print(row)
    print(f"{len(rows)} compared, {failures} differ beyond tolerance")
    return 1 if failures else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rollout-golden", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_verify = sub.add_parser("verify", help="check every checksum of every golden under PATHs")
    p_verify.add_argument("paths", nargs="*", type=Path, default=[Path("golden")])
    p_show = sub.add_parser("show", help="print a golden directory or a .safetensors batch")
    p_show.add_argument("path", type=Path)
    p_diff = sub.add_parser("diff", help="compare B against A with the plugin's tolerances")
    p_diff.add_argument("a", type=Path)
    p_diff.add_argument("b", type=Path)
    p_diff.add_argument("--tolerance", action="append", default=[], metavar="M:rtol=R,atol=A")
    p_diff.add_argument("--exact", action="store_true", help="demand bit equality")
    args = parser.parse_args(argv)
    try:
        if args.command == "verify":
            return verify(args.paths)
        if args.command == "show":
            return show(args.path)
        try:
            layer = Layer("--tolerance", dict(parse_spec(s) for s in args.tolerance))
        except ValueError as exc:
            parser.error(str(exc))
        return diff(args.a, args.b, Resolver([layer, builtin_layer()], exact=args.exact))
    except (GoldenError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
