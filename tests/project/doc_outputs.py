"""The outputs the docs show, produced by the code: one function per ``<!-- output: NAME -->``
mark of the README and the docs (``test_docs.py`` compares, and rewrites them under
``UPDATE_DOC_OUTPUTS=1``).

Each function gets an empty working directory and returns the block's text exactly as the
page shows it: commands as ``$ ...`` lines, then what they printed, the working directory
spelled as the page spells it. Where a page shows part of an output, the function cuts it.

Most outputs are the same to the byte on every machine: their numbers are exact (steps,
counts, float64 values of exactly representable inputs), and an example whose numbers depend
on the thread count runs at a fixed one (:func:`toy_env`). Those in :data:`HASHED` print the
commit hashes of a project whose goldens this machine recorded: a golden's manifest holds the
machine's fingerprint (torch version, device, thread count), so the hashes differ from machine
to machine; the function checks that each printed hash is the commit it names, and
:func:`same_output` compares them as any commit hash. Those in :data:`ROUNDED` print
values that float32 or bfloat16 training computed on this CPU (the tiny GRPO example, its
resume, the float32 reference policy against a committed golden): another CPU's vector width
or thread count changes their last bits, so a printed last digit or a column's width may
differ (``kl`` 1.36e-07 or 1.37e-07). Making them deterministic would mean training the
examples in float64 and without the bf16 engine, which is not what they show; so
:func:`same_output` compares them robustly instead: the same words, the same integers below
100, every other number within one unit of its last printed digit or 1e-3 relative.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "golden/examples/test_tiny_rl_golden/test_grpo_training_matches_golden"

OUTPUTS: dict[str, Callable[[Path], str]] = {}


# Outputs of values computed in float32 or bfloat16 on this CPU: compared by same_output.
ROUNDED = frozenset(
    {"cli-diff", "cli-diff-json", "resume-forget-optimizer", "resume-metrics-only",
     "parallel-mismatch"}
)  # fmt: skip
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
# Outputs of commit hashes that hold this machine's goldens: compared as any hash.
HASHED = frozenset({"cli-compare", "cli-compare-upgrade"})
COMMIT = re.compile(r"\b[0-9a-f]{10}\b")  # a commit as compare and bisect print it


def same_output(name: str, shown: str, printed: str) -> bool:
    """Whether a page's block ``shown`` is what output ``name`` ``printed``: the same text,
    or, for an output of :data:`ROUNDED`, the same up to its float rounding (runs of spaces
    as one, each number within :func:`last_digit` of the other), for one of :data:`HASHED`
    the same but for which commit hashes it prints."""
    if name in HASHED:
        return COMMIT.sub("<commit>", shown) == COMMIT.sub("<commit>", printed)
    if shown == printed or name not in ROUNDED:
        return shown == printed
    a, b = (re.sub(r"[ \t]+", " ", text) for text in (shown, printed))
    if NUMBER.split(a) != NUMBER.split(b):
        return False
    pairs = zip(NUMBER.findall(a), NUMBER.findall(b), strict=True)
    return all(x == y or abs(float(x) - float(y)) <= last_digit(x, y) for x, y in pairs)


def last_digit(x: str, y: str) -> float:
    """How far two printed numbers may differ by rounding alone: one unit of the last digit
    either prints (an integer below 100 none: a step, a count), or 1e-3 of their size."""
    units = []
    for text in (x, y):
        mantissa, _, exponent = text.lower().partition("e")
        decimals = len(mantissa.partition(".")[2])
        if "." in mantissa or exponent or len(mantissa.lstrip("+-")) > 2:
            units.append(10.0 ** (int(exponent or 0) - decimals))
    return max([1e-3 * max(abs(float(x)), abs(float(y))), *units]) * (1 + 1e-9)  # 1.79 - 1.78


def output(name: str) -> Callable[[Callable[[Path], str]], Callable[[Path], str]]:
    def register(function: Callable[[Path], str]) -> Callable[[Path], str]:
        OUTPUTS[name] = function
        return function

    return register


def environment() -> dict[str, str]:
    """This environment, not under CI (the examples record), with this checkout importable."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def command(cwd: Path, *args: str, env: dict[str, str] | None = None) -> tuple[str, int]:
    """``rollout-golden ARGS`` in ``cwd``: what a user's terminal shows, and the exit status."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest_rollout_golden", *args],
        cwd=cwd, env=env or environment(), capture_output=True, text=True,
    )  # fmt: skip
    return done.stdout + done.stderr, done.returncode


def shown(cwd: Path, *args: str, status: bool = False) -> str:
    """``$ rollout-golden ARGS``, its output and, with ``status``, ``$ echo $?`` and the status."""
    text, code = command(cwd, *args)
    lines = [f"$ rollout-golden {' '.join(args)}", text.rstrip("\n")]
    if status:
        lines += ["$ echo $?", str(code)]
    return "\n".join(lines) + "\n"


def run_pytest(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd, env=env or environment(), capture_output=True, text=True,
    )  # fmt: skip
    return done.stdout + done.stderr


def failure(pytest_output: str) -> str:
    """The failure a golden mismatch reports: from ``golden mismatch:`` to its last line."""
    lines = pytest_output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("golden mismatch:"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(("=", "_")))
    return "\n".join(lines[start:end]).rstrip("\n") + "\n"


# ---------------------------------------------------------------- docs/reference/cli.md


@output("cli-verify")
def cli_verify(work: Path) -> str:
    return shown(ROOT, "verify", "golden/")


@output("cli-show")
def cli_show(work: Path) -> str:
    """The example's golden, up to its second file."""
    text = shown(ROOT, "show", EXAMPLE)
    return text.split("rollout-rollout-step000001")[0] + "...\n"


@output("cli-verify-problems")
def cli_verify_problems(work: Path) -> str:
    """``verify`` of copies of three committed goldens, one edited by hand and one left
    half-committed, then of a path that does not exist."""
    example = "examples/test_tiny_rl_golden"
    for name in ("@shared/parallel-policy-float32", f"{example}/grpo_layouts", EXAMPLE[7:]):
        shutil.copytree(ROOT / "golden" / name, work / "golden" / name)
    with (work / "golden" / "@shared" / "parallel-policy-float32" / "metrics.json").open("a") as f:
        f.write(" ")
    layouts = work / "golden" / example
    shutil.copytree(layouts / "grpo_layouts", layouts / ".grpo_layouts.new-4242")
    edited = shown(work, "verify", "golden", status=True).replace(
        "verify golden\n", "verify golden    # one edited metrics.json, one interrupted update\n", 1
    )
    return edited + shown(work, "verify", "nope", status=True)


TRAINED: list[Path] = []  # the example's project, trained once per session


def example_roots(work: Path) -> Path:
    """The example trained twice: ``golden_a`` with ``kl_coef`` 0.01, ``golden_b`` with 0.02."""
    if TRAINED and TRAINED[0].exists():
        return TRAINED[0]
    project = work / "ex"
    project.mkdir()
    shutil.copy(ROOT / "examples" / "tiny_rl.py", project)
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_tiny_rl_golden.py").write_text(
        "import os\n"
        "from tiny_rl import TrainConfig, generate_rollout, make_trainer, ppo_step\n\n"
        "def test_grpo_training_matches_golden(golden):\n"
        "    model, ref, optimizer = make_trainer()\n"
        "    cfg = TrainConfig(kl_coef=float(os.environ['KL_COEF']))\n"
        "    for step in range(3):\n"
        "        batch = golden.rollout(lambda step=step: generate_rollout(model, step=step),"
        " step=step)\n"
        "        golden.check(ppo_step(model, ref, optimizer, batch, cfg), step=step)\n"
    )
    for root, coef in (("golden_a", "0.01"), ("golden_b", "0.02")):
        run_pytest(project, f"--golden-dir={root}", env=environment() | {"KL_COEF": coef})
    TRAINED[:] = [project]
    return project


def in_example(text: str, project: Path) -> str:
    return text.replace(str(project), "/tmp/ex")


@output("cli-diff")
def cli_diff(work: Path) -> str:
    project = example_roots(work)
    return in_example(shown(project, "diff", "golden_a", "golden_b", status=True), project)


@output("cli-diff-json")
def cli_diff_json(work: Path) -> str:
    """The JSON of the same diff, each golden's first metric and tensor beyond tolerance."""
    project = example_roots(work)
    text, _ = command(project, "diff", "golden_a", "golden_b", "--json")
    document = json.loads(in_example(text, project))
    for golden in document["goldens"]:
        golden["a"] = golden["b"] = "..."
        for kind in ("metrics", "tensors"):
            beyond = [row for row in golden[kind] if not row["ok"]]
            golden[kind] = [*beyond[:1], "..."]
    return laid_out(document, depth=3) + "\n"


def tiny_git_project(work: Path) -> Path:
    """The tiny git project of ``tests/commits``: goldens recorded, a commit of notes, then
    a 1e-3 bug in the loss (fixed dates: the same commit hashes on every run)."""
    sys.path.insert(0, str(ROOT / "tests" / "commits"))
    from tinyrepo import TinyRepo

    repo = TinyRepo(work / "project")
    repo.record()
    repo.commit("notes", {"notes.txt": "unrelated"})
    repo.bug()
    return repo.path


@output("cli-compare")
def cli_compare(work: Path) -> str:
    """``compare`` of the commit that recorded the goldens against the bug, times as ``…``."""
    import re

    project = tiny_git_project(work)
    from history import git  # tests/commits/, on the path now

    text = shown(project, "compare", "HEAD~2", "HEAD", "--jobs", "2", "--", "-q", status=True)
    for side, rev in (("A", "HEAD~2"), ("B", "HEAD")):  # the hashes same_output leaves open
        assert f"\n{side}: {git(project, 'rev-parse', rev)[:10]} " in text, text
    return re.sub(r"exit (\d+), [\d.]+ s\)", r"exit \1, … s)", in_example(text, project))


@output("cli-compare-upgrade")
def cli_compare_upgrade(work: Path) -> str:
    """``compare HEAD HEAD`` with the old and the upgraded environment of ``tests/commits/
    upgrade.py``; this machine's Python and torch versions and the times as ``…``."""
    import re

    sys.path.insert(0, str(ROOT / "tests" / "commits"))
    from history import git
    from upgrade import build

    repo, envs = build(work)
    args = ["compare", "HEAD", "HEAD", "--python-a", envs["old"], "--python-b", envs["new"]]
    text = shown(repo.path, *args, "--jobs", "2", status=True)
    head = git(repo.path, "rev-parse", "HEAD")[:10]
    assert f"\nA: {head} " in text and f"\nB: {head} " in text, text
    text = in_example(text, repo.path).replace(str(work / "envs"), "/tmp/envs")
    text = re.sub(
        r"Python [\w.+]+; pytest: exit (\d+), [\d.]+ s\)", r"Python …; pytest: exit \1, … s)", text
    )
    return re.sub(r"torch \S+ on both sides", "torch … on both sides", text)


LONG_RUN: list[Path] = []  # a 12-step golden calibrated over 3 runs, once per session
LONG_TEST = """\
import math, pathlib

def test_long(golden):
    counter = pathlib.Path(__file__).with_name("runs.txt")
    run = int(counter.read_text()) if counter.exists() else 0
    if not golden.certifying:  # the float64 oracle run of calibration drifts not: no count
        counter.write_text(str(run + 1))  # 0: the recording; then each calibration run
    for step in range(12):
        drifts = run and not golden.certifying
        drift = 1e-4 * step * math.sin(1.7 * run + step) if drifts else 0.0  # grows with the step
        golden.check({"loss": 2.0 * math.exp(-step / 8) + 0.5 + drift, "lr": 1e-6}, step=step)
"""


def long_run(work: Path) -> Path:
    """A long run's golden, recorded, then calibrated over 3 runs: it has an envelope.json."""
    if LONG_RUN and LONG_RUN[0].exists():
        return LONG_RUN[0]
    project = work / "long"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_long.py").write_text(LONG_TEST)
    run_pytest(project)
    run_pytest(project, "--golden-calibrate", "3")
    LONG_RUN[:] = [project]
    return project


@output("cli-show-envelope")
def cli_show_envelope(work: Path) -> str:
    """``show`` of the long run's golden: from its calibrated tolerances on."""
    project = long_run(work)
    text = shown(project, "show", "golden/test_long/test_long")
    command_line = text.splitlines()[0]
    shown_part = text[text.index("calibrated tolerances") : text.index("sensitivity (")]
    return f"{command_line}\n...\n" + shown_part


@output("cli-show-sensitivity")
def cli_show_sensitivity(work: Path) -> str:
    """``show`` of the example's golden: its last section, what each gate detects."""
    text = shown(ROOT, "show", EXAMPLE)
    return f"{text.splitlines()[0]}\n...\n" + text[text.index("sensitivity (") :]


@output("ci-sensitivity")
def ci_sensitivity(work: Path) -> str:
    """The example's gates probed under a floor of 1e-3: the section, and the exit status.
    The probed values are the committed golden's, so the numbers are the same everywhere."""
    args = ("examples/test_tiny_rl_golden.py::test_grpo_training_matches_golden",
            "--golden-sensitivity-require=1e-3")  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT, env=environment(), capture_output=True, text=True,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "= golden sensitivity =" in line)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("="))
    return (
        "\n".join(
            [f"$ pytest {' '.join(args)}", *lines[start:end], "$ echo $?", str(done.returncode)]
        )
        + "\n"
    )


# ---------------------------------------------------------------- docs/guide/recording.md


@output("recording-missing-step")
def recording_missing_step(work: Path) -> str:
    """A 5-step run over a 3-step recording under three policies: the error's line, and what
    passed without pytest's last line (its timing)."""
    test = work / "tests" / "test_steps.py"
    test.parent.mkdir()
    (work / "pytest.ini").write_text("[pytest]\n")
    test.write_text(
        "import torch\n\n"
        "def test_ppo(golden):\n"
        "    for step in range(STEPS):\n"
        "        batch = golden.rollout(lambda s=step: {'x': torch.full((4,), s)}, step=step)\n"
        "        golden.check({'pg_loss': float(batch['x'].sum())}, step=step)\n"
        "STEPS = 3\n"
    )
    run_pytest(work)
    test.write_text(test.read_text().replace("STEPS = 3", "STEPS = 5"))
    block = []
    for policy in ("error", "generate", "repeat"):
        args = [
            *(["--golden-strict"] if policy == "generate" else []),
            f"--golden-missing-step={policy}",
        ]
        lines = run_pytest(work, *args).splitlines()
        if policy == "error":
            lines = [
                line for line in lines if "GoldenMissingError:" in line and line.startswith("E ")
            ]
        else:
            lines = lines[:-1]
        block += [f"$ pytest -q {' '.join(args)}", *lines]
    return "\n".join(block) + "\n"


@output("recording-nan-and-typo")
def recording_nan_and_typo(work: Path) -> str:
    test = work / "test_guards.py"
    (work / "pytest.ini").write_text("[pytest]\n")
    test.write_text(
        "import math\n\n"
        "def test_nan(golden):\n"
        "    golden.check({'kl': math.nan, 'pg_loss': 0.25})\n"
    )
    run_pytest(work)
    test.write_text(test.read_text().replace("'pg_loss'", "'pg_los'"))
    return failure(run_pytest(work))


@output("recording-mask")
def recording_mask(work: Path) -> str:
    test = work / "test_mask.py"
    (work / "pytest.ini").write_text("[pytest]\n")
    test.write_text(
        "import torch\n\n"
        "def test_mask(golden):\n"
        "    log_probs = torch.tensor([[-1.0, -2.0, -0.5, -9.0], [-0.25, -0.75, -9.0, -9.0]])\n"
        "    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)\n"
        "    log_probs[1, 1] += SHIFT\n"
        "    golden.check_tensors('actor', {'log_probs': log_probs}, mask=mask)\n"
        "SHIFT = 0.0\n"
    )
    run_pytest(work)
    test.write_text(test.read_text().replace("SHIFT = 0.0", "SHIFT = 0.5"))
    lines = failure(run_pytest(work)).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("tensor '"))
    detail = [line for line in lines[start:] if line.startswith(("tensor '", " "))]
    return "\n".join(detail) + "\n"  # the tensor's detail, after the headline


# ---------------------------------------------------------------- docs/guide/tolerances.md


@output("tolerances-order")
def tolerances_order(work: Path) -> str:
    """The resolution order, the layers as ``Stack.resolver`` stacks them (``stack.ORDER``),
    under one call's tolerances and over the training-value default; then what replaces it."""
    import textwrap

    from pytest_rollout_golden._internal.tolerance import families
    from pytest_rollout_golden._internal.tolerance.stack import ORDER

    training = families.TRAINING
    layers = [
        "golden.check(..., tolerances={...}): that call's",
        *(what.replace("`", "") for _, what in ORDER),
        f"the training-value default for any other floating-point name: rtol {training.rtol:g} "
        "of its recorded magnitude (torch.testing's default of a 16- or 8-bit float where "
        "looser); integers and bools compare exactly",
    ]
    lines = []
    for number, text in enumerate(layers, 1):
        lines += textwrap.wrap(text, 92, initial_indent=f"{number:2}. ", subsequent_indent="    ")
    certify = families.CERTIFY
    lines += [
        "",
        *textwrap.wrap(
            "Over every layer: an exclusion (ignore) wins from any layer (from one of defaults "
            "only as the highest match); the exact lane (exact=True, --golden-exact) replaces "
            "every tolerance by bit equality; "
            f"--golden-certify by the float64 oracle bound (rtol {certify.rtol:g}, atol "
            f"{certify.atol:g}, scale=recorded).",
            96,
        ),
    ]
    return "\n".join(lines) + "\n"


@output("tolerances-partial")
def tolerances_partial(work: Path) -> str:
    test = work / "test_partial.py"
    (work / "pytest.ini").write_text("[pytest]\n")
    test.write_text(
        "import pytest\n\n"
        "@pytest.mark.golden(tolerances={'pg_loss': {'rtol': 1e-3}, 'kl': {'equal_nan': True}})\n"
        "def test_step(golden):\n"
        "    golden.check({'pg_loss': 0.25 * DRIFT, 'kl': 0.01 * DRIFT}, step=0)\n"
        "DRIFT = 1.0\n"
    )
    run_pytest(work)
    test.write_text(test.read_text().replace("DRIFT = 1.0", "DRIFT = 1.002"))
    return failure(run_pytest(work))


# ---------------------------------------------------------------- docs/guide/parallel.md


@output("parallel-mismatch")
def parallel_mismatch(work: Path) -> str:
    """The deliberately wrong ``dp-double-norm`` variant against the committed reference golden:
    the headline, the first three metrics, the first tensor and the last line."""
    shutil.copytree(
        ROOT / "golden" / "@shared" / "parallel-policy-float32",
        work / "golden" / "@shared" / "parallel-policy-float32",
    )
    (work / "pytest.ini").write_text("[pytest]\n")
    (work / "test_faulty.py").write_text(
        "import pytest\n"
        "from pytest_rollout_golden.parallel import Layout, layout_params\n"
        "from pytest_rollout_golden.parallel.policy import (\n"
        "    PolicyConfig, check_step, make_rollout, run)\n\n"
        "CFG = PolicyConfig()\n"
        "FAULTY = [Layout(dp=2, micro_batches=4, fault='dp-double-norm')]\n\n"
        "@pytest.mark.golden(shared='parallel-policy-float32')\n"
        "@pytest.mark.parametrize('layout', layout_params(FAULTY)[1:])\n"
        "def test_gate(golden, layout):\n"
        "    batches = [golden.rollout(lambda s=s: make_rollout(CFG, s), step=s)\n"
        "               for s in range(3)]\n"
        "    for step, result in enumerate(run(layout, CFG, batches)):\n"
        "        check_step(golden, result, step=step)\n"
    )
    lines = failure(run_pytest(work)).splitlines()
    tensor = next(i for i, line in enumerate(lines) if line.startswith("tensor '"))
    return "\n".join([*lines[:6], "  ...", *lines[tensor : tensor + 4], "...", lines[-1]]) + "\n"


CRITIC_LAYOUTS = """\
from pytest_rollout_golden.parallel import Layout
from pytest_rollout_golden.parallel.policy import CRITIC_METRICS, PolicyConfig, make_rollout, run

cfg = PolicyConfig(dtype="float64", critic=True)
batches = [make_rollout(cfg, step) for step in range(2)]
one = run(Layout(), cfg, batches)
print("single process, step 0:")
print("".join(f"{name:>20}" for name in CRITIC_METRICS))
print("".join(f"{one[0].metrics[name]:20.4f}" for name in CRITIC_METRICS))
print("max relative difference over 2 steps:")
for layout in [
    Layout(tp=2, pp=2, micro_batches=2),
    Layout(dp=2, packing=True, micro_batches=2),
    Layout(cp=2, packing=True),
    Layout(fault="critic-micro-norm"),
    Layout(micro_batches=4, fault="critic-micro-norm"),
    Layout(dp=2, fault="critic-micro-norm"),
]:
    result = run(layout, cfg, batches)
    print(layout.id)
    for name in CRITIC_METRICS:
        moved = max(abs(a.metrics[name] / e.metrics[name] - 1) for a, e in zip(result, one))
        shown = f"{moved:.1e}" if moved > 1e-12 else "< 1e-12"
        print(f"{shown:>20}", end="")
    print()
"""


@output("parallel-critic")
def parallel_critic(work: Path) -> str:
    """The value head's metrics in three layouts and under the critic fault, float64."""
    (work / "critic_layouts.py").write_text(CRITIC_LAYOUTS)
    done = subprocess.run(
        [sys.executable, "critic_layouts.py"],
        cwd=work, env=environment(), capture_output=True, text=True, check=True,
    )  # fmt: skip
    return "$ python critic_layouts.py\n" + done.stdout


# ---------------------------------------------------------------- docs/guide/mismatch.md


@output("mismatch-trend")
def mismatch_trend(work: Path) -> str:
    """30 steps whose engine drifts from the trainer by 0.001 -> 0.0033 nats, every step
    within the absolute bounds: the headline, the trend of the gap itself and the last line."""
    (work / "pytest.ini").write_text("[pytest]\n")
    (work / "test_drift.py").write_text(
        "import torch\n\n"
        "def test_run(golden):\n"
        "    train = torch.tensor([[-1.0, -0.5, -2.0, -0.1], [-0.3, -1.2, -0.8, -0.6]])\n"
        "    for step in range(30):\n"
        "        engine = train + 0.001 + 0.0023 * step / 29\n"
        "        golden.check_mismatch(train, engine, torch.ones_like(train), step=step)\n"
    )
    lines = failure(run_pytest(work)).splitlines()
    gap = next(i for i, line in enumerate(lines) if "abs_logprob_diff_mean growth =" in line)
    return "\n".join([lines[0], "...", *lines[gap : gap + 2], "...", lines[-1]]) + "\n"


BITWISE_TEST = """\
import math

import torch

from pytest_rollout_golden import bitwise

ENGINE = torch.tensor([[-0.5, -1.25, -2.0, -0.75], [-3.0, -0.125, -1.5, -4.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])


def test_one_ulp(golden):
    trainer = ENGINE.clone()
    trainer[1, 2] = torch.nextafter(trainer[1, 2], torch.tensor(-math.inf))
    golden.check_bitwise(trainer, ENGINE, MASK, control=ENGINE + 0.25)


def test_neutered_control(golden):
    golden.check_bitwise(ENGINE.clone(), ENGINE, MASK, control=ENGINE.clone())


class Tiny(torch.nn.Module):
    def __init__(self, bias):
        super().__init__()
        self.proj, self.head = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        with torch.no_grad():  # values whose sums and products are exact in float32
            self.proj.weight.copy_(torch.tensor([[0.5, 0.25], [1.0, -0.5]]))
            self.proj.bias.copy_(torch.tensor([0.0, bias]))
            self.head.weight.copy_(torch.tensor([[1.0, 2.0], [-1.0, 0.5]]))
            self.head.bias.zero_()

    def forward(self, x):
        return self.head(torch.relu(self.proj(x)))


def test_located(golden):
    trainer, engine = Tiny(0.5), Tiny(0.5 + 2**-20)
    x = torch.tensor([[1.0, 2.0]])
    with torch.no_grad():
        golden.check_bitwise(
            trainer(x), engine(x), step=0,
            locate=lambda: bitwise.first_divergence(
                trainer, lambda: trainer(x), lambda: engine(x), other=engine
            ),
        )
"""


@output("mismatch-bitwise")
def mismatch_bitwise(work: Path) -> str:
    """The bitwise lane on exactly representable values (the same bits on every CPU): a one-ULP
    break, a neutered control, and a break located in the first module that differs."""
    (work / "pytest.ini").write_text("[pytest]\n")
    (work / "test_bitwise.py").write_text(BITWISE_TEST)
    lines = run_pytest(work).splitlines()
    starts = ("bitwise train-inference", "inconclusive", "    first module")
    return "\n".join(line for line in lines if line.startswith(starts)) + "\n"


# ---------------------------------------------------------------- docs/guide/fp8.md


PRECISION_TEST = """\
import torch

from pytest_rollout_golden.quant.manifest import Rules

SHAPES = {
    "model.embed_tokens.weight": (64, 32),
    "model.layers.0.self_attn.o_proj.weight": (32, 32),
    "model.layers.0.mlp.gate_proj.weight": (64, 32),
    "model.layers.1.mlp.gate.weight": (4, 32),
    "model.layers.1.mlp.experts.gate_up_proj": (4, 64, 32),
    "lm_head.weight": (64, 32),
}
IGNORE = ["lm_head", "embed_tokens", "mlp.gate"]


def test_precision(golden):
    trainer = {name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in SHAPES.items()}
    golden.check_precision(trainer, rules=Rules("mxfp8", ignore=IGNORE + EXTRA, match=MATCH,
                                                source="vllm ignored_layers"))
"""


@output("fp8-precision")
def fp8_precision(work: Path) -> str:
    """A manifest recorded, then one layer moved to bf16 on the engine side; then the same
    ignore list matched by substring, as verl's filter does (verl#7519)."""
    (work / "pytest.ini").write_text("[pytest]\n")
    test = work / "test_precision.py"
    test.write_text(PRECISION_TEST + "EXTRA, MATCH = [], 'whole'\n")
    run_pytest(work)
    test.write_text(PRECISION_TEST + "EXTRA, MATCH = ['layers.0.self_attn.o_proj'], 'whole'\n")
    changed = failure(run_pytest(work)).splitlines()[1:]
    test.write_text(PRECISION_TEST + "EXTRA, MATCH = [], 'substring'\n")
    substring = [line for line in failure(run_pytest(work)).splitlines() if "substring" in line]
    return "\n".join([*changed, *substring]) + "\n"


@output("fp8-round-trip")
def fp8_round_trip(work: Path) -> str:
    """An MXFP8 refit of fused MoE experts whose gate/up halves landed swapped (verl#7986),
    and one whose experts 1 and 3 did; float64 on fixed weights (the same on every CPU)."""
    import torch

    from pytest_rollout_golden.quant import formats, sync

    g = torch.Generator().manual_seed(0)
    name = "model.layers.1.mlp.experts.gate_up_proj"
    master = {name: torch.randn(4, 16, 64, generator=g, dtype=torch.float64) * 0.02}
    q = formats.quantize(master[name].to(torch.bfloat16), "mxfp8_e4m3")
    codes = formats.dequantize(q)
    swapped = torch.cat([codes[:, 8:], codes[:, :8]], dim=1)
    lines = sync.round_trip(master, {name: swapped}, formats="mxfp8_e4m3").describe()
    reordered = codes[[0, 3, 2, 1]]
    lines += "\n" + sync.round_trip(master, {name: reordered}, formats="mxfp8_e4m3").describe()
    return lines + "\n"


# ---------------------------------------------------------------- docs/reference/configuration.md


SUMMARY_TEST = """\
import pytest

@pytest.mark.parametrize('tp', ['tp1', 'tp2'])
def test_ppo(golden, tp):
    drift = DRIFT if tp == 'tp1' else 1.0
    golden.check({'pg_loss': 0.6931471805599453 * drift, 'grad_norm': 1.5}, step=0)

def test_kl(golden):
    golden.check({'kl': 0.001}, step=0)

@pytest.mark.xfail(reason='known bug')
def test_buggy(golden):
    golden.check({'kl': 0.001 * DRIFT * DRIFT}, step=0)
"""


def summary(pytest_output: str) -> str:
    """The ``rollout golden`` section of pytest's terminal summary: up to pytest's next section
    or its last line (the counts and the timing)."""
    lines = pytest_output.splitlines()
    start = next(i for i, line in enumerate(lines) if "rollout golden" in line)
    ends = [i for i in range(start + 1, len(lines)) if lines[i].startswith("=")]
    return "\n".join(lines[start : (ends or [len(lines) - 1])[0]])


@output("summary")
def summary_example(work: Path) -> str:
    """A replay after a drift, a removed test, a new one and another recording environment;
    then the drifted test re-recorded."""
    test = work / "tests" / "test_ppo.py"
    test.parent.mkdir()
    (work / "pytest.ini").write_text("[pytest]\n")
    test.write_text(
        SUMMARY_TEST + "\ndef test_removed_case(golden):\n"
        "    golden.check({'kl': 0.5}, step=0)\nDRIFT = 1.0\n"
    )
    run_pytest(work)
    test.write_text(
        SUMMARY_TEST + "\ndef test_new(golden):\n"
        "    golden.check({'entropy': 2.5}, step=0)\nDRIFT = 1.001\n"
    )
    manifest = work / "golden" / "tests" / "test_ppo" / "test_ppo[tp2]" / "manifest.json"
    recorded = json.loads(manifest.read_text())
    recorded["fingerprint"]["tf32_matmul"] = True  # as if recorded on a GPU allowing TF32
    manifest.write_text(json.dumps(recorded))
    replay = ("--golden-tolerance=gradnorm:rtol=1e-3", "--golden-report=golden-report.json")
    update = ("--update-golden", "-k", "tp1")
    return (
        "\n".join(
            f"$ pytest {' '.join(args)}\n{summary(run_pytest(work, *args))}"
            for args in (replay, update)
        )
        + "\n"
    )


@output("report-json")
def report_json(work: Path) -> str:
    """``--golden-report`` of a replay where one metric drifted: the whole document, one test
    and one comparison of each list."""
    test = work / "tests" / "test_ppo.py"
    test.parent.mkdir()
    (work / "pytest.ini").write_text("[pytest]\n")
    test.write_text(
        "import pytest\n\n"
        "@pytest.mark.parametrize('tp', ['tp1', 'tp2'])\n"
        "def test_ppo(golden, tp):\n"
        "    drift = DRIFT if tp == 'tp2' else 0.0\n"
        "    golden.check({'pg_loss': 0.6931471805599453 + drift, 'kl': 0.001}, step=0)\n"
        "DRIFT = 0.0\n"
    )
    run_pytest(work)
    test.write_text(test.read_text().replace("DRIFT = 0.0", "DRIFT = 7e-5"))
    env = environment() | {"CI": "true"}
    run_pytest(work, "--golden-report=report.json", env=env)
    document = json.loads((work / "report.json").read_text())
    failed = [t for t in document["tests"] if t["status"] == "failed"]
    document["tests"] = [*failed[:1], "..."]
    for entry in failed[:1]:
        entry["directory"] = "..."
    beyond = [c for c in document["comparisons"] if c["verdict"] == "fail"]
    for entry in beyond[:1]:
        entry["golden"] = "..."
    document["comparisons"] = [*beyond[:1], "..."]
    return laid_out(document, depth=2) + "\n"


def laid_out(value: object, depth: int, indent: str = "", *, expand: bool = True) -> str:
    """JSON for reading: down to ``depth`` levels, the document's keys and the objects of a list
    each on a line of their own; anything deeper on one line."""
    inner = indent + "  "
    if depth > 0 and expand and isinstance(value, dict):
        items = [
            f"{inner}{json.dumps(key)}: {laid_out(item, depth - 1, inner, expand=False)}"
            for key, item in value.items()
        ]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if depth > 0 and isinstance(value, list) and any(isinstance(v, dict) for v in value):
        items = [f"{inner}{laid_out(item, depth - 1, inner)}" for item in value]
        return "[\n" + ",\n".join(items) + f"\n{indent}]"
    return json.dumps(value)


# ---------------------------------------------------------------- docs/guide/long-runs.md

TOY_LONG_RUN = """import math
import torch

SCALE = 1.0


def test_long_run(golden):
    threads = torch.get_num_threads()  # the noise of this toy run depends on the thread count
    for step in range(20):
        noise = 1e-4 * step * math.sin(1.7 * threads + step)  # grows as trajectories drift
        golden.check({"loss": (1.0 + 0.01 * step + noise) * SCALE}, step=step)
"""


def toy_env() -> dict[str, str]:
    """This environment at 2 intra-op threads, as the page says the toy golden was recorded:
    the toy's noise is a function of the thread count, and calibration's thread counts
    start from the current one (1 and 4 after 2), so on every machine the runs are the same
    float64 numbers."""
    return {**environment(), "OMP_NUM_THREADS": "2"}


def toy_long_run(work: Path) -> Path:
    """The toy long run recorded in ``work``, at 2 threads (:func:`toy_env`)."""
    (work / "pytest.ini").write_text("[pytest]\n")
    (work / "test_long.py").write_text(TOY_LONG_RUN)
    run_pytest(work, env=toy_env())
    return work


BF16_VARIANT = """\
import pytest
from pytest_rollout_golden import same_math

NOISE = 0.0


@pytest.mark.parametrize("micro", same_math([8, 4], ids=lambda v: f"mb{v}"))
def test_actor(golden, micro):
    # bf16-sized rounding of the reordered sums of mb4, gone in float64 (the oracle's run)
    noise = NOISE if micro == 4 and not golden.certifying else 0.0
    for step in range(2):
        golden.check({"loss": (0.5 - 0.1 * step) * (1 + noise)}, step=step)
"""


@output("calibrate-variant-rounds")
def calibrate_variant_rounds(work: Path) -> str:
    """A same-math variant 3e-4 off the reference (bf16-sized) calibrated over 3 runs: the
    failure once, then the summary from its first line, and the exit status."""
    (work / "pytest.ini").write_text("[pytest]\n")
    test = work / "test_actor.py"
    test.write_text(BF16_VARIANT)
    run_pytest(work)
    test.write_text(BF16_VARIANT.replace("NOISE = 0.0", "NOISE = 3e-4"))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--golden-calibrate", "3"],
        cwd=work, env=environment(), capture_output=True, text=True,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "FAILURES" in line)
    end = next(i for i, line in enumerate(lines) if "short test summary" in line)
    counts = re.sub(r" in [\d.]+s.*$", " in … s", lines[-1])  # the time it took varies
    shown = ["$ pytest -q --golden-calibrate 3", *lines[start:end], "...", counts]
    return "\n".join([*shown, "$ echo $?", str(done.returncode)]) + "\n"


@output("long-runs-calibrate")
def long_runs_calibrate(work: Path) -> str:
    calibrated = run_pytest(toy_long_run(work), "--golden-calibrate", "3", env=toy_env())
    return summary(calibrated) + "\n"


@output("long-runs-failure")
def long_runs_failure(work: Path) -> str:
    run_pytest(toy_long_run(work), "--golden-calibrate", "3", env=toy_env())
    test = work / "test_long.py"
    test.write_text(test.read_text().replace("SCALE = 1.0", "SCALE = 1.0008"))
    return failure(run_pytest(work, env=toy_env()))


@output("long-runs-gates")
def long_runs_gates(work: Path) -> str:
    """The toy long run replayed after its calibration: the summary's gates of long runs."""
    run_pytest(toy_long_run(work), "--golden-calibrate", "3")
    text = summary(run_pytest(work))
    return text[text.index("gates of long runs") :] + "\n"


# ---------------------------------------------------------------- docs/reference/on-disk.md


@output("on-disk-envelope")
def on_disk_envelope(work: Path) -> str:
    """The long run's envelope.json, its number lists on one line, the fingerprint elided."""
    import re

    path = long_run(work) / "golden" / "test_long" / "test_long" / "envelope.json"
    document = json.loads(path.read_text())
    document["how"]["fingerprint"] = "..."
    text = json.dumps(document, indent=2)
    one_line = re.compile(r"\[\s+([^\[\]{}]*?)\s+\]")
    joined = one_line.sub(
        lambda m: f"[{', '.join(x.strip() for x in m.group(1).split(','))}]", text
    )
    return joined + "\n"


@output("on-disk-envelope-edited")
def on_disk_envelope_edited(work: Path) -> str:
    """``verify`` of a copy of the long run's golden whose envelope.json was edited (its
    digest re-signed): a width of 3.0 below the golden at step 3, beyond 1 x |loss|."""
    from pytest_rollout_golden._internal.tolerance.calibration import write

    project = work / "edited"
    shutil.copytree(long_run(work), project)
    golden = project / "golden" / "test_long" / "test_long"
    envelope = json.loads((golden / "envelope.json").read_text())
    envelope["metrics"]["loss"]["below"][3] = 3.0
    tolerances = golden / "tolerances.json"
    kept = json.loads(tolerances.read_text()) if tolerances.exists() else None
    write(golden, kept, envelope=envelope)
    text = shown(project, "verify", "golden")
    first = text.index("\n")
    return (
        text[:first] + "    # envelope.json edited: 3.0 below the golden at step 3" + text[first:]
    )


# ------------------------------------------------------- docs/guide/optimizer-and-resume.md

OPTIMIZER_TEST = """\
import torch


def test_train(golden):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, amsgrad=AMSGRAD)
    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    for step in range(3):
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == 1:
            optimizer.state[model[0].weight]["exp_avg"] *= SCALE
        golden.check_optimizer(optimizer, step=step, model=model)
AMSGRAD, SCALE = False, 1.0
"""


def optimizer_project(work: Path) -> Path:
    """A recorded three-step AdamW test (``OPTIMIZER_TEST``)."""
    (work / "pytest.ini").write_text("[pytest]\n")
    test = work / "test_optimizer.py"
    test.write_text(OPTIMIZER_TEST)
    run_pytest(work)
    return test


@output("optimizer-mismatch")
def optimizer_mismatch(work: Path) -> str:
    """The first moment of one parameter scaled by 1.001 after step 1."""
    test = optimizer_project(work)
    test.write_text(OPTIMIZER_TEST.replace("SCALE = False, 1.0", "SCALE = False, 1.001"))
    return failure(run_pytest(work))


@output("optimizer-entries")
def optimizer_entries(work: Path) -> str:
    """AMSGrad switched on after the recording: an entry the recorded state does not hold."""
    test = optimizer_project(work)
    test.write_text(OPTIMIZER_TEST.replace("SCALE = False, 1.0", "SCALE = True, 1.0"))
    lines = failure(run_pytest(work)).splitlines()
    return "\n".join([lines[0], *[line for line in lines if line.startswith("tensor")][:2]]) + "\n"


@output("resume-forget-optimizer")
def resume_forget_optimizer(work: Path) -> str:
    """examples/test_resume_golden.py's known bug against its committed golden, run as a
    failure (``--runxfail``): the headline, the first rows and the first tensor."""
    for name in ("tiny_rl.py", "resume_rl.py", "test_resume_golden.py"):
        shutil.copy(ROOT / "examples" / name, work / name)
    golden = "golden/examples/test_resume_golden"
    shutil.copytree(ROOT / golden, work / "golden" / "test_resume_golden")
    (work / "pytest.ini").write_text("[pytest]\n")
    text = run_pytest(work, "test_resume_golden.py", "-k", "forget", "--runxfail")
    lines = failure(text).splitlines()
    tensor = next(i for i, line in enumerate(lines) if line.startswith("tensor '"))
    return "\n".join([*lines[:6], "  ...", *lines[tensor : tensor + 4], "..."]) + "\n"


@output("resume-metrics-only")
def resume_metrics_only(work: Path) -> str:
    """How many steps after a resume that forgets the optimizer a metrics-only gate fails:
    examples/resume_rl.py (checkpoint after step 2, resumed at step 3), its metrics recorded
    by the uninterrupted run and replayed at the built-in defaults, per learning rate and
    run length. The checkpoint round trip runs in this process: the defect is the forgotten
    optimizer, not the process."""
    import re
    import sys

    sys.path.insert(0, str(ROOT / "examples"))
    from resume_rl import train

    from pytest_rollout_golden import Golden, GoldenMismatch, Mode

    def first_failure(records: dict, directory: Path, steps: int, mode: Mode) -> str:
        try:
            with Golden(directory, mode=mode) as golden:
                for step in range(steps):
                    golden.check(records[f"step{step}"]["metrics"], step=step)
        except GoldenMismatch as mismatch:
            return str(mismatch).splitlines()[0]
        return ""

    rows = ["lr     steps  metrics alone first fail at"]
    for steps in (6, 40):
        for lr in (1e-2, 1e-3, 1e-4):
            checkpoint = work / f"checkpoint-{lr}-{steps}.pt"
            straight = train(0, steps, lr=lr)
            first = train(0, 3, save=checkpoint, lr=lr)
            rest = train(3, steps, resume=checkpoint, forget_optimizer=True, lr=lr)
            directory = work / f"golden-{lr}-{steps}"
            first_failure(straight, directory, steps, Mode.AUTO)
            headline = first_failure({**first, **rest}, directory, steps, Mode.STRICT)
            found = re.match(r"golden mismatch: first divergence at step (\d+): ([^;]+)", headline)
            where = f"step {found[1]} ({found[2]})" if found else f"never in {steps} steps"
            rows.append(f"{lr:<6.0e} {steps:<6} {where}")
    return "\n".join(rows) + "\n"


# ---------------------------------------------------------------- docs/numerics.md


def checker_failure(check: Callable[[], None]) -> str:
    """The message of the AssertionError a checker raises."""
    try:
        check()
    except AssertionError as error:
        return f"{error}\n"
    raise AssertionError("the checker passed")


@output("gae-unmasked-values")
def gae_unmasked_values(work: Path) -> str:
    """``check_gae`` on a GAE fed the critic's values unmasked (ROLL), over the issue's row
    stored with its values masked (0 in the padding column)."""
    import torch

    from pytest_rollout_golden import invariants

    def roll_gae(rewards, values, mask):
        rewards, advantages, running = rewards * mask, torch.zeros_like(values), 0.0
        for t in reversed(range(values.shape[-1])):
            next_value = values[:, t + 1] if t + 1 < values.shape[-1] else 0.0
            running = rewards[:, t] + next_value - values[:, t] + 0.95 * running
            advantages[:, t] = running
        return advantages, advantages + values

    batch = {
        "token_level_rewards": torch.tensor([[1.0, 0.0]], dtype=torch.float64),
        "values": torch.tensor([[0.0, 0.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[True, False]]),
    }
    return checker_failure(lambda: invariants.check_gae(roll_gae, batch, gamma=1.0, lam=0.95))


@output("quant-e8m0-rounded-down")
def quant_e8m0_rounded_down(work: Path) -> str:
    """``check_quantization`` on an MXFP8 quantizer whose E8M0 scale rounds ``amax / 448``
    down to a power of two: one row of two 32-element blocks (amax 0.5 and 300)."""
    import torch

    from pytest_rollout_golden import invariants

    def quantize(x):
        amax = x.reshape(1, 2, 32).abs().amax(-1)
        scales = torch.exp2(torch.floor(torch.log2(amax / 448)))  # the bug: rounded down
        codes = (x / scales.repeat_interleave(32, -1)).to(torch.float8_e4m3fn)
        return codes, scales

    def dequantize(codes, scales):
        return codes.float() * scales.repeat_interleave(32, -1)

    x = torch.full((1, 64), 0.5)
    x[0, 32] = 300.0
    return checker_failure(
        lambda: invariants.check_quantization(quantize, x, "mxfp8_e4m3", dequantize=dequantize)
    )


@output("critic-micro-batch")
def critic_micro_batch(work: Path) -> str:
    """``check_value_loss`` on verl's ``compute_value_loss`` formula normalized per
    micro-batch (verl #6957): two rows of 2 and 1 valid tokens."""
    import torch

    from pytest_rollout_golden import invariants, reference

    def value_loss(batch, *, global_tokens, global_seqs):
        loss, _ = reference.value_loss(
            batch["vpreds"], batch["values"], batch["returns"], batch["response_mask"]
        )  # no global_tokens: each micro-batch divides by its own token count
        return loss

    batch = {
        "vpreds": torch.tensor([[1.0, 0.5, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64),
        "values": torch.tensor([[1.0, 0.25, 3.0], [0.0, 1.0, 0.0]], dtype=torch.float64),
        "returns": torch.tensor([[0.0, 0.5, 2.0], [1.0, 0.0, 0.0]], dtype=torch.float64),
        "response_mask": torch.tensor([[True, True, False], [True, False, False]]),
    }
    return checker_failure(lambda: invariants.check_value_loss(value_loss, batch))


# ------------------------------------------- docs/guide/recording.md: check_scores


SCORES_TEST = """\
import pytest
import torch
from pytest_rollout_golden import same_math

BATCH_NORM = False
IDS = [f"p{p}#{i}" for p in range(3) for i in range(2)]


def reward_model(features):
    w = torch.linspace(-1.0, 1.0, features.shape[-1])
    scores = torch.tanh(features @ w)
    if BATCH_NORM and len(scores) > 1:  # the defect: scores standardized over their batch
        scores = (scores - scores.mean()) / (scores.std() + 1e-6)
    return scores


@pytest.mark.parametrize("batch_size", same_math([6, 2, 1], ids=lambda b: f"bs{b}"))
def test_reward(golden, batch_size):
    features = golden.rollout(lambda: torch.randn(6, 8))
    scores = torch.cat([reward_model(chunk) for chunk in features.split(batch_size)])
    golden.check_scores(scores, ids=IDS, name="rm")
"""


@output("scores-batch-dependent")
def scores_batch_dependent(work: Path) -> str:
    """A reward standardized over its batch, scored in batches of 2: the rows of that variant."""
    (work / "pytest.ini").write_text("[pytest]\n")
    test = work / "test_reward.py"
    test.write_text(SCORES_TEST)
    run_pytest(work)
    test.write_text(SCORES_TEST.replace("BATCH_NORM = False", "BATCH_NORM = True"))
    return failure(run_pytest(work, "-k", "bs2"))


# ----------------------------------------------- docs/numerics.md: check_token_ids_kept


@output("token-ids-kept")
def token_ids_kept(work: Path) -> str:
    """An agent loop that re-tokenizes a turn the engine sampled letter by letter."""
    pytest.importorskip(
        "tokenizers",
        reason="token-ids-kept trains a BPE tokenizer with the `tokenizers` package, which "
        "`.[test]` does not install (tests/realtrainer/requirements-trl.txt does)",
    )
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from pytest_rollout_golden.invariants import check_token_ids_kept

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["[UNK]"], initial_alphabet=alphabet
    )
    tok.train_from_iterator(
        ["the answer is 42", "the tool says 40 + 2", "answer: 42"] * 50, trainer
    )
    turns = [[tok.token_to_id(c) for c in "answer"] + tok.encode(" is").ids, tok.encode("42").ids]
    prompt, tool = tok.encode("the tool").ids, tok.encode(" says 40 + 2 ").ids
    trained = [tok.encode(tok.decode(t)).ids for t in turns]  # the defect: text re-tokenized
    ids = prompt + trained[0] + tool + trained[1]
    mask = [0] * len(prompt) + [1] * len(trained[0]) + [0] * len(tool) + [1] * len(trained[1])
    try:
        check_token_ids_kept(turns, ids, mask, decode=tok.decode)
    except AssertionError as exc:
        return f"{exc}\n"
    raise AssertionError("check_token_ids_kept passed a re-tokenized trajectory")


@output("import-jsonl-mixed")
def import_jsonl_mixed(work: Path) -> str:
    """A folder holding the JSON-lines logs of verl, ROLL and NeMo-RL (one line each, in each
    writer's shape: tests/cli/test_import_jsonl.py runs or reproduces the writers): imported
    as detected, then as NeMo-RL."""
    lines = {
        "logs/verl_rollouts/3.jsonl": {"input": "1+1?", "output": "2", "gts": "2", "score": 1.0,
                                       "step": 3, "request_id": "r0"},
        "logs/roll/rollout_dump_data.step_3.jsonl": {"prompt": ["1+1?"], "responses": ["2"],
                                                     "scores": [1.0], "global_step": [3]},
        "logs/nemo/train_data_step3.jsonl": {"content": [[{"role": "user", "content": "1+1?"}]],
                                             "rewards": [1.0], "idx": 0},
    }  # fmt: skip
    for name, record in lines.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(json.dumps(record) + "\n")
    return shown(work, "import", "logs", "-o", "golden/test_logs/test_verl") + shown(
        work, "import", "logs", "--layout", "nemo-rl", "-o", "golden/test_logs/test_nemo"
    )


# ---------------------------------------------------------------- docs/guide/bisect.md

BISECTED: dict[str, str] = {}  # the toy history and its first bisect's output, once a session
BISECT = ("bisect", "--good", "HEAD~31", "--bad", "HEAD")


def bisected(work: Path) -> tuple[Path, str]:
    """The 32-commit history of tests/commits/ (the bug at commit 11, commit 16 does not
    collect) and what its first bisect printed; later bisects of it find every commit cached."""
    if not BISECTED or not Path(BISECTED["repo"]).exists():
        sys.path.insert(0, str(ROOT / "tests" / "commits"))
        from history import build_history

        repo = build_history(work / "history" / "repo", bug_at=11, broken_at=16).repo
        BISECTED["repo"] = str(repo)
        BISECTED["first"] = bisect_shown(repo, *BISECT, "--", "test_calc.py")
    return Path(BISECTED["repo"]), BISECTED["first"]


def bisect_env(repo: Path) -> dict[str, str]:
    """The environment of every bisect of the history: one cache, and the same variables (the
    cache key holds them)."""
    env = environment()
    env["XDG_CACHE_HOME"] = str(repo.parent / "cache")
    env["PYTEST_ADDOPTS"] = "-p no:hypothesispytest"  # a faster replay, the same output
    return env


def bisect_shown(repo: Path, *args: str) -> str:
    """``$ rollout-golden ARGS`` in the history, stderr and stdout as a terminal interleaves
    them; durations, which vary from run to run, read ``…``."""
    import re

    done = subprocess.run(
        [sys.executable, "-m", "pytest_rollout_golden", *args],
        cwd=repo, env=bisect_env(repo), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    lines = re.sub(r"\b\d+\.\d s\b", "… s", done.stdout).splitlines()
    header = next((i for i, line in enumerate(lines) if " seconds " in line), len(lines))
    column = lines[header].find(" seconds ") + 1 if header < len(lines) else 0
    for i in range(header + 1, len(lines)):  # the table's seconds column
        lines[i] = lines[i][:column] + "…".ljust(7) + lines[i][column + 7 :]
    return "\n".join([f"$ rollout-golden {' '.join(args)}", *lines]) + "\n"


@output("bisect-session")
def bisect_session(work: Path) -> str:
    return bisected(work)[1]


@output("bisect-cached")
def bisect_cached(work: Path) -> str:
    """The same bisect again: every commit it tries is in the cache."""
    repo, _ = bisected(work)
    return bisect_shown(repo, *BISECT, "--", "test_calc.py")


@output("cli-bisect-json")
def cli_bisect_json(work: Path) -> str:
    """``--json`` of the same bisect (cached), long fields, all but one run and what the cache
    key holds of this machine elided."""
    repo, _ = bisected(work)
    args = (*BISECT, "--json", "--", "test_calc.py")
    done = subprocess.run(
        [sys.executable, "-m", "pytest_rollout_golden", *args],
        cwd=repo, env=bisect_env(repo), capture_output=True, text=True,
    )  # fmt: skip
    document = json.loads(done.stdout)
    document["seconds"] = "..."
    for run in (document["first_bad_run"], *document["tried"]):
        run.update(seconds="...", log_tail="...", failures=["..."] if run["failures"] else [])
    document["tried"] = [*document["tried"][:1], "..."]
    for machine in ("python", "environment", "plugin", "packages"):  # this machine's
        document["cache_key"][machine] = "..."
    return f"$ rollout-golden {' '.join(args)}\n" + laid_out(document, depth=2) + "\n"


# ---------------------------------------------------------------- docs/guide/checkers.md

CHECKERS_GUIDE = ROOT / "docs" / "guide" / "checkers.md"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """``(line, source)`` of every ```python block of ``page``, ``line`` that of its fence."""
    text = page.read_text()
    return [
        (text[: match.start()].count("\n") + 1, match.group(1))
        for match in PYTHON_BLOCK.finditer(text)
    ]


def run_guide_program(line: int, source: str) -> list[str]:
    """Run a program of the checkers guide as a user's test file would: the block, then every
    test it defines on 10 derandomized examples (hypothesis' own output stays off the page's
    outputs: no database, no deadline). Returns the tests' names; a failing test raises."""
    from hypothesis import settings

    namespace: dict[str, object] = {}
    # Compiled at its own lines of the guide, so that inspect (which hypothesis uses to
    # describe lambdas) reads the block's source, not whatever the guide has there.
    exec(compile("\n" * line + source, str(CHECKERS_GUIDE), "exec"), namespace)
    tests = [
        name for name, test in namespace.items() if name.startswith("test_") and callable(test)
    ]
    for name in tests:
        settings(max_examples=10, derandomize=True, database=None, deadline=None)(namespace[name])()
    return tests


def planted(test: str, old: str, new: str) -> str:
    """The guide's program that defines ``test`` with ``old`` (once in it) replaced by ``new``:
    the edit as ``-``/``+`` lines, and the first line of the checker's failure."""
    line, source = next(
        (line, source) for line, source in python_blocks(CHECKERS_GUIDE) if f"def {test}(" in source
    )
    assert source.count(old) == 1, f"{old!r} is not once in the program of {test}"
    try:
        run_guide_program(line, source.replace(old, new))
    except AssertionError as caught:
        message = str(caught).splitlines()[0]
    else:
        raise AssertionError(f"the bug planted in {test} was not caught: {old!r} -> {new!r}")
    edit = [f"- {text.strip()}" for text in old.strip("\n").splitlines()]
    edit += [f"+ {text.strip()}" for text in new.strip("\n").splitlines()]
    return "\n".join([*edit, "", message]) + "\n"


@output("checkers-garbage-exp-first")
def checkers_garbage_exp_first(work: Path) -> str:
    return planted(
        "test_my_loss_survives_uninitialised_padding",
        'log_ratio = torch.where(mask, batch["log_probs"] - batch["old_log_probs"], 0.0)',
        'log_ratio = batch["log_probs"] - batch["old_log_probs"]',
    )


@output("checkers-trl-detached-weight")
def checkers_trl_detached_weight(work: Path) -> str:
    return planted(
        "test_nemo_rl_and_trl_weighted_kl",
        "return (torch.exp(log_ratio) - log_ratio - 1) * coef_1",
        "return (torch.exp(log_ratio) - log_ratio - 1) * coef_1.detach()",
    )


@output("checkers-slime-compute-dtype")
def checkers_slime_compute_dtype(work: Path) -> str:
    return planted(
        "test_slime_kl",
        'weights="is_weights", compute_dtype=torch.float32,',
        'weights="is_weights",',
    )


@output("checkers-nemo-rl-score-function")
def checkers_nemo_rl_score_function(work: Path) -> str:
    return planted("test_nemo_rl_default_kl", "\n        score_function=True,", "")


@output("checkers-openrlhf-dual-clip")
def checkers_openrlhf_dual_clip(work: Path) -> str:
    return planted(
        "test_openrlhf_policy_loss",
        "    loss = torch.where(advantages < 0, torch.min(loss, -3.0 * advantages), loss)\n",
        "",
    )


@output("checkers-trl-bnpo")
def checkers_trl_bnpo(work: Path) -> str:
    return planted(
        "test_trl_dapo_loss",
        "return (per_token_loss * mask).sum() / global_tokens",
        "return (per_token_loss * mask).sum() / mask.sum().clamp(min=1)",
    )


@output("checkers-roll-unmasked-values")
def checkers_roll_unmasked_values(work: Path) -> str:
    return planted(
        "test_roll_gae",
        "rewards, values = rewards * mask, values * mask",
        "rewards = rewards * mask",
    )


@output("checkers-verl-population-std")
def checkers_verl_population_std(work: Path) -> str:
    line = "mean[label], std[label] = torch.stack(members).mean(), torch.stack(members).std()"
    return planted("test_verl_grpo_advantages", line, line.replace(".std()", ".std(correction=0)"))


@output("checkers-areal-reversed-ratio")
def checkers_areal_reversed_ratio(work: Path) -> str:
    return planted(
        "test_areal_kl",
        "log_ratio = ref_log_prob.float() - log_prob.float()",
        "log_ratio = log_prob.float() - ref_log_prob.float()",
    )


# ---------------------------------------------------------------- docs/guide/history.md

HISTORY_TEST = """\
import json, pathlib

def test_train(golden):
    shift = pathlib.Path(__file__).with_name("shift.json")
    drift = json.loads(shift.read_text()) if shift.exists() else 0.0
    for step in range(3):
        golden.check({"loss": 2.0 - 0.5 * step + drift, "kl": 0.01 * step}, step=step)
"""
HISTORY: list[tuple[Path, str]] = []  # (project, pytest output of the last run), once


def history_project(work: Path) -> tuple[Path, str]:
    """A project recorded, then 3 runs with ``--golden-history hist``, the third after a
    drift of 1e-3 in ``loss``; the project and the third run's pytest output."""
    if HISTORY:
        return HISTORY[0]
    project = work / "history"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_train.py").write_text(HISTORY_TEST)
    run_pytest(project)
    run_pytest(project, "--golden-history", "hist")
    run_pytest(project, "--golden-history", "hist")
    (project / "shift.json").write_text("0.001")
    output = run_pytest(project, "--golden-history", "hist")
    HISTORY.append((project, output))
    return HISTORY[0]


ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00")


def history_shown(project: Path, *args: str) -> str:
    """``$ rollout-golden ARGS`` and its output, each run's time as a pattern of its width,
    the project's folder as ``/tmp/ex``."""
    text = ISO_TIME.sub("YYYY-MM-DDTHH:MM:SS+00:00", shown(project, *args))
    return in_example(text, project)


@output("history-run")
def history_run(work: Path) -> str:
    """The lines a session with ``--golden-history`` adds to the summary."""
    _, output = history_project(work)
    lines = [line for line in output.splitlines() if line.startswith("history:")]
    return "$ pytest -q --golden-history hist\n...\n" + "\n".join(lines) + "\n"


@output("history-list")
def history_list(work: Path) -> str:
    project, _ = history_project(work)
    return history_shown(project, "history", "hist", "list")


@output("history-show")
def history_show(work: Path) -> str:
    project, _ = history_project(work)
    return history_shown(project, "history", "hist", "show", "test_train")


@output("history-compare")
def history_compare(work: Path) -> str:
    project, _ = history_project(work)
    return history_shown(project, "history", "hist", "compare", "2", "3")


@output("history-placeholder")
def history_placeholder(work: Path) -> str:
    """``--update-golden-failing`` refusing a loss that became all zeros."""
    project = work / "placeholder"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    constant = HISTORY_TEST.replace("2.0 - 0.5 * step + drift", "drift")
    (project / "test_train.py").write_text(constant)
    (project / "shift.json").write_text("1.5")
    run_pytest(project)
    (project / "shift.json").write_text("0.0")
    output = run_pytest(project, "--update-golden-failing")
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if "not re-recorded" in line)
    shown_lines = "\n".join(lines[start : start + 3])
    return "$ pytest -q --update-golden-failing\n...\n" + in_example(shown_lines, project) + "\n"


# ------------------------------------------------ docs/guide/history.md: change points


@output("history-changes")
def history_changes(work: Path) -> str:
    """The issue's simulated year (``tests/unit/nightly.py``, seed 0: 365 nightly runs, 3% of
    the tolerance up on night 120 and down on night 250) as a ``--golden-history`` folder,
    and its change points."""
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    from nightly import nightly, write_history

    write_history(work / "hist", nightly())
    return shown(work, "history", "hist", "changes", status=True)
