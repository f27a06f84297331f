"""rollout-golden plot and pytest --golden-plot: PNGs of metric curves, matplotlib optional."""

from __future__ import annotations

import json
import sys

import pytest

from pytest_rollout_golden import Golden, Mode
from pytest_rollout_golden.cli import main

matplotlib = pytest.importorskip("matplotlib")

PNG = b"\x89PNG\r\n\x1a\n"


def record(directory, loss_drift=0.0):
    with Golden(directory, mode=Mode.AUTO) as golden:
        for step in range(4):
            golden.check(
                {"pg_loss": 1.0 / (step + 1) + (loss_drift if step >= 2 else 0), "kl": 0.01 * step},
                step=step,
            )


def test_plot_one_golden_and_two(tmp_path, capsys):
    record(tmp_path / "a")
    record(tmp_path / "b", loss_drift=1e-3)
    assert main(["plot", str(tmp_path / "a"), "-o", str(tmp_path / "one.png")]) == 0
    assert (
        main(["plot", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "two.png")])
        == 0
    )
    for name in ("one.png", "two.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG)
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {tmp_path / 'two.png'}"


def test_plot_without_matplotlib_says_how_to_install_it(tmp_path, capsys, hide_matplotlib):
    record(tmp_path / "a")
    hide_matplotlib()
    assert main(["plot", str(tmp_path / "a"), "-o", str(tmp_path / "x.png")]) == 2
    assert "pip install 'pytest-rollout-golden[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


FAILING = """
import json, pathlib
V = json.loads((pathlib.Path(__file__).parent / "values.json").read_text())

def test_train(golden):
    for step in range(3):
        golden.check({"pg_loss": 0.5 + step + (V["drift"] if step else 0), "kl": 0.1}, step=step)

def test_steady(golden):
    golden.check({"pg_loss": 1.0})
"""


def test_golden_plot_writes_one_picture_per_failed_golden(project):
    project.write(FAILING)
    project.set_values(drift=0.0)
    project.run().assert_outcomes(passed=2)
    project.set_values(drift=1e-3)
    result = project.run("--golden-plot", "plots")
    result.assert_outcomes(passed=1, failed=1)
    pictures = sorted((project.path / "plots").glob("*.png"))
    assert [p.name for p in pictures] == [
        "test_it.py__test_train~" + pictures[0].name.split("~")[1]
    ]
    assert pictures[0].read_bytes().startswith(PNG)
    result.stdout.fnmatch_lines(["golden plots written (--golden-plot):", "    plots/test_it.py*"])


def test_golden_plot_removes_the_pictures_of_an_earlier_run_and_nothing_else(project):
    """DIR holds this run's pictures only: a picture of a test that now passes would read
    as a failure of this run. Only what the plugin wrote (its manifest lists) is removed."""
    project.write(FAILING)
    project.set_values(drift=0.0)
    project.run().assert_outcomes(passed=2)
    project.set_values(drift=1e-3)
    project.run("--golden-plot", "plots").assert_outcomes(passed=1, failed=1)
    plots = project.path / "plots"
    [old] = plots.glob("*.png")
    (plots / "mine.png").write_bytes(b"a user's picture")
    (project.path / "outside.png").write_bytes(b"not in DIR")
    manifest = next(plots.glob(".*.json"))
    listed = json.loads(manifest.read_text())
    listed["plots"] += ["../outside.png", "/etc/hostname"]  # never followed out of DIR
    manifest.write_text(json.dumps(listed))

    project.set_values(drift=0.0)  # every test passes: no picture of this run
    result = project.run("--golden-plot", "plots")
    result.assert_outcomes(passed=2)
    assert not old.exists()
    assert (plots / "mine.png").read_bytes() == b"a user's picture"
    assert (project.path / "outside.png").exists()
    result.stdout.fnmatch_lines(
        [
            "golden plots of an earlier run removed from plots (--golden-plot):",
            f"    plots/{old.name}",
        ]
    )

    project.set_values(drift=1e-3)  # the next run's picture replaces nothing of the user's
    project.run("--golden-plot", "plots").assert_outcomes(passed=1, failed=1)
    assert sorted(p.name for p in plots.glob("*.png")) == sorted([old.name, "mine.png"])


def test_loading_the_plugin_with_golden_plot_imports_no_heavy_module(project):
    project.write("def test_plain():\n    pass\n")
    project.pytester.makeconftest(
        "import sys\n"
        "def pytest_collection_finish(session):\n"
        "    heavy = [m for m in ('torch', 'numpy', 'matplotlib') if m in sys.modules]\n"
        "    open('heavy.json', 'w').write(__import__('json').dumps(heavy))\n"
    )
    project.run_subprocess("--golden-plot", "plots").assert_outcomes(passed=1)
    assert json.loads((project.path / "heavy.json").read_text()) == []
    assert "matplotlib" in sys.modules  # this process did import it: the check above is real


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plotting functions save, to look at what they drew."""
    from matplotlib.figure import Figure

    figures = []
    real_savefig = Figure.savefig

    def keep(self, *args, **kwargs):
        figures.append(self)
        return real_savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def texts(figure):
    """Every text on the figure and its axes: titles, annotations, notes."""
    found = [t.get_text() for t in figure.texts]
    for ax in figure.axes:
        found += [ax.get_title(loc="left"), ax.get_title()]
        found += [t.get_text() for t in ax.texts]
    return found


def bars_and_line(strip):
    """The difference strip's bars by step (height, colour) and the y of its dashed line."""
    from matplotlib.colors import to_hex

    bars = {round(p.get_x() + p.get_width() / 2): (p.get_height(), to_hex(p.get_facecolor()))
            for p in strip.patches}  # fmt: skip
    [line] = [line for line in strip.get_lines() if line.get_linestyle() == "--"]
    [y] = set(line.get_ydata())
    return bars, y


def test_many_metrics_draw_a_bounded_number_of_panels_and_name_the_rest(tmp_path, drawn):
    from pytest_rollout_golden._internal.report.plot import MAX_PANELS, plot_metrics

    names = [f"m{i:03d}" for i in range(200)]
    a = {n: {s: 1.0 + s for s in range(3)} for n in names}
    b = {n: dict(c) for n, c in a.items()}
    b["m150"][1] = 5.0  # the first to diverge
    b["m020"][2] = 9.0  # diverges later
    first = {n: None for n in names} | {"m150": 1, "m020": 2}
    picture = plot_metrics(a, tmp_path / "many.png", b=b, first_divergence=first)

    assert 12 <= MAX_PANELS <= 16
    assert len(picture.drawn) == MAX_PANELS
    assert picture.drawn[:2] == ("m150", "m020")  # diverged first, earliest first
    assert (
        list(picture.drawn[2:]) == [n for n in names if n not in ("m150", "m020")][: MAX_PANELS - 2]
    )
    assert sorted(picture.drawn + picture.not_drawn) == names
    assert len(picture.not_drawn) == 200 - MAX_PANELS
    assert picture.path == tmp_path / "many.png" and str(picture) == str(tmp_path / "many.png")
    assert (tmp_path / "many.png").read_bytes().startswith(PNG)

    [figure] = drawn
    assert len(figure.axes) == 2 * MAX_PANELS  # a panel and its difference strip each
    assert figure.get_layout_engine() is None  # no constrained layout over a large grid
    note = "\n".join(t for t in texts(figure) if "not drawn" in t)
    assert f"{200 - MAX_PANELS} of 200 metrics not drawn" in note
    assert picture.not_drawn[0] in note


def test_many_diverged_metrics_draw_the_farthest_and_keep_the_title_short(tmp_path, drawn):
    from pytest_rollout_golden._internal.report.plot import MAX_PANELS, plot_metrics

    names = [f"m{i:03d}" for i in range(200)]
    a = {n: {s: 1.0 + s for s in range(3)} for n in names}
    b = {n: dict(c) for n, c in a.items()}
    diverged = [f"m{i:03d}" for i in range(196, -1, -4)]  # farthest first: drift grows with i
    for name in diverged:
        b[name][1] += 1e-3 * (int(name[1:]) + 1)
    first = {n: 1 if n in diverged else None for n in names}
    allowed = {n: {s: 1e-8 + 1e-5 * (1.0 + s) for s in range(3)} for n in names}
    picture = plot_metrics(a, tmp_path / "x.png", b=b, first_divergence=first, allowed=allowed)

    assert list(picture.drawn) == diverged[:MAX_PANELS]
    hidden = len(diverged) - MAX_PANELS
    assert list(picture.not_drawn[:hidden]) == diverged[MAX_PANELS:]
    assert list(picture.not_drawn[hidden:]) == [n for n in names if n not in diverged]
    assert picture.not_drawn_note.startswith(
        f"{200 - MAX_PANELS} of 200 metrics not drawn (at most {MAX_PANELS} panels), "
        f"{hidden} of them beyond tolerance (first step in brackets): {diverged[MAX_PANELS]} [1],"
    )
    [heading] = [t for t in texts(drawn[0]) if "first divergence" in t]
    assert "first divergence at step 1: m196, m192, m188, m184, m180 and 45 more" in heading
    assert len(heading) < 300


def test_plot_verb_prints_the_metrics_it_did_not_draw(tmp_path, capsys, drawn):
    from pytest_rollout_golden._internal.report.plot import MAX_PANELS

    with Golden(tmp_path / "a", mode=Mode.AUTO) as golden:
        for step in range(3):
            golden.check({f"m{i:03d}": float(i + step) for i in range(40)}, step=step)
    assert main(["plot", str(tmp_path / "a"), "-o", str(tmp_path / "a.png")]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'a.png'}" in out
    assert f"{40 - MAX_PANELS} of 40 metrics not drawn" in out
    assert "m039" in out and f"m{MAX_PANELS - 1:03d}," not in out
    assert len(drawn[0].axes) == MAX_PANELS


def record_non_finite(directory, values):
    with Golden(directory, mode=Mode.AUTO) as golden:
        for step, value in enumerate(values):
            golden.check({"pg_loss": value, "kl": 0.01 * step}, step=step)


@pytest.mark.filterwarnings("ignore::pytest_rollout_golden.GoldenNaNWarning")
@pytest.mark.parametrize("order", ["one", "ab", "ba"])
def test_plot_marks_infinite_and_nan_values_instead_of_failing(tmp_path, capsys, drawn, order):
    inf, nan = float("inf"), float("nan")
    record_non_finite(tmp_path / "diverged", [1.0, 0.5, inf, nan, 0.3])
    record_non_finite(tmp_path / "finite", [1.0, 0.5, 0.4, 0.35, 0.3])
    goldens = {"one": ["diverged"], "ab": ["diverged", "finite"], "ba": ["finite", "diverged"]}
    args = [str(tmp_path / g) for g in goldens[order]]
    assert main(["plot", *args, "-o", str(tmp_path / "x.png")]) == 0
    assert (tmp_path / "x.png").read_bytes().startswith(PNG)

    [figure] = drawn
    panel = next(ax for ax in figure.axes if ax.get_title(loc="left").startswith("pg_loss"))
    marks = [t.get_text() for t in panel.texts]
    assert "inf" in marks and "nan" in marks
    if order != "one":  # the difference strip below says the difference is not finite
        strip = figure.axes[figure.axes.index(panel) + 1]
        assert {"inf", "nan"} <= {t.get_text() for t in strip.texts}
        assert not any("identical" in t.get_text() for t in strip.texts)


def test_golden_plot_of_a_failure_draws_its_non_finite_values(tmp_path, drawn):
    from pytest_rollout_golden._internal.report.plot import plot_outcome

    def comparison(step, expected, actual, verdict):
        return {"kind": "metric", "metric": "pg_loss", "step": step, "expected": expected,
                "actual": actual, "verdict": verdict, "excess": None,
                "tolerance": {"rtol": 1e-5, "atol": 1e-8}}  # fmt: skip

    outcome = {
        "test": "t.py::test_train",
        "directory": str(tmp_path / "golden"),
        "comparisons": [
            comparison(0, 1.0, 1.0, "pass"),
            comparison(1, 0.5, "inf", "fail"),  # to_json writes non-finite numbers as strings
            comparison(2, 0.4, "nan", "fail"),
            comparison(3, "-inf", 0.3, "fail"),
        ],
    }
    picture = plot_outcome(outcome, tmp_path / "t.png")
    [figure] = drawn
    assert {"inf", "nan", "-inf"} <= {t.get_text() for t in figure.axes[0].texts}
    assert picture.drawn == ("pg_loss",) and picture.not_drawn == ()


def test_plot_takes_golden_roots_as_diff_does_one_picture_per_pair(tmp_path, capsys):
    """Paths resolve as for diff: two roots pair their goldens by relative path; -o is then
    a directory holding one PNG per pair; a golden on one side only is named, not drawn."""
    record(tmp_path / "a" / "t" / "same")
    record(tmp_path / "b" / "t" / "same")
    record(tmp_path / "a" / "t" / "drift")
    record(tmp_path / "b" / "t" / "drift", loss_drift=1e-3)
    record(tmp_path / "b" / "t" / "new")
    out = tmp_path / "pictures"
    assert main(["plot", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"wrote {out / 't' / 'drift.png'}" in lines
    assert f"wrote {out / 't' / 'same.png'}" in lines
    assert f"not drawn: t/new: golden only in B ({tmp_path / 'b' / 't' / 'new'})" in lines
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.png")) == [
        "t/drift.png",
        "t/same.png",
    ]
    assert (out / "t" / "drift.png").read_bytes().startswith(PNG)
    # One root alone: every golden under it.
    assert main(["plot", str(tmp_path / "b"), "-o", str(tmp_path / "one")]) == 0
    assert len(list((tmp_path / "one").rglob("*.png"))) == 3
    # A root with -o naming a PNG: refused, saying -o is a directory there.
    code = main(["plot", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "x.png")])
    assert code == 2
    assert "-o names a directory" in capsys.readouterr().err
    # A golden and a root: the same refusal as diff's.
    assert main(["plot", str(tmp_path / "a" / "t" / "same"), str(tmp_path / "b"), "-o", "x"]) == 2
    assert "is a golden directory but" in capsys.readouterr().err


def test_an_atol_only_tolerance_gates_its_bars_and_ignored_metrics_say_so(tmp_path, drawn):
    """rtol=0 (a fraction's atol-only tolerance): each bar is |B-A| / atol, the line at 1; a
    metric the tolerances exclude is labelled "not compared", its bars not left unexplained."""
    from pytest_rollout_golden._internal.report.plot import plot_outcome

    def comparison(metric, step, expected, actual, verdict, tolerance):
        return {"kind": "metric", "metric": metric, "step": step, "expected": expected,
                "actual": actual, "verdict": verdict, "excess": None,
                "tolerance": tolerance}  # fmt: skip

    fraction = {"rtol": 0.0, "atol": 1e-7, "exact": False, "ignore": False}
    ignore = {"rtol": 0.0, "atol": 0.0, "exact": False, "ignore": True}
    outcome = {
        "test": "t.py::test_train",
        "directory": str(tmp_path / "golden"),
        "comparisons": [
            comparison("pg_clipfrac", 0, 0.2, 0.2, "pass", fraction),
            comparison("pg_clipfrac", 1, 0.25, 0.25 + 5e-8, "pass", fraction),
            comparison("pg_clipfrac", 2, 0.1, 0.1 + 1e-3, "fail", fraction),
            comparison("timing_s", 0, 1.0, 1.5, "not compared", ignore),
            comparison("timing_s", 1, 1.0, 0.7, "not compared", ignore),
        ],
    }
    plot_outcome(outcome, tmp_path / "t.png")
    [figure] = drawn
    panels = panels_by_title(figure)
    strip = figure.axes[panels["pg_clipfrac"] + 1]
    bars, line = bars_and_line(strip)
    assert line == 1.0 and set(bars) == {1, 2}  # step 0: identical
    assert bars[1][0] == pytest.approx(5e-8 / 1e-7, rel=1e-6) and bars[1][0] < line
    assert bars[2][0] == pytest.approx(1e-3 / 1e-7, rel=1e-6) and bars[2][0] > line
    assert "|B-A| / allowed" in strip.get_ylabel()

    timing = figure.axes[panels["timing_s"]]
    assert "not compared" in timing.get_title(loc="left")
    strip = figure.axes[panels["timing_s"] + 1]
    assert "not compared (ignored): differences not gated" in [t.get_text() for t in strip.texts]
    assert not any(line.get_linestyle() == "--" for line in strip.get_lines())


LONG = 12
BELOW = [1e-4] * 6 + [4e-3] * 6  # the runs agreed at first, then drifted apart
ABOVE = [2e-4] * 6 + [2e-3] * 6


def record_long(directory, bias=0.0):
    with Golden(directory, mode=Mode.AUTO) as golden:
        for step in range(LONG):
            golden.check({"loss": 1.0 + 0.01 * step + bias, "kl": 0.01}, step=step)


def give_envelope(directory):
    """An envelope.json for ``loss`` over 3 runs, as --golden-calibrate writes it."""
    from pytest_rollout_golden._internal.tolerance.calibration import write
    from pytest_rollout_golden._internal.tolerance.envelope import document

    band = {"steps": list(range(LONG)), "below": BELOW, "above": ABOVE, "dtype": "float64"}
    how = {"runs": 3, "perturbations": ["threads"], "tests": [], "variants": False, "refused": {}}
    write(directory, None, envelope=document({"same layout": {"loss": {**band, "runs": 3}}}, how))


def shaded(ax):
    """The shaded areas of a panel by label: their outline's vertices."""
    from matplotlib.collections import PolyCollection

    return {
        c.get_label(): c.get_paths()[0].vertices
        for c in ax.collections
        if isinstance(c, PolyCollection)
    }


def spans(vertices, steps):
    """Per step, the lowest and highest y of an outline drawn over ``steps``."""
    return {s: (min(y for x, y in vertices if x == s), max(y for x, y in vertices if x == s))
            for s in steps}  # fmt: skip


def panels_by_title(figure):
    return {ax.get_title(loc="left").split()[0]: i for i, ax in enumerate(figure.axes)
            if ax.get_title(loc="left")}  # fmt: skip


def allowances():
    from pytest_rollout_golden._internal.tolerance.envelope import Band

    band = Band(tuple(range(LONG)), tuple(BELOW), tuple(ABOVE), "float64", 1.11)
    return band.allowances()


def check_band(figure, golden):
    """The loss panel shades the runs' band and outlines the allowed region; kl has none."""
    panels = panels_by_title(figure)
    ax = figure.axes[panels["loss"]]
    areas = shaded(ax)
    assert set(areas) == {"calibration runs (3)", "band x2"}
    runs = spans(areas["calibration runs (3)"], range(LONG))
    allowed = spans(areas["band x2"], range(LONG))
    for step in range(LONG):
        assert runs[step] == pytest.approx((golden[step] - BELOW[step], golden[step] + ABOVE[step]))
        width = allowances()[step]
        assert allowed[step] == pytest.approx((golden[step] - width, golden[step] + width))
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"calibration runs (3)", "band x2"} <= set(legend)
    assert not shaded(figure.axes[panels["kl"]])  # no envelope: drawn as before
    return panels


def test_plot_draws_the_envelope_of_golden_a_and_its_allowed_difference(tmp_path, drawn):
    a, b = tmp_path / "a", tmp_path / "b"
    record_long(a)
    record_long(b, bias=8e-4)
    give_envelope(a)
    golden = {s: 1.0 + 0.01 * s for s in range(LONG)}
    assert main(["plot", str(a), "-o", str(tmp_path / "one.png")]) == 0
    check_band(drawn[-1], golden)
    assert main(["plot", str(a), str(b), "-o", str(tmp_path / "two.png")]) == 0
    figure = drawn[-1]
    panels = check_band(figure, golden)
    strip = figure.axes[panels["loss"] + 1]
    bars, line = bars_and_line(strip)
    # each step against the band's allowance there plus the uncalibrated rtol x max(|A|, 1.11)
    allowed = [allowances()[s] + 1e-4 * max(golden[s], 1.11) for s in range(LONG)]
    assert line == 1.0
    for step in range(LONG):
        assert bars[step][0] == pytest.approx(8e-4 / allowed[step], rel=1e-3)
    assert bars[0][0] > line > bars[LONG - 1][0]  # beyond the band at first, within it later
    # Beyond the band at step 0 (8e-4 > 2 x 2e-4 + 1e-4 x the magnitude), within it later.
    assert "diverges at step 0" in figure.axes[panels["loss"]].get_title(loc="left")


def test_a_failure_picture_draws_the_envelope_its_replay_used(tmp_path, drawn):
    from pytest_rollout_golden._internal.report.plot import plot_outcome

    record_long(tmp_path / "golden")
    give_envelope(tmp_path / "golden")
    golden = {s: 1.0 + 0.01 * s for s in range(LONG)}

    def outcome(source):
        return {
            "test": "t.py::test_long",
            "directory": str(tmp_path / "golden"),
            "comparisons": [
                {"kind": "metric", "metric": name, "step": s, "expected": value,
                 "actual": value + (5e-4 if name == "loss" else 0),
                 "verdict": "fail" if name == "loss" and s < 5 else "pass", "excess": None,
                 "tolerance": {"rtol": 0.0, "atol": allowances()[s], "exact": False,
                               "ignore": False},
                 "tolerance_source": source if name == "loss" else "built-in default"}
                for s in range(LONG)
                for name, value in (("loss", golden[s]), ("kl", 0.01))
            ],
        }  # fmt: skip

    plot_outcome(outcome("envelope (envelope.json)"), tmp_path / "t.png")
    check_band(drawn[-1], golden)
    # A tolerance that stood above the envelope (--golden-tolerance): no band to draw.
    plot_outcome(outcome("--golden-tolerance"), tmp_path / "u.png")
    assert not shaded(drawn[-1].axes[panels_by_title(drawn[-1])["loss"]])


def test_the_strip_measures_differences_on_the_tolerances_scale(tmp_path, drawn):
    """Against scale=recorded, a value far below its recorded magnitude passes with a
    difference far beyond rtol x |A|: its bar stays below the line, as its verdict says; the
    bar of the failed step is above it, and each bar is |B-A| / (atol + rtol x max(|A|, scale))."""
    from pytest_rollout_golden._internal.report.plot import plot_outcome

    tol = {"rtol": 1e-4, "atol": 1e-8, "exact": False, "ignore": False, "scale": "recorded"}
    expected = [1.0, 0.1, 0.01, 0.001, 0.2]
    moved = [5e-5, 5e-5, 5e-5, 5e-5, 3e-4]
    allowed = [1e-8 + 1e-4 * max(abs(e), 1.0) for e in expected]
    comparisons = [
        {"kind": "metric", "metric": "pg_loss", "step": s, "expected": e, "actual": e + m,
         "verdict": "pass" if m / a <= 1 else "fail", "excess": m / a, "tolerance": tol,
         "scale": 1.0, "tolerance_source": "built-in default"}
        for s, (e, m, a) in enumerate(zip(expected, moved, allowed, strict=True))
    ]  # fmt: skip
    outcome = {"test": "t.py::test_train", "directory": str(tmp_path), "comparisons": comparisons}
    plot_outcome(outcome, tmp_path / "strip.png")
    bars, line = bars_and_line(drawn[-1].axes[1])
    assert line == 1.0
    for step, (e, m, a) in enumerate(zip(expected, moved, allowed, strict=True)):
        height, colour = bars[step]
        assert height == pytest.approx(abs((e + m) - e) / a, rel=1e-6)
        beyond = comparisons[step]["verdict"] == "fail"
        assert (height > line) == beyond, (step, height)
        assert colour == ("#d62728" if beyond else "#7f7f7f")
    assert "allowed" in drawn[-1].axes[1].get_ylabel()


def test_plot_of_two_goldens_draws_passing_steps_below_the_line(tmp_path, drawn):
    """The same through `rollout-golden plot A B`: a metric decaying far below its recorded
    magnitude, every step within tolerance (diff says so), every bar below the line."""
    for name, shift in (("a", 0.0), ("b", 5e-5)):
        with Golden(tmp_path / name, mode=Mode.AUTO) as golden:
            for step in range(4):
                golden.check({"pg_loss": 10.0**-step + shift}, step=step)
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--no-config"]) == 0
    out = tmp_path / "two.png"
    assert main(["plot", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(out)]) == 0
    bars, line = bars_and_line(drawn[-1].axes[1])
    assert sorted(bars) == [0, 1, 2, 3]
    assert all(height < line for height, _ in bars.values()), bars
    assert bars[3][0] == pytest.approx(5e-5 / (1e-8 + 1e-4 * 1.0), rel=1e-3)
