"""On-disk format of goldens, by concern; every public name is re-exported here.

* :mod:`.disk`: the one writer (fsync and rename), whole-file reading, the one
  checksum, and the error naming a bad file.
* :mod:`.jsonfile`: JSON files, deterministic to write and strict to read.
* :mod:`.batchfile`: batch files, standard safetensors files that verify themselves.
* :mod:`.directory`: a golden directory as a whole: manifest, transaction, recovery, removal.
* :mod:`.lock`: the inter-process lock of a golden directory.
* :mod:`.owned`: temporary folders a live process owns (a marker it holds a lock on).
* :mod:`.codec`: a batch as named arrays plus a JSON layout, and back, without pickle.
* :mod:`.location`: the name of everything on disk.

The public API is ``save_batch`` and ``load_batch``; the other names are re-exported for
the package's own modules (their ``as`` says so) and may change without notice.
"""

from .batchfile import (
    DTYPES as DTYPES,
    canonical_header as canonical_header,
    encode_safetensors as encode_safetensors,
    load_batch,
    read_safetensors as read_safetensors,
    save_batch,
)
from .directory import (
    Transaction as Transaction,
    interrupted_commits as interrupted_commits,
    listed_files as listed_files,
    read_manifest as read_manifest,
    recover as recover,
    remove_golden as remove_golden,
)
from .disk import (
    FORMAT as FORMAT,
    SCHEMA as SCHEMA,
    TORCH_SAVE_HEAD as TORCH_SAVE_HEAD,
    atomic_write as atomic_write,
    checksum as checksum,
    format_error as format_error,
    is_pickle as is_pickle,
    read_bytes as read_bytes,
    torch_save_format as torch_save_format,
)
from .jsonfile import (
    MAX_JSON_DEPTH as MAX_JSON_DEPTH,
    encode_json as encode_json,
    json_digest as json_digest,
    parse_json as parse_json,
    read_json as read_json,
)
from .lock import (
    LOCK_TIMEOUT as LOCK_TIMEOUT,
    LOCK_TIMEOUT_ENV as LOCK_TIMEOUT_ENV,
    locked as locked,
)

__all__ = ["load_batch", "save_batch"]
