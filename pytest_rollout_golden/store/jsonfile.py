"""JSON files of a golden: deterministic, diff-friendly writing and strict reading.

Reading refuses ``NaN``/``Infinity``, nesting deeper than :data:`MAX_JSON_DEPTH`, and a
checksum that differs from the one the manifest lists.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .disk import checksum, format_error, read_bytes, refuse_lfs_pointer, sniff_foreign
from .location import MANIFEST

MAX_JSON_DEPTH = 128  # deeper nesting in a golden file is refused (recorded batches nest far less)
CONTAINERS = (dict, list)  # the container types json.loads builds


def encode_json(obj: Any, *, indent: int | None = 2) -> bytes:
    """Deterministic, diff-friendly JSON; floats round-trip exactly (non-finite are rejected).
    ``indent=None``: on one line, where size matters more than a diff (a history's runs)."""
    return (json.dumps(obj, indent=indent, sort_keys=False, allow_nan=False) + "\n").encode()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def too_deep(value: Any) -> bool:
    """Whether ``value`` nests lists/dicts more than :data:`MAX_JSON_DEPTH` levels deep.

    A scalar (a batch that is one number, string or None) nests zero levels.
    """
    level, depth = ([value] if type(value) in CONTAINERS else []), 1
    while level:
        if depth > MAX_JSON_DEPTH:
            return True
        level = [
            c
            for v in level
            for c in (v.values() if type(v) is dict else v)
            if type(c) in CONTAINERS
        ]
        depth += 1
    return False


def parse_json(path: Path, data: bytes | str, what: str = "is not valid JSON") -> Any:
    """Strict JSON (no NaN/Infinity) read from ``path``, at most :data:`MAX_JSON_DEPTH` deep."""
    try:
        value = json.loads(data, parse_constant=_no_constant)
        deep = isinstance(value, (dict, list)) and too_deep(value)
    except RecursionError:
        deep = True
    except (ValueError, UnicodeDecodeError) as exc:
        raise format_error(path, f"{what} ({exc})") from None
    if deep:
        raise format_error(path, f"{what} (nested more than {MAX_JSON_DEPTH} levels deep)")
    return value


def read_json(path: Path, *, expect_digest: str | None = None) -> Any:
    buf = read_bytes(path)
    refuse_lfs_pointer(path, buf)
    sniff_foreign(path, buf)
    if expect_digest is not None and json_digest(buf) != expect_digest:
        raise format_error(
            path, f"is corrupted or was edited by hand: its checksum differs from {MANIFEST}"
        )
    return parse_json(path, bytes(buf))


def json_digest(data: bytes | bytearray) -> str:
    """Checksum of a JSON golden file, immune to line-ending conversion.

    :func:`encode_json` never writes a carriage return (JSON escapes it inside
    strings), so CRLF can only come from a checkout (``core.autocrlf``): it is
    read as LF. For a file as written the checksum is xxh3-128 of its bytes.
    """
    if b"\r" in data:
        data = bytes(data).replace(b"\r\n", b"\n")
    return checksum([data])


def is_json_int(x: Any) -> bool:
    """Whether a parsed JSON value is an integer (``true`` and ``false`` are not)."""
    return isinstance(x, int) and not isinstance(x, bool)
