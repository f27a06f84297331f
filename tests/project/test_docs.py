"""The README and the docs site against the code: every option documented, every relative
link resolving, and the quickstart's shown output what the quickstart really prints."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_rollout_golden._internal.pytest_plugin.markers import MARKER_OPTIONS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "reference" / "configuration.md"
CLI = DOCS / "reference" / "cli.md"

LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_is_a_front_door_not_a_manual():
    assert len(README.read_text().splitlines()) <= 300


FENCE = re.compile(r"^```.*?^```", re.S | re.M)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.M)


def anchors(page: Path) -> set[str]:
    """The ids of a page's headings as the docs build makes them (mkdocs' toc with
    ``pymdownx.slugs.slugify(case="lower")``, a repeated heading getting ``_1``, ``_2``...),
    and the ids an attribute list ``{#id}`` gives."""
    from pymdownx.slugs import slugify

    slug = slugify(case="lower")
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        explicit = re.search(r"\{:?\s*#([\w-]+)[^}]*\}\s*$", heading)
        if explicit:
            found.add(explicit.group(1))
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
        text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
        base = candidate = slug(text, "-")
        n = 0
        while candidate in found:
            n += 1
            candidate = f"{base}_{n}"
        found.add(candidate)
    return found


# The docs build's slug function comes with the docs extra, not with the test extra.
SLUGS = importlib.util.find_spec("pymdownx") is not None
NO_SLUGS = "anchors are slugged as the docs build slugs them: pip install -e '.[docs]'"


def broken_links(page: Path, *, anchored: bool = True) -> list[str]:
    """Relative links of ``page`` whose file does not exist, or (``anchored``) whose
    ``#anchor`` names no heading of the Markdown page it points to."""
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchored and anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading #{anchor} in {path.name}")
    return broken


@pytest.mark.parametrize("page", [README, *sorted(DOCS.rglob("*.md"))], ids=lambda p: p.name)
def test_relative_links_resolve(page: Path):
    """mkdocs --strict checks links between pages; this also covers the README and links
    from the docs to files of the repository, and the anchor of every link to a page."""
    broken = broken_links(page, anchored=SLUGS)
    assert not broken, f"{page.relative_to(ROOT)} has broken links:\n" + "\n".join(broken)
    if not SLUGS:
        pytest.skip(f"files of links checked, not their anchors: {NO_SLUGS}")


def test_a_link_to_a_missing_heading_is_broken(tmp_path: Path):
    pytest.importorskip("pymdownx", reason=NO_SLUGS)
    (tmp_path / "a.md").write_text("# Title\n\n## Same-math `variants`\n\n## Title\n")
    (tmp_path / "b.md").write_text(
        "[ok](a.md#same-math-variants) [ok](a.md#title_1) [x](a.md#no-such-heading)\n"
        "[x](#nowhere) [x](c.md)\n\n# Here\n"
    )
    assert broken_links(tmp_path / "b.md") == [
        "a.md#no-such-heading: no heading #no-such-heading in a.md",
        "#nowhere: no heading #nowhere in b.md",
        "c.md: no such file",
    ]


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


OUR_MODULES = {"golden", "pytest_rollout_golden", "strategies", "invariants", "reference",
               "parallel", "mismatch", "vllm_batch", "sglang_batch", "quant"}  # fmt: skip


def public_callables() -> dict[str, object]:
    """Every public function and class of the package by name, and the fixture's methods as
    ``golden.<name>``."""
    import importlib
    import inspect

    from pytest_rollout_golden import Golden

    found: dict[str, object] = {}
    for module in ("", ".strategies", ".invariants", ".reference", ".parallel", ".mismatch",
                   ".vllm_batch", ".sglang_batch", ".quant", ".quant.manifest",
                   ".quant.sync"):  # fmt: skip
        mod = importlib.import_module(f"pytest_rollout_golden{module}")
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                found.setdefault(name, obj)
    for name, obj in vars(Golden).items():
        if inspect.isfunction(obj) and not name.startswith("_"):
            found[f"golden.{name}"] = obj
    return found


def code_blocks() -> list[tuple[str, int, str]]:
    """``(page, line, source)`` of every ```python block of the README and the docs."""
    blocks = []
    for page in [README, *sorted(DOCS.rglob("*.md"))]:
        text = page.read_text()
        for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            line = text[: match.start()].count("\n") + 1
            blocks.append((str(page.relative_to(ROOT)), line, match.group(1)))
    return blocks


@pytest.mark.parametrize(("page", "line", "source"), code_blocks(), ids=lambda v: str(v)[:30])
def test_code_examples_parse_and_call_the_api_as_it_is(page: str, line: int, source: str):
    """Examples that call the user's own code cannot run here; what they say of this
    package is checked: they parse, and every call of a public function, class or fixture
    method passes arguments its signature accepts."""
    import ast
    import inspect

    tree = ast.parse(source, filename=f"{page}:{line}")
    api = public_callables()
    wrong = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id not in OUR_MODULES:
                continue  # the user's own code (myrl.grpo_advantages), not ours
            name = f"golden.{func.attr}" if func.value.id == "golden" else func.attr
        elif isinstance(func, ast.Name):
            name = func.id
        else:
            continue
        target = api.get(name)
        if target is None:
            continue
        signature = inspect.signature(target)
        if name.startswith("golden."):
            signature = signature.replace(parameters=list(signature.parameters.values())[1:])
        if any(isinstance(a, ast.Starred) for a in node.args) or any(
            k.arg is None for k in node.keywords
        ):
            continue  # *args / **kwargs: nothing to check statically
        try:
            signature.bind(*node.args, **{k.arg: k.value for k in node.keywords if k.arg})
        except TypeError as exc:
            wrong.append(f"{page}:{line + node.lineno}: {name}(...): {exc}")
    assert not wrong, "\n".join(wrong)


def test_the_checkers_guide_examples_run():
    """The checkers guide's examples are complete programs: each ```python block runs, and
    defines tests that pass (on a few derandomized examples). A bug planted in one of them
    fails with the message the guide shows (its ``checkers-*`` outputs of doc_outputs.py)."""
    from doc_outputs import CHECKERS_GUIDE, python_blocks, run_guide_program

    programs = python_blocks(CHECKERS_GUIDE)
    without_tests = [line for line, source in programs if not run_guide_program(line, source)]
    assert len(programs) >= 12 and not without_tests, (len(programs), without_tests)


def test_the_site_stylesheet_keeps_wide_output_readable():
    """Mismatch tables and flags are wider than a laptop's page: code blocks scroll, and a
    table cell never breaks an identifier (`token_mult_prob_erro r`)."""
    config = (ROOT / "mkdocs.yml").read_text()
    sheets = re.findall(r"^extra_css:\n((?:  - .+\n)+)", config, re.M)
    assert sheets, "mkdocs.yml names no extra_css"
    css = "".join((DOCS / s.strip()[2:]).read_text() for s in sheets[0].splitlines())
    rules = {
        sel.strip(): body
        for sels, body in re.findall(r"([^{}/]+)\{([^}]*)\}", css)
        for sel in sels.split(",")
    }
    assert "white-space: nowrap" in rules[".md-typeset td code"]
    assert "overflow-x: auto" in rules[".md-typeset pre > code"]
    assert "overflow-x: auto" in rules[".md-typeset__scrollwrap"]
    # the theme's 4 px pale scrollbar read as a block cut at its right edge: a visible bar,
    # and an edge shadow while more lies beyond (layers that scroll with the text hide it)
    code = rules[".md-typeset pre > code"]
    assert "scrollbar-width: auto" in code and "scrollbar-color" in code
    assert code.count("local") == 2 and code.count("radial-gradient") == 2
    assert "height: 0.6rem" in rules[".md-typeset pre > code::-webkit-scrollbar"]


def mkdocs_build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``project`` as .ci/run runs it (not --quiet: it would hide
    the warnings --strict counts)."""
    pytest.importorskip(
        "mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'"
    )
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(command, cwd=project, capture_output=True, text=True, env=env)


def test_the_strict_docs_build_passes_and_fails_on_a_broken_anchor(tmp_path: Path):
    built = mkdocs_build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stderr[-3000:]
    site = tmp_path / "site"
    assert (site / "stylesheets" / "extra.css").read_text() == (
        DOCS / "stylesheets" / "extra.css"
    ).read_text()
    for page in ("index.html", "guide/bisect/index.html", "reference/cli/index.html"):
        assert re.search(r'<link[^>]+href="[./]*stylesheets/extra\.css"', (site / page).read_text())
    bisect = (site / "guide" / "bisect" / "index.html").read_text()
    assert re.search(
        r'<img[^>]+class="figure"[^>]+src="\.\./\.\./figures/bisect\.png"', bisect
    ) or (re.search(r'<img[^>]+src="\.\./\.\./figures/bisect\.png"[^>]+class="figure"', bisect)), (
        "the figure is not an image of the built page"
    )
    assert (site / "figures" / "bisect.png").is_file()

    copy = tmp_path / "copy"
    shutil.copytree(DOCS, copy / "docs")
    ignored = shutil.ignore_patterns("__pycache__")  # the pages include files of examples/
    shutil.copytree(ROOT / "examples", copy / "examples", ignore=ignored)
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(ROOT / name, copy / name)
    (copy / "pytest_rollout_golden").symlink_to(ROOT / "pytest_rollout_golden")
    page = copy / "docs" / "index.md"
    page.write_text(page.read_text() + "\nSee [x](guide/ci.md#no-such-heading).\n")
    broken = mkdocs_build(copy, tmp_path / "site2")
    assert broken.returncode != 0
    assert "no-such-heading" in broken.stderr, broken.stderr[-3000:]


OUTPUT_BLOCK = re.compile(r"^<!-- output: ([\w-]+) -->\n```\w*\n(.*?)^```$", re.S | re.M)
PAGES = [README, *sorted(DOCS.rglob("*.md"))]


def output_blocks() -> list[tuple[Path, str]]:
    """``(page, name)`` of every block of output a page marks with ``<!-- output: NAME -->``."""
    return [(page, m.group(1)) for page in PAGES for m in OUTPUT_BLOCK.finditer(page.read_text())]


def test_every_output_function_is_shown_once():
    from doc_outputs import OUTPUTS

    names = [name for _, name in output_blocks()]
    assert sorted(names) == sorted(OUTPUTS), "each function of doc_outputs.py, one marked block"


@pytest.mark.parametrize(("page", "name"), output_blocks(), ids=lambda v: getattr(v, "name", v))
def test_output_shown_in_the_docs_is_what_the_code_prints(page: Path, name: str, tmp_path: Path):
    """Every marked block is what its function in doc_outputs.py prints now (up to another
    CPU's rounding for the outputs of ``doc_outputs.ROUNDED``, and but for the commit hashes
    of those of ``doc_outputs.HASHED``). When the code's output
    changes on purpose, rewrite the blocks:
    ``UPDATE_DOC_OUTPUTS=1 pytest tests/project/test_docs.py -k output -p no:xdist``."""
    from doc_outputs import OUTPUTS, same_output

    produced = OUTPUTS[name](tmp_path)
    text = page.read_text()
    block = next(m for m in OUTPUT_BLOCK.finditer(text) if m.group(1) == name)
    matches = same_output(name, block.group(2), produced)
    if os.environ.get("UPDATE_DOC_OUTPUTS") == "1":
        if not matches:  # another CPU's rounding alone leaves the page as it is
            page.write_text(text[: block.start(2)] + produced + text[block.end(2) :])
        return
    assert matches, (
        f"{page.relative_to(ROOT)} shows an output of {name!r} the code no longer prints; "
        "UPDATE_DOC_OUTPUTS=1 rewrites it. The code prints:\n" + produced
    )


@pytest.mark.parametrize(
    ("shown", "printed", "same"),
    [
        ("kl  1.36e-07  0/3", "kl  1.37e-07  0/3", True),  # another CPU's last digit
        ("grad_norm 1.78x", "grad_norm 1.79x", True),
        ("actual 0.746858213165892   0.75", "actual 0.7468582684134508  0.75", True),
        ("kl 165x beyond", "kl 166x beyond", True),
        ("kl  1.36e-07", "kl  1.46e-07", False),  # beyond rounding
        ("first fail at step 4", "first fail at step 5", False),  # a step is exact
        ("Mismatched elements: 12 / 192", "Mismatched elements: 13 / 192", False),
        ("grad_norm 1.78x", "entropy 1.78x", False),  # words are exact
    ],
)
def test_a_rounded_output_is_compared_up_to_its_last_printed_digit(shown, printed, same):
    from doc_outputs import same_output

    assert same_output("cli-diff", shown, printed) is same
    assert same_output("cli-verify", shown, printed) is (shown == printed)  # exact outputs


def test_the_defaults_table_is_what_the_code_resolves():
    """Each row of the defaults table of docs/guide/tolerances.md: the names it lists resolve
    to its rtol and atol (the trl profile's row under that profile, bf16's under
    ``golden_precision = bf16``); a glob is tried on a name it matches."""
    from pytest_rollout_golden._internal.tolerance import families
    from pytest_rollout_golden._internal.tolerance.stack import Stack

    page = (DOCS / "guide" / "tolerances.md").read_text()
    table = page.split("## Built-in defaults", 1)[1].split("\n## ", 1)[0]
    stacks = {
        "trl": Stack(profile=families.profile_layers("trl")[0]),
        "bf16": Stack(precision=families.precision_layer("bf16", "ini golden_precision")),
    }
    checked = set()
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        if len(cells) != 5 or not re.fullmatch(r"\d[\d.e-]*", cells[2]):
            continue  # the header, the rule, the row of values never compared
        family, names, rtol, atol = cells[:4]
        stack = next((s for key, s in stacks.items() if key in family), Stack())
        listed = re.findall(r"`([\w/*]+)`", re.sub(r"\([^)]*\)", "", names)) or ["some_value"]
        for name in listed:
            found, _ = stack.resolver().resolve(name.replace("*", "x"), ("float32",))
            assert (found.rtol, found.atol) == (float(rtol), float(atol)), (family, name, found)
        checked.add(family.split(" (")[0])
    assert {"loss", "training", "centred loss", "bf16"} <= checked


# ---------------------------------------------------------------- figures (docs/figures/)

FIGURE = re.compile(r"!\[[^\]]+\]\(([^)\s]+\.png)\)")


def test_every_figure_is_small_shown_by_a_page_and_in_the_manifest():
    from doc_figures import DRAWN, FIGURES, MANIFEST, MAX_BYTES, png_size

    manifest = json.loads(MANIFEST.read_text())
    assert sorted(p.name for p in FIGURES.glob("*.png")) == sorted(DRAWN) == sorted(manifest)
    shown = {
        (page.parent / target).resolve()
        for page in DOCS.rglob("*.md")
        for target in FIGURE.findall(FENCE.sub("", page.read_text()))
    }
    for name in DRAWN:
        path = FIGURES / name
        assert path.resolve() in shown, f"no page shows docs/figures/{name}"
        assert path.stat().st_size < MAX_BYTES, f"{name}: {path.stat().st_size} bytes"
        entry = manifest[name]
        assert png_size(path) == (entry["width"], entry["height"]), name


@pytest.mark.parametrize(
    "name", ["drift.png", "envelope.png", "lanes.png", "bisect.png", "changepoint.png"]
)
def test_a_figure_is_what_the_code_draws_now(name: str, tmp_path: Path):
    """Redrawn, a figure draws the same data with the same drawing code into a picture of
    the same size (pixels differ between matplotlib versions: not compared). When the code
    changes what it draws, redraw them: ``python tests/project/doc_figures.py``."""
    pytest.importorskip("matplotlib")
    from doc_figures import DRAWN, MANIFEST, draw

    assert name in DRAWN
    recorded = json.loads(MANIFEST.read_text())[name]
    assert draw(name, tmp_path / name) == recorded, (
        f"docs/figures/{name} is not what the code draws now; "
        "redraw: python tests/project/doc_figures.py"
    )


@pytest.mark.parametrize(
    ("shown", "printed", "same"),
    [
        ("A: f513331981 record goldens (exit 0)", "A: 1f23ae120c record goldens (exit 0)", True),
        ("A: f513331981 record goldens (exit 0)", "A: 1f23ae120c record goldens (exit 1)", False),
        ("pg_loss  step 0  3/3  0.00075", "pg_loss  step 0  2/3  0.00075", False),
        ("pg_loss  0.6256249999999999", "pg_loss  0.6256249999999998", False),  # exact
    ],
)
def test_a_hashed_output_is_exact_but_for_its_commit_hashes(shown, printed, same):
    from doc_outputs import same_output

    assert same_output("cli-compare", shown, printed) is same


def test_an_output_that_needs_tokenizers_is_skipped_without_it(monkeypatch, tmp_path):
    from doc_outputs import OUTPUTS

    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if not installed
    with pytest.raises(pytest.skip.Exception, match="tokenizers"):
        OUTPUTS["token-ids-kept"](tmp_path)
