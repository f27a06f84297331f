"""On-disk format of goldens, by concern; every public name is re-exported here.

* :mod:`.files`: the one writer (fsync and rename), whole-file reading, the one
  checksum, and the error naming a bad file.
* :mod:`.jsonfile`: JSON files, deterministic to write and strict to read.
* :mod:`.batchfile`: batch files, standard safetensors files that verify themselves.
* :mod:`.directory`: a golden directory as a whole: manifest, transaction, recovery, removal.
* :mod:`.lock`: the inter-process lock of a golden directory.

The names of everything on disk are in :mod:`..location`.
"""

from .batchfile import (
    DTYPES,
    canonical_header,
    encode_safetensors,
    load_batch,
    read_safetensors,
    save_batch,
)
from .directory import (
    Transaction,
    interrupted_commits,
    listed_files,
    read_manifest,
    recover,
    remove_golden,
)
from .files import (
    FORMAT,
    SCHEMA,
    TORCH_SAVE_HEAD,
    atomic_write,
    checksum,
    format_error,
    read_bytes,
    torch_save_format,
)
from .jsonfile import MAX_JSON_DEPTH, encode_json, json_digest, parse_json, read_json
from .lock import LOCK_TIMEOUT, LOCK_TIMEOUT_ENV, locked

__all__ = [
    "DTYPES",
    "FORMAT",
    "LOCK_TIMEOUT",
    "LOCK_TIMEOUT_ENV",
    "MAX_JSON_DEPTH",
    "SCHEMA",
    "TORCH_SAVE_HEAD",
    "Transaction",
    "atomic_write",
    "canonical_header",
    "checksum",
    "encode_json",
    "encode_safetensors",
    "format_error",
    "interrupted_commits",
    "json_digest",
    "listed_files",
    "load_batch",
    "locked",
    "parse_json",
    "read_bytes",
    "read_json",
    "read_manifest",
    "read_safetensors",
    "recover",
    "remove_golden",
    "save_batch",
    "torch_save_format",
]
