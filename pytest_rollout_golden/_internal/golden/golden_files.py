"""The files of one golden directory: locked, recovered, verified on load, committed whole.

:class:`GoldenFiles` is what :class:`~.golden.Golden` and the ``rollout-golden`` CLI
read and write a golden through::

    files = GoldenFiles(directory)
    files.open()                      # lock, finish an interrupted update, read the manifest
    batch = files.load(filename)      # every checksum verified
    files.stage_batch(new, batch, kind="rollout", name="rollout", step=1)
    files.commit({"test": ..., "fingerprint": ...}, metrics=steps, keep=lambda f: True)
    files.close()

Every error about a file names it and the remedy. What a damaged or missing file
*means* (an error, or something to re-record) is decided by :mod:`.modes`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ... import store
from ...errors import REMEDY_UPDATE, GoldenError, GoldenFormatError
from ...store.location import (
    ENVELOPE,
    MANIFEST,
    METRICS,
    TOLERANCES,
    files_without_manifest,
    in_golden,
)
from ..tolerance.envelope import Envelope
from ..tolerance.spec import Layer
from . import metric_codec
from .messages import manifestless
from .refresh import PROVENANCE

_RAISE = object()  # load() without a fallback: a damaged file raises


class GoldenFiles:
    """The recorded version of a golden directory and the new version this run stages."""

    def __init__(self, directory: Path, *, rebuild: Callable[..., Any] | None = None):
        """``rebuild``: how to turn a loaded batch back into the user's type (see codec)."""
        self.directory = Path(directory)
        self._rebuild = rebuild
        self.manifest: dict[str, Any] | None = None
        self._lock: Any = None
        self._tx: store.Transaction | None = None
        self._metrics: dict[str, dict[str, Any]] | None = None
        self.replaces_damaged = False  # see open(); a damaged file is then re-recorded
        self.damaged: set[str] = set()  # recorded files found unreadable and replaced

    # ------------------------------------------------------------------ the recorded version

    def open(self, *, damaged_is_missing: bool = False) -> None:
        """Lock the golden, finish (or drop, if undecided) an interrupted update, read the manifest.

        Raises :class:`~.errors.GoldenFormatError` for an unreadable manifest, unless
        ``damaged_is_missing`` (it is being re-recorded): then the golden counts as absent,
        and :meth:`load` with a ``damaged`` fallback returns the fallback for a damaged file.
        Once locked, the golden stays locked until :meth:`close`, whatever is raised.
        """
        self.replaces_damaged = damaged_is_missing
        lock = store.locked(self.directory)
        lock.__enter__()
        self._lock = lock
        store.recover(self.directory)
        try:
            self.manifest = store.read_manifest(self.directory)
            if self.manifest is None:
                self._refuse_manifestless()
        except GoldenFormatError:
            if not damaged_is_missing:
                raise
            self.manifest = None

    def _refuse_manifestless(self) -> None:
        """GoldenFormatError if the directory holds golden files but no manifest."""
        orphans = files_without_manifest(self.directory)
        if orphans:
            raise GoldenFormatError(f"{self.directory}: {manifestless(self.directory, orphans)}")

    @property
    def is_open(self) -> bool:
        """Whether this object holds the golden's lock."""
        return self._lock is not None

    @property
    def exists(self) -> bool:
        return self.manifest is not None

    @property
    def recorded(self) -> dict[str, Any]:
        """The manifest's file table: ``{filename: info}`` (empty without a golden)."""
        return self.manifest["files"] if self.manifest is not None else {}

    def load(self, filename: str, *, damaged: Any = _RAISE, on_cpu: bool = False) -> Any:
        """A recorded file's content, its checksum verified against the manifest.

        ``damaged``: what an unreadable file stands for while :attr:`replaces_damaged`
        (see :meth:`unless_damaged`); without it, an unreadable file always raises.
        ``on_cpu``: every tensor on the CPU, not on the device it was recorded on.
        """
        if damaged is not _RAISE:
            return self.unless_damaged(filename, lambda: self.load(filename), damaged)
        path, digest = self.directory / filename, self.recorded[filename]["digest"]
        try:
            if filename.endswith(".json"):
                return store.read_json(path, expect_digest=digest)
            return store.load_batch(
                path, rebuild=self._rebuild, expect_digest=digest, on_cpu=on_cpu
            )
        except FileNotFoundError:
            raise GoldenFormatError(
                f"{path}: listed in {MANIFEST} but missing; restore it from version control "
                f"or {REMEDY_UPDATE}."
            ) from None

    def unless_damaged(self, filename: str, read: Callable[[], Any], damaged: Any) -> Any:
        """``read()`` of recorded ``filename``, or ``damaged`` if that raises
        :class:`~.errors.GoldenFormatError` while :attr:`replaces_damaged`.

        Every error about a damaged golden names ``--update-golden`` as the remedy,
        so an update must not need the old values: it only loses their diff. A file
        replaced so is not kept by :meth:`commit`.
        """
        try:
            return read()
        except GoldenFormatError:
            if not self.replaces_damaged:
                raise
            self.damaged.add(filename)
            return damaged

    def metrics(self) -> dict[str, dict[str, Any]]:
        """The recorded metrics, ``{step: {name: node}}``; ``{}`` if none were recorded,
        or if the file is damaged while :attr:`replaces_damaged`."""
        if self._metrics is None:
            self._metrics = self.unless_damaged(METRICS, self._read_metrics, {})
        return self._metrics

    def _read_metrics(self) -> dict[str, dict[str, Any]]:
        data = self.load(METRICS) if METRICS in self.recorded else {"steps": {}}
        return self._steps(data)

    def _steps(self, document: Any) -> dict[str, dict[str, Any]]:
        problem = metric_codec.document_problem(document)
        if problem is not None:
            raise store.format_error(self.directory / METRICS, problem)
        return document["steps"]

    def steps(self, kind: str, name: str) -> list[int]:
        """The recorded steps of rollout or tensors ``name`` (``kind``: ``"rollout"``,
        ``"tensors"``), sorted, each once."""
        return sorted(
            {
                info["step"]
                for info in self.recorded.values()
                if info.get("kind") == kind and info.get("name") == name
            }
        )

    def load_all(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(manifest, {filename: content})``, every file verified, every tensor on the CPU;
        read-only (no lock, no recovery), for the CLI, which needs no accelerator. Raises
        :class:`~.errors.GoldenError` if the directory is not a golden."""
        self.manifest = store.read_manifest(self.directory)
        if self.manifest is None:
            raise GoldenError(f"{self.directory}: no {MANIFEST}; not a golden directory")
        out = {}
        for filename in self.recorded:
            out[filename] = self.load(filename, on_cpu=True)
            if filename == METRICS:
                self._metrics = self._steps(out[filename])
        if TOLERANCES in out:  # decoded as replay decodes it, bounded by the recorded values
            path = self.directory / TOLERANCES
            read_calibrated(out[TOLERANCES], path, self.magnitude, layout_variant=True)
        if ENVELOPE in out:
            from ..tolerance import envelope

            envelope.read(
                out[ENVELOPE],
                self.directory / ENVELOPE,
                magnitude=self.magnitude,
                recorded_steps=self.recorded_steps,
            )
        return self.manifest, out

    def magnitude(self, name: str) -> float | None:
        """Metric ``name``'s largest recorded magnitude over every step (``None`` if never
        recorded): what a ``tolerances.json`` entry of it is bounded by."""
        from .checks import recorded_magnitude

        return recorded_magnitude(self.metrics(), name)

    def recorded_steps(self, name: str) -> int:
        """How many steps recorded metric ``name`` as a finite number: what calibration
        measures a band over (:func:`.envelope.bands`)."""
        found = metric_codec.numbers(self.metrics()).values()
        return sum(name in names and math.isfinite(float(names[name][0])) for names in found)

    def calibrated_layers(
        self, *, layout_variant: bool = False
    ) -> tuple[Layer | None, Layer | None]:
        """The tolerance layers ``--golden-calibrate`` wrote into this golden, if any
        (:func:`.calibration.calibrated_layers`).

        A replay-only golden (a ``layout_variant``) also takes the lane calibrated across
        layouts. A damaged file that is being re-recorded counts as absent, and is dropped
        (:meth:`unless_damaged`).
        """
        if TOLERANCES not in self.recorded:
            return None, None
        path = self.directory / TOLERANCES

        def read() -> tuple[Layer | None, Layer | None]:
            document = self.load(TOLERANCES)
            return read_calibrated(document, path, self.magnitude, layout_variant=layout_variant)

        return self.unless_damaged(TOLERANCES, read, (None, None))

    def envelope(self, *, layout_variant: bool = False) -> Envelope | None:
        """The per-step bands ``--golden-calibrate`` wrote into this golden, if any
        (:func:`.envelope.read`; a variant's only where variants' runs made them). A damaged
        file that is being re-recorded counts as absent, and is dropped."""
        if ENVELOPE not in self.recorded:
            return None
        from ..tolerance import envelope

        def read() -> Envelope | None:
            content = self.load(ENVELOPE)
            path = self.directory / ENVELOPE
            return envelope.read(
                content,
                path,
                magnitude=self.magnitude,
                recorded_steps=self.recorded_steps,
                layout_variant=layout_variant,
            )

        return self.unless_damaged(ENVELOPE, read, None)

    def calibrated_tests(self) -> dict[str, list[str]]:
        """Per calibrated file that holds a lane across variants (``tolerances.json``,
        ``envelope.json``), the test ids whose runs calibrated it; a file damaged or
        unreadable counts as absent (replay has already said so)."""
        from ..tolerance.envelope import LANES

        lanes = {TOLERANCES: "layout_tolerances", ENVELOPE: LANES["across variants"]}
        out = {}
        for filename, key in lanes.items():
            if filename not in self.recorded:
                continue
            try:
                content = self.load(filename)
            except GoldenFormatError:
                continue
            across = content.get(key) if isinstance(content, dict) else None
            tests = content.get("how", {}).get("tests")
            if across and isinstance(tests, list):
                out[filename] = [str(t) for t in tests]
        return out

    # ------------------------------------------------------------------ the new version

    def _transaction(self) -> store.Transaction:
        if self._tx is None:
            self._tx = store.Transaction(self.directory)
        return self._tx

    @property
    def staging(self) -> bool:
        """Whether this run has staged files for a new version."""
        return self._tx is not None

    def staged(self, filename: str) -> bool:
        return self._tx is not None and filename in self._tx.files

    def load_staged(self, filename: str) -> Any:
        """A staged batch as replay will return it (decoded from the file written)."""
        assert self._tx is not None
        return store.load_batch(self._tx.staging / filename, rebuild=self._rebuild)

    def stage_batch(self, filename: str, batch: Any, **info: Any) -> None:
        self._transaction().write_batch(filename, batch, **info)

    def stage_json(self, filename: str, document: Any, **info: Any) -> None:
        self._transaction().write_json(filename, document, **info)

    def staged_path(self, filename: str) -> Path:
        assert self._tx is not None
        return self._tx.staging / filename

    @property
    def stand_ins(self) -> dict[str, dict[str, int]]:
        """``{step: {rollout name: step}}``: the recorded steps whose values were computed
        while another step's rollout stood in (``missing_step="repeat"``)."""
        return self.manifest.get("stand_ins", {}) if self.manifest is not None else {}

    def new_manifest(
        self,
        test_id: str,
        *,
        fresh: bool,
        stand_ins: Mapping[str, Mapping[str, int]] | None = None,
    ) -> dict[str, Any]:
        """The manifest fields of a new version: a ``fresh`` recording (see
        :meth:`.ModePolicy.fresh`) takes this run's environment fingerprint, an addition
        keeps the recorded one, and the ``provenance`` of its last refresh. ``stand_ins``
        (see :attr:`stand_ins`) is written only if there are any, so a golden without
        stand-ins reads as before."""
        from .determinism import fingerprint

        recorded = self.manifest.get("fingerprint") if self.manifest is not None else None
        fields = {"test": test_id, "fingerprint": fingerprint() if fresh else recorded}
        if not fresh and self.manifest is not None and PROVENANCE in self.manifest:
            fields[PROVENANCE] = self.manifest[PROVENANCE]  # an addition keeps who re-recorded
        if stand_ins:
            fields["stand_ins"] = {k: dict(stand_ins[k]) for k in sorted(stand_ins, key=int)}
        return fields

    @property
    def recorded_by(self) -> str | None:
        """The id of the test that wrote the recorded version, if the manifest says."""
        test = self.manifest.get("test") if self.manifest is not None else None
        return test if isinstance(test, str) and test else None

    def commit(
        self,
        manifest: dict[str, Any],
        *,
        metrics: Mapping[str, Mapping[str, Any]],
        keep: Callable[[str], bool],
    ) -> dict[str, dict[str, Any]]:
        """Swap the new version in: the staged files, ``metrics`` (``{step: {name: node}}``)
        and the recorded files ``keep`` accepts, unless found damaged; return the new
        file table."""
        tx = self._transaction()
        for filename, info in self.recorded.items():
            if filename in tx.files or filename in (METRICS, *self.damaged):
                continue
            if keep(filename):
                tx.keep(filename, info)
        if metrics:
            ordered = {k: metrics[k] for k in sorted(metrics, key=int)}
            tx.write_json(METRICS, {"steps": ordered}, kind="metrics")
        tx.commit(manifest)
        self._tx = None
        return tx.files

    def abort(self) -> bool:
        """Drop the staged version; whether anything had been staged."""
        if self._tx is None:
            return False
        staged = bool(self._tx.files)
        self._tx.abort()
        self._tx = None
        return staged

    def close(self) -> None:
        """Drop anything staged and release the lock."""
        self.abort()
        if self._lock is not None:
            self._lock.__exit__(None, None, None)
            self._lock = None


def merge_metrics(
    recorded: Mapping[str, Mapping[str, Any]],
    checked: Mapping[str, Mapping[str, Any]],
    *,
    replace: bool,
) -> dict[str, dict[str, Any]]:
    """The metrics a commit writes: ``checked`` added to ``recorded``, or (``replace``,
    an update) ``checked`` alone, ``{step: {name: node}}``."""
    steps: dict[str, dict[str, Any]] = {}
    if not replace:
        for step, names in recorded.items():
            steps[step] = dict(names)
    for step, names in checked.items():
        target = steps.setdefault(step, {})
        for name, node in names.items():
            if replace or name not in target:
                target[name] = node
    return steps


def read_calibrated(
    document: Any,
    path: Path,
    magnitude: Callable[[str], float | None],
    *,
    layout_variant: bool = False,
) -> tuple[Layer, Layer | None]:
    """The layers of the ``tolerances.json`` at ``path`` (:func:`.calibration.calibrated_layers`),
    their sources naming the file read (a lane's: ``@lanes/<lane>/tolerances.json``)."""
    from ..tolerance.calibration import calibrated_layers

    same, across = calibrated_layers(
        document, path, layout_variant=layout_variant, magnitude=magnitude
    )
    name = in_golden(path.parent, TOLERANCES)
    return same.read_from(TOLERANCES, name), across and across.read_from(TOLERANCES, name)


def read_envelope(directory: Path, *, layout_variant: bool = False) -> Envelope | None:
    """The per-step bands of the golden in ``directory`` as replay reads them
    (:meth:`GoldenFiles.envelope`), read without its lock as the CLI reads a golden;
    ``None``: it has none."""
    files = GoldenFiles(directory)
    files.manifest = store.read_manifest(files.directory)
    return files.envelope(layout_variant=layout_variant)


def load_golden(directory: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(manifest, {filename: content})`` of a golden, every checksum verified."""
    return GoldenFiles(directory).load_all()
