"""The README and the docs site against the code: every option documented, every relative
link resolving, and the quickstart's shown output what the quickstart really prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_rollout_golden.markers import MARKER_OPTIONS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "reference" / "configuration.md"
CLI = DOCS / "reference" / "cli.md"

LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_is_a_front_door_not_a_manual():
    assert len(README.read_text().splitlines()) <= 300


@pytest.mark.parametrize("page", [README, *sorted(DOCS.rglob("*.md"))], ids=lambda p: p.name)
def test_relative_links_resolve(page: Path):
    """mkdocs --strict checks links between pages; this also covers the README and links
    from the docs to files of the repository."""
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{page.relative_to(ROOT)} links to missing {target}"


def pytest_help(pytester: pytest.Pytester) -> str:
    return pytester.runpytest_subprocess("--help").stdout.str()


def test_every_flag_and_ini_option_is_in_the_configuration_reference(pytester: pytest.Pytester):
    text = CONFIGURATION.read_text()
    usage = pytest_help(pytester)
    flags = set(re.findall(r"(--(?:no-)?(?:update-)?golden[\w-]*)", usage))
    ini = set(re.findall(r"^\s+(golden_\w+)", usage, re.M))
    assert len(flags) >= 15 and len(ini) >= 7, (flags, ini)
    missing = sorted(o for o in flags | ini if f"`{o}" not in text)
    assert not missing, f"not documented in {CONFIGURATION.name}: {missing}"


def test_every_marker_option_is_in_the_configuration_reference():
    text = CONFIGURATION.read_text()
    missing = sorted(o for o in MARKER_OPTIONS if f"`{o}=" not in text and f"`{o}`" not in text)
    assert not missing, f"marker options not documented: {missing}"


def cli_help(*args: str) -> str:
    command = [sys.executable, "-m", "pytest_rollout_golden", *args, "-h"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def test_every_cli_verb_and_option_is_in_the_cli_reference():
    text = CLI.read_text()
    verbs = re.search(r"\{([\w,]+)\}", cli_help()).group(1).split(",")
    assert {"verify", "show", "diff", "plot", "import"} <= set(verbs)
    missing = []
    for verb in verbs:
        if f"`{verb}" not in text and f"rollout-golden {verb}" not in text:
            missing.append(verb)
        for option in set(re.findall(r"(--[a-z][\w-]+)", cli_help(verb))) - {"--help"}:
            if option not in text:
                missing.append(f"{verb} {option}")
    assert not missing, f"not documented in {CLI.name}: {sorted(missing)}"


def quickstart() -> tuple[str, list[list[str]]]:
    """The quickstart's test file and the output blocks shown after each ``$ pytest -q``."""
    text = README.read_text()
    section = text.split("[start:quickstart]")[1].split("[end:quickstart]")[0]
    source = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    blocks = re.findall(r"```\n\$ pytest -q[^\n]*\n(.*?)```", section, re.S)
    return source, [block.splitlines() for block in blocks]


def shown_lines(block: list[str]) -> list[str]:
    """The lines of an output block that do not depend on the machine (not timings or
    progress dots, not a shell command)."""
    return [
        line.strip()
        for line in block
        if line.strip()
        and not re.search(r"\d+ (passed|failed) in [\d.]+s|\[100%\]|^\$ |^=+ ?\w*", line)
    ]


def test_the_quickstart_prints_what_the_readme_shows(pytester: pytest.Pytester, monkeypatch):
    monkeypatch.delenv("CI", raising=False)  # the quickstart records on its first run
    source, (first, drifted, updated) = quickstart()
    pytester.makeini("[pytest]\n")
    pytester.mkpydir("tests")
    test_file = pytester.path / "tests" / "test_policy_loss.py"
    test_file.write_text(source)

    def run(*args: str) -> list[str]:
        result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", *args)
        return [line.strip() for line in result.stdout.lines]

    for args, block, change in [
        ((), first, None),
        ((), drifted, ("0.01 * step", "0.011 * step")),
        (("--update-golden",), updated, None),
    ]:
        if change:
            test_file.write_text(source.replace(*change))
        output = run(*args)
        missing = [line for line in shown_lines(block) if line not in output]
        assert not missing, "README shows lines the run did not print:\n" + "\n".join(missing)


def test_every_module_is_in_the_architecture_page():
    text = (DOCS / "architecture.md").read_text()
    package = ROOT / "pytest_rollout_golden"
    missing = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if path.stem.startswith("_"):
            continue
        names = [f"`{relative.as_posix()}`", f"`{path.name}`"]
        if len(relative.parts) > 1:
            names.append(f"`{relative.parts[0]}/`")
        if not any(name in text for name in names):
            missing.append(relative.as_posix())
    assert not missing, f"modules missing from docs/architecture.md: {missing}"
