"""The one builder of a golden's tolerance stack: :func:`build`, called once per golden.

pytest (:class:`~..golden.golden.Golden`, when it opens its golden), ``rollout-golden
diff`` and ``rollout-golden show`` all resolve through it, so the CLI resolves exactly what
pytest resolves. Its inputs are what a test declares before its golden is read
(:class:`Declared`: the session's layers as :func:`..pytest_plugin.options.session_tolerances`
parsed them, the marker's, the run's flags) and what the golden holds (:class:`Recorded`:
the calibrated files, the lane compared, whether the environment changed since it was
recorded). Every rule that decides which layers apply lives here; the result,
:class:`GoldenStack`, holds the layers in :data:`.stack.ORDER` with their sources
(:meth:`GoldenStack.layers`) and the resolver of each step (:meth:`GoldenStack.at`: with
the envelope's bands where it has them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .families import precision_layer
from .spec import Layer
from .stack import Resolver, Stack

if TYPE_CHECKING:
    from .envelope import Envelope

MARKER_PRECISION = "marker precision"  # the source of a marker's precision= layer
VARIANT_LANE = "variant lane"  # the source of a layout variant's declared tolerances


@dataclasses.dataclass(frozen=True)
class Declared:
    """What a test declares of its tolerances before its golden is read.

    ``session``: the session-wide layers (``--golden-tolerance``, ini, precision, profile;
    ``session.exact``: the CLI's ``--exact``); ``marker``: the marker's or
    ``Golden(tolerances=)``'s layers; ``precision``: the marker's ``precision=`` (replaces
    the ini's); ``layout``: a layout variant's ``layout_tolerances`` (``None``: no variant);
    ``exact``: the marker's ``exact=``; ``exact_run``: ``--golden-exact`` (a variant ignores
    it); ``certify``: the float64 oracle's run."""

    session: Stack = dataclasses.field(default_factory=Stack)
    marker: Sequence[Layer] = ()
    precision: str | None = None
    layout: Mapping[str, Any] | None = None
    exact: bool = False
    exact_run: bool = False
    certify: bool = False


@dataclasses.dataclass(frozen=True)
class Recorded:
    """What the golden compared against holds that decides tolerances.

    ``calibrated``/``calibrated_layout``: the layers of its ``tolerances.json``;
    ``envelope``: its per-step bands; ``environment_changed``: replaying in another
    environment than the recording's (no bit equality to demand); ``fallback``: the lane
    compared is the ini's fallback lane, with ``fallback_tolerances`` over it."""

    calibrated: Layer | None = None
    calibrated_layout: Layer | None = None
    envelope: Envelope | None = None
    environment_changed: bool = False
    fallback: bool = False
    fallback_tolerances: Layer | None = None


def build(declared: Declared, recorded: Recorded | None = None) -> GoldenStack:
    """The tolerance stack of one golden: ``declared`` over what it has ``recorded``.

    - The marker's layers go on top of the session's; the marker's ``precision=``
      replaces the ini's precision layer (an empty one keeps it).
    - A layout variant (``declared.layout``) adds its variant lane and the layers that
      only a variant uses; it is bit-exact only by its own marker's ``exact=``.
    - Bit equality is dropped where the environment changed since recording, on the
      fallback lane, and for the float64 oracle, which also leaves out the calibrated
      files and the envelope (its bound replaces what calibration measured).
    """
    recorded = recorded or Recorded()
    variant = declared.layout is not None
    run_exact = declared.exact_run or declared.session.exact
    exact = declared.exact or (run_exact and not variant)
    exact = exact and not (declared.certify or recorded.environment_changed or recorded.fallback)
    parts: dict[str, Any] = {"marker": tuple(declared.marker), "exact": exact}
    if declared.precision is not None and declared.precision.strip():
        parts["precision"] = precision_layer(declared.precision, MARKER_PRECISION)
    if variant:
        parts.update(variant=True, layout=Layer(VARIANT_LANE, declared.layout or {}))
    if declared.certify:
        parts["certify"] = True
    envelope = None if declared.certify else recorded.envelope
    if not declared.certify:
        parts.update(calibrated=recorded.calibrated, calibrated_layout=recorded.calibrated_layout)
    if envelope is not None:
        parts["drifting"] = envelope.drifting_layer()
    if recorded.fallback:
        parts["lane_fallback"] = recorded.fallback_tolerances
    return GoldenStack(declared.session.replace(**parts), envelope)


class GoldenStack:
    """The tolerance stack of one golden (:func:`build`) and its resolvers: of the golden as
    a whole, of each step (with the envelope's bands), without the calibrated files."""

    def __init__(self, stack: Stack, envelope: Envelope | None = None):
        self.stack = stack
        self.envelope = envelope
        self._resolver = stack.resolver()
        self._steps: dict[int, Resolver] = {}
        self._uncalibrated: Resolver | None = None

    def layers(self) -> list[tuple[str, Layer]]:
        """``(role, layer)`` of each layer in force, top first (the envelope's bands apply
        per step: :meth:`at`); ``layer.source`` names where each comes from."""
        return self.stack.layers()

    def resolver(self) -> Resolver:
        """The resolver of the golden as a whole (every step without a band)."""
        return self._resolver

    def at(self, step: int) -> Resolver:
        """The resolver of ``step``: with the envelope's bands at that step, if any, over
        the calibrated files for the metrics they hold, so that a band adds to the
        uncalibrated tolerance and never holds a metric tighter than it (the same-math runs
        of one calibration are a small sample)."""
        band = None if self.envelope is None else self.envelope.layer(step)
        if band is None:
            return self._resolver
        if step not in self._steps:
            held = set(band.entries)
            files = {
                part: None if layer is None else layer.excluding(held)
                for part, layer in (
                    ("calibrated", self.stack.calibrated),
                    ("calibrated_layout", self.stack.calibrated_layout),
                )
            }
            self._steps[step] = self.stack.replace(envelope=band, **files).resolver()
        return self._steps[step]

    def uncalibrated(self) -> Resolver:
        """The resolver without the files calibration wrote into the golden (the calibrated
        layers; the bands are per step, so :meth:`resolver` has none)."""
        if self._uncalibrated is None:
            files = (self.stack.calibrated, self.stack.calibrated_layout)
            self._uncalibrated = self._resolver.without(*files)
        return self._uncalibrated
