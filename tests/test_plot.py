"""rollout-golden plot and pytest --golden-plot: PNGs of metric curves, matplotlib optional."""

from __future__ import annotations

import builtins
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


def test_plot_without_matplotlib_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    record(tmp_path / "a")
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
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
    pictures = sorted((project.path / "plots").iterdir())
    assert [p.name for p in pictures] == [
        "test_it.py__test_train~" + pictures[0].name.split("~")[1]
    ]
    assert pictures[0].read_bytes().startswith(PNG)
    result.stdout.fnmatch_lines(["golden plots written (--golden-plot):", "    plots/test_it.py*"])


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
