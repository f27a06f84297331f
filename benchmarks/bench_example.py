"""Replay against generation on the example in ``examples/``.

Any module of ``examples/`` (test modules aside) that defines ``generate_rollout()``
takes part: its rollout is generated, recorded once with ``save_batch``, then
generation and replay (``load_batch``) are timed side by side.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import Section, interleaved, ms, table

from pytest_rollout_golden.store import load_batch, save_batch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _generators() -> dict[str, Callable[[], Any]]:
    """``generate_rollout`` of every example module that has one, by module file name."""
    found = {}
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))  # examples import each other as top-level modules
    for path in sorted(EXAMPLES.glob("*.py")):
        if path.name.startswith(("test_", "conftest")):
            continue
        module = importlib.import_module(path.stem)
        if callable(getattr(module, "generate_rollout", None)):
            found[path.name] = module.generate_rollout
    return found


def run(quick: bool) -> Section:
    title = "Replay against generation on the example"
    generators = _generators() if EXAMPLES.is_dir() else {}
    if not generators:
        return Section(title, "example not present (no `generate_rollout()` in examples/).")

    rounds = 3 if quick else 9
    rows = []
    with tempfile.TemporaryDirectory(prefix="prg-bench-example-") as tmp:
        for name, generate in generators.items():
            path = Path(tmp) / f"{name}.safetensors"
            save_batch(path, generate())
            samples = interleaved(
                {"generate": generate, "replay": lambda p=path: load_batch(p)}, rounds
            )
            gen, replay = samples["generate"].median, samples["replay"].median
            size = path.stat().st_size
            rows.append(
                [
                    f"examples/{name}",
                    f"{size / 1e3:.1f}",
                    ms(gen),
                    ms(replay),
                    f"{gen / replay:.0f}×",
                ]
            )
    body = table(["example", "batch kB", "generate ms", "replay ms", "replay speed-up"], rows)
    body += (
        f"\n\nMedians of {rounds} interleaved rounds, after one warm-up. The example's policy is"
        " a toy; with a real inference engine generation takes seconds to minutes per step."
    )
    return Section(title, body)
