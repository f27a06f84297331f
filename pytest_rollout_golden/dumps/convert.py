"""A dump folder converted into a golden by the writer of every golden (``store.Transaction``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import GoldenError
from . import areal, nemo_rl, nexrl, roll, slime, verl
from .entry import Entry, Imported, Skipped
from .loading import load, read_jsonl, whole_sentences
from .values import plain

# Detection tries them in this order: slime reads any .pt file, so it comes last.
LAYOUTS = {"verl": verl, "roll": roll, "nexrl": nexrl, "areal": areal, "nemo-rl": nemo_rl,
           "slime": slime}  # fmt: skip


def detect(source: Path) -> str:
    """The layout of the dump folder ``source``."""
    files = [p for p in source.rglob("*") if p.is_file()]
    for layout, module in LAYOUTS.items():
        if module.matches(files):
            return layout
    raise GoldenError(
        f"{source}: no dump of a known layout found ({', '.join(LAYOUTS)}); give --layout "
        "(`rollout-golden import -h` lists the files of each)"
    )


def entries(source: Path, layout: str, name: str = "rollout") -> tuple[list[Entry], list[Skipped]]:
    """The files of a dump folder in ``layout``: each mapped to a golden file, or skipped."""
    found, skipped = [], []
    for item in LAYOUTS[layout].entries(source, name):
        if isinstance(item, Skipped):
            skipped.append(_elsewhere(item, layout))
        else:
            found.append(item)
    if not found:
        patterns = "; ".join(LAYOUTS[layout].PATTERNS)
        raise GoldenError(f"{source}: no {layout} dump files found; {layout} reads {patterns}")
    return found, skipped


def _elsewhere(skipped: Skipped, layout: str) -> Skipped:
    """``skipped``, saying which other layout reads the file, if one does by its name."""
    others = [other for other, module in LAYOUTS.items()
              if other != layout and module.matches([skipped.path])]  # fmt: skip
    if not others:
        return skipped
    return Skipped(
        skipped.path,
        f"{skipped.why}; it is named as a {others[0]} dump: import it into another golden "
        f"with --layout {others[0]}",
    )


def convert(
    source: Path,
    target: Path,
    *,
    layout: str | None = None,
    name: str = "rollout",
    trust_pickle: bool = False,
    test_id: str = "",
) -> Imported:
    """Write the golden ``target`` from the dump folder ``source``; return what went where.

    Refuses to overwrite an existing golden. Nothing is written if any file fails.
    """
    from .. import store
    from ..store.location import MANIFEST

    if not source.is_dir():
        raise GoldenError(f"{source}: not a folder of dumps")
    layout = layout or detect(source)
    found, skipped = entries(source, layout, name)
    with store.locked(target):
        store.recover(target)
        if (target / MANIFEST).exists():
            raise GoldenError(f"{target}: a golden exists already; remove it or choose another")
        tx = store.Transaction(target)
        done = []
        try:
            for entry in found:
                try:
                    filename = _import(tx, entry, trust_pickle=trust_pickle)
                except Exception as exc:
                    raise _naming(entry, exc) from exc
                done.append((entry, filename))
            tx.commit(
                {
                    "test": test_id,
                    "fingerprint": None,
                    "imported": {"layout": layout, "source": str(source)},
                }
            )
        except BaseException:
            tx.abort()
            raise
    return Imported(done, skipped)


def _read(entry: Entry, *, trust_pickle: bool) -> Any:
    if entry.reader == "jsonl":
        return [record for path in entry.sources for record in read_jsonl(path)]
    return load(entry.path, trust_pickle=trust_pickle)


def _import(tx: Any, entry: Entry, *, trust_pickle: bool) -> str:
    """Load the dump ``entry`` and write it into the transaction ``tx``; return its file name."""
    from ..store.location import rollout_filename, tensors_filename

    payload = _read(entry, trust_pickle=trust_pickle)
    metadata: dict[str, Any] = {}
    if entry.prepare is not None:
        payload, metadata = entry.prepare(entry, payload)
    assert entry.step is not None, "a layout sets the step, from the name or the payload"
    if entry.kind == "rollout":
        filename = rollout_filename(entry.name, entry.step)
        info: dict[str, Any] = {"kind": "rollout", "name": entry.name}
    else:
        filename = tensors_filename(entry.name, entry.step, entry.rank, entry.micro)
        info = {"kind": "tensors", "name": entry.name, "rank": entry.rank, "micro": entry.micro}
        if not isinstance(payload, dict):
            raise GoldenError(
                f"{entry.path}: a {entry.name} dump must hold a dict of tensors, "
                f"found {type(payload).__name__}; dump that step again, or move the file "
                "out of the dump folder"
            )
    if metadata:
        info["dump"] = metadata
    if filename in tx.files:
        raise GoldenError(
            f"{entry.path}: a second dump for {filename} (rollout {entry.name!r}, step "
            f"{entry.step}); keep one of the two in the dump folder"
        )
    tx.write_batch(filename, plain(payload), step=entry.step, **info)
    return filename


def _naming(entry: Entry, exc: Exception) -> GoldenError:
    """``exc`` as an error that starts with the step and the file it happened in.

    Errors this package raises already say what went wrong and what to do; any
    other (the codec's, torch's, a converter's) is named by its type and message.
    """
    path, what = entry.path, str(exc)
    for source in entry.sources:
        if isinstance(exc, GoldenError) and what.startswith(f"{source}: "):
            path, what = source, what.removeprefix(f"{source}: ")
            break
    else:
        if isinstance(exc, OSError):
            what = f"{type(exc).__name__}: {exc}"
        elif not isinstance(exc, GoldenError):
            what = (
                f"cannot be converted ({type(exc).__name__}: {whole_sentences(str(exc))}); fix "
                "or re-dump that step, or move the file out of the dump folder"
            )
    step = f"step {entry.step}, " if entry.step is not None else ""
    return GoldenError(f"{step}{path}: {what}")
