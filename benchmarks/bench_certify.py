"""The float64 oracle on TRL's real GRPOTrainer in bf16 (issue 43 item 6).

The inner project of ``tests/realtrainer/trl/test_trl_grpo_lane.py``
(``CERTIFY_INNER``: dapo, TRL's default ``bf16=True``, ``golden_precision = bf16``;
variants b4ga2, b2ga4 and two bugs declared ``same_math()``: a x1.001 loss and a
per-micro-batch token mean) runs in fresh pytest processes, per seed:

1. ``--update-golden -k b8ga1``: the bf16 reference records;
2. ``--golden-calibrate 2``: the oracle certifies or rejects each variant, the variant
   lane is calibrated (bugs declared); the x1.001 oracle failure gives its loss ``beyond``
   at step 0 against the float64 bound;
3. ``--golden-strict``: false alarms of the certified variants, and the x1.001 loss
   ``beyond`` at step 0 against the calibrated bf16 tolerance;
4. (first seed) the same calibration on a copy of the recorded project with the bugs
   deselected (not declared): the lane's loss and grad_norm rtol with and without them;
5. (first seed) the float64 replay (``--golden-certify``) against the bf16 replay of the
   certified tests, interleaved: ``call`` durations per test and whole processes.

Needs trl/transformers (``tests/realtrainer/requirements-trl.txt``); every TRL run is a few
seconds on CPU, a seed about 3 minutes on 2 cores. ``python benchmarks/bench_certify.py
[--seeds 0 1 2] [--rounds 2]`` prints the tables; ``benchmarks/run.py --only certify`` is
seed 0 with one timing round (``--quick``) or two.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import Section, Target, table

ROOT = Path(__file__).resolve().parent.parent
LANE = ROOT / "tests" / "realtrainer" / "trl"
CERTIFIED = ("b4ga2", "b2ga4")
BUGS = ("x1.001", "b4ga2-mbmean")
NOT_DECLARED = "not x1 and not mbmean"  # -k: the bugs deselected
ORACLE_FAILURE = re.compile(
    r"not the same math: (\S+) differs by (\S+) in float64 at step (\d+) \(([\d.e+]+)x"
)
DURATION = re.compile(r"^([\d.]+)s call\s+\S+::test_bf16\[(\S+)\]$", re.M)


def _lane():
    """The inner project's sources (the lane test module), or None without TRL."""
    sys.path.insert(0, str(LANE))
    try:
        import test_trl_grpo_lane as lane
    except BaseException:  # pytest.skip at module level: trl not installed
        return None
    return lane


def _project(path: Path, lane, seed: int) -> Path:
    """Write the inner project for ``seed`` into ``path``."""
    path.mkdir(parents=True)
    (path / "pytest.ini").write_text(lane.CERTIFY_INI)
    (path / "conftest.py").write_text(lane.INNER_CONFTEST.format(harness=str(LANE)))
    source = lane.CERTIFY_INNER.format(harness=str(LANE)).replace(
        'Knobs(loss_type="dapo"', f'Knobs(seed={seed}, loss_type="dapo"'
    )
    (path / "test_lane.py").write_text(source)
    return path


def _pytest(path: Path, *args: str) -> tuple[str, float]:
    """Run pytest in ``path``; (its output, wall seconds)."""
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", *args],
        cwd=path,
        capture_output=True,
        text=True,
    )
    return out.stdout + out.stderr, time.perf_counter() - start


def _tolerances(path: Path) -> dict:
    return json.loads((path / "golden/test_lane/test_bf16[b8ga1]/tolerances.json").read_text())


def _row_beyond(text: str, test: str, metric: str, step: int, bound: str = "") -> float | None:
    """The ``beyond`` factor of ``metric`` at ``step`` in the first failure table of ``test``
    (with ``bound``: the first row of that metric and step whose tolerance names it)."""
    start = text.find(f"test_lane.py::test_bf16[{test}] against the golden")
    if start < 0:
        return None
    row = re.compile(
        rf"^\s*{re.escape(metric)}\s+{step}\s+(?:\S+\s+){{4}}([\d.e+]+)x.*{re.escape(bound)}",
        re.M,
    )
    found = row.search(text, start)
    return float(found.group(1)) if found else None


def _outcomes(text: str) -> dict[str, str]:
    """Variant id -> PASSED/FAILED/... of a ``-v`` run (its last line per test)."""
    found = re.finditer(r"test_lane\.py::test_bf16\[(\S+)\] (PASSED|FAILED|ERROR|SKIPPED)", text)
    return {m.group(1): m.group(2) for m in found}


def _seed(tmp: Path, lane, seed: int) -> dict:
    """Record, calibrate with the bugs declared, replay strictly: one seed's figures."""
    path = _project(tmp / f"seed{seed}", lane, seed)
    text, _ = _pytest(path, "--update-golden", "-k", "b8ga1")
    if _outcomes(text).get("b8ga1") != "PASSED":
        raise RuntimeError(f"seed {seed}: the reference did not record\n{text[-3000:]}")
    recorded = tmp / f"seed{seed}-recorded"
    shutil.copytree(path, recorded)
    calibrate, _ = _pytest(path, "--golden-calibrate", "2")
    content = _tolerances(path)
    certificates = {
        t.split("[")[-1].rstrip("]"): r["certificate"] for t, r in content["variants"].items()
    }
    strict, _ = _pytest(path, "--golden-strict")
    oracle = ORACLE_FAILURE.search(calibrate[calibrate.find("test_bf16[x1.001]") :])
    return {
        "seed": seed,
        "path": path,
        "recorded": recorded,
        "certificates": certificates,
        "lane": content.get("layout_tolerances", {}),
        "strict": _outcomes(strict),
        "oracle_first": oracle.groups() if oracle else None,
        "oracle_loss_beyond": _row_beyond(calibrate, "x1.001", "loss", 0, "float64 oracle bound"),
        "bf16_loss_beyond": _row_beyond(strict, "x1.001", "loss", 0),
        "bf16_grad_norm_beyond": _row_beyond(strict, "x1.001", "grad_norm", 0),
    }


def _absorption(found: dict) -> dict[str, tuple[str, str]]:
    """Per value (loss, grad_norm): the lane's rtol with the bugs declared, and calibrated on
    a copy of the same recorded project with the bugs deselected."""
    _pytest(found["recorded"], "--golden-calibrate", "2", "-k", NOT_DECLARED)
    without = _tolerances(found["recorded"]).get("layout_tolerances", {})

    def rtol(lane, name):
        entry = lane.get(name)
        return f"{entry['rtol']:.3g}" if entry else "default"

    return {
        name: (rtol(found["lane"], name), rtol(without, name)) for name in ("loss", "grad_norm")
    }


def _cost(path: Path, rounds: int) -> dict[str, list[float]]:
    """Interleaved replays of the certified tests in bf16 and as the float64 oracle:
    per mode, each round's median ``call`` seconds per test and whole-process seconds."""
    selected = ("-k", "b8ga1 or b2ga4 or (b4ga2 and not mbmean)", "--durations=0")
    modes = {"bf16": selected, "float64": ("--golden-certify", *selected)}
    found: dict[str, list[float]] = {f"{m} {k}": [] for m in modes for k in ("call", "process")}
    for r in range(rounds):
        for mode in list(modes)[:: 1 if r % 2 == 0 else -1]:
            text, seconds = _pytest(path, *modes[mode])
            calls = [float(m.group(1)) for m in DURATION.finditer(text)]
            if len(calls) != 1 + len(CERTIFIED):
                raise RuntimeError(f"{mode} replay: {len(calls)} call durations\n{text[-3000:]}")
            found[f"{mode} call"].append(statistics.median(calls))
            found[f"{mode} process"].append(seconds)
    return found


def _verdict(certificate: dict) -> str:
    """A variant's certificate in a table cell."""
    if certificate["verdict"] == "certified":
        return f"certified ({certificate['largest']:.2g}x the bound)"
    if certificate["verdict"] == "not the same math":
        return (
            f"not the same math ({certificate['value']} {certificate['differs_by']:.2g}"
            f" at step {certificate['step']})"
        )
    return certificate["verdict"]


def _seed_rows(seeds: list[dict]) -> list[list[str]]:
    rows = []
    for found in seeds:
        alarms = [v for v in CERTIFIED if found["strict"].get(v) != "PASSED"]
        caught = [v for v in BUGS if found["strict"].get(v) == "FAILED"]
        rows.append(
            [
                str(found["seed"]),
                "; ".join(
                    f"{v}: {_verdict(found['certificates'][f'{v}'])}" for v in (*CERTIFIED, *BUGS)
                ),
                f"{len(alarms)} of {len(CERTIFIED)}"
                + (f" ({', '.join(alarms)})" if alarms else ""),
                f"{len(caught)} of {len(BUGS)}",
                f"{found['bf16_loss_beyond']}x / {found['bf16_grad_norm_beyond']}x",
                f"{found['oracle_loss_beyond']}x",
            ]
        )
    return rows


def _ratio(cost: dict[str, list[float]], what: str) -> float:
    """float64 oracle over bf16, medians of the rounds (``what``: call or process)."""
    return statistics.median(cost[f"float64 {what}"]) / statistics.median(cost[f"bf16 {what}"])


def _targets(seeds: list[dict], absorbed: dict) -> list[Target]:
    alarms = sum(found["strict"].get(v) != "PASSED" for found in seeds for v in CERTIFIED)
    bf16 = min((f["bf16_loss_beyond"] or 0.0) for f in seeds)
    oracle = min((f["oracle_loss_beyond"] or 0.0) for f in seeds)
    same = all(a == b for a, b in absorbed.values())
    return [
        Target("certified variants: no false alarm after calibration", f"{alarms}", alarms == 0),
        Target("x1.001 loss at step 0, bf16 after calibration: >= 5x", f"{bf16:g}x", bf16 >= 5),
        Target("x1.001 loss at step 0, float64 oracle: >= 5x", f"{oracle:g}x", oracle >= 5),
        Target(
            "calibrated lane rtol (loss, grad_norm) identical with the bugs declared",
            ", ".join(f"{n} {a} / {b}" for n, (a, b) in absorbed.items()),
            same,
        ),
    ]


def measure(seeds: list[int], rounds: int) -> Section:
    """Every figure of the section, measured in this run."""
    title = "The float64 oracle on TRL's GRPOTrainer in bf16"
    lane = _lane()
    if lane is None:
        return Section(title, "not measured: trl/transformers not installed")
    with tempfile.TemporaryDirectory(prefix="prg-bench-certify-") as tmp:
        found = []
        for seed in seeds:
            found.append(_seed(Path(tmp), lane, seed))
            shown = {k: v for k, v in found[-1].items() if k not in ("path", "recorded")}
            print(json.dumps(shown), file=sys.stderr, flush=True)  # kept if a later step fails
        absorbed = _absorption(found[0])
        cost = _cost(found[0]["path"], rounds)
    body = table(
        [
            "seed",
            "certificates",
            "false alarms (strict)",
            "bugs failing (strict)",
            "x1.001 beyond at step 0, bf16 strict: loss / grad_norm",
            "x1.001 loss beyond at step 0, oracle",
        ],
        _seed_rows(found),
    )
    body += "\n\n" + table(
        ["value", "lane rtol, bugs declared", "lane rtol, bugs not declared"],
        [[n, a, b] for n, (a, b) in absorbed.items()],
    )
    body += "\n\n" + table(
        [
            "replay of b8ga1, b4ga2, b2ga4 (seed " + str(seeds[0]) + ")",
            "bf16",
            "float64 oracle",
            "ratio",
        ],
        [
            [
                what,
                f"{statistics.median(cost[f'bf16 {what}']):.2f} s",
                f"{statistics.median(cost[f'float64 {what}']):.2f} s",
                f"{_ratio(cost, what):.2f}x",
            ]
            for what in ("call", "process")
        ],
    )
    body += (
        f"\n\n`call`: median over the 3 tests of pytest's call duration; `process`: the whole "
        f"pytest process; medians of {rounds} interleaved rounds."
    )
    return Section(title, body, _targets(found, absorbed))


def run(quick: bool) -> Section:
    return measure([0], 1 if quick else 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--rounds", type=int, default=2, help="timing rounds (first seed)")
    args = parser.parse_args()
    start = time.perf_counter()
    section = measure(args.seeds, args.rounds)
    print(f"## {section.title}\n\n{section.body}\n")
    print(table(["target", "measured", "verdict"], [t.row() for t in section.targets]))
    print(f"\nTotal: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
