"""rollout-golden diff over goldens, golden roots and batch files; show's statistics."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import safetensors
import torch

from pytest_rollout_golden import Golden, Mode, save_batch
from pytest_rollout_golden.cli import main

EXAMPLES = Path(__file__).parents[2] / "examples"


def record(directory: Path, *, losses=(0.5, 0.6, 0.7), kl=(0.01, 0.02, 0.03), bump=0.0) -> None:
    with Golden(directory, mode=Mode.AUTO) as golden:
        for step in range(3):
            golden.check({"pg_loss": losses[step], "kl": kl[step]}, step=step)
            lp = -torch.arange(6, dtype=torch.float32).view(2, 3) / 7
            if step == 1:
                lp[1, 2] += bump
            golden.check_tensors("forward", {"log_probs": lp}, step=step, rank=0, micro=1)


def run_json(capsys, *args: str) -> tuple[int, dict]:
    code = main(["diff", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_roots_pair_goldens_and_name_the_first_divergent_step(tmp_path, capsys):
    record(tmp_path / "a" / "t" / "same")
    record(tmp_path / "b" / "t" / "same")
    record(tmp_path / "a" / "t" / "drift")
    record(tmp_path / "b" / "t" / "drift", losses=(0.5, 0.6, 0.71), kl=(0.01, 0.0201, 0.03))
    record(tmp_path / "b" / "t" / "new")

    code, doc = run_json(capsys, str(tmp_path / "a"), str(tmp_path / "b"))
    assert code == 1 and doc["ok"] is False
    assert doc["summary"] == {
        "goldens": 3,
        "differ": 1,
        "within_tolerance": 1,
        "one_sided": 1,
        "not_compared": 0,
    }
    by_name = {g["golden"]: g for g in doc["goldens"]}
    assert by_name["t/new"]["problems"] == [f"golden only in B ({tmp_path / 'b' / 't' / 'new'})"]
    drift = by_name["t/drift"]
    assert drift["first_divergence"]["pg_loss"] == 2
    assert drift["first_divergence"]["kl"] == 1
    assert drift["first_divergence"]["forward/log_probs"] is None
    kl_row = next(m for m in drift["metrics"] if m["name"] == "kl" and m["step"] == 1)
    assert kl_row["ok"] is False and kl_row["abs_max"] == pytest.approx(1e-4)
    assert kl_row["rel_max"] == pytest.approx(5e-3) and kl_row["source"] == "built-in default"

    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert "t/new: DIFFERS: golden only in B" in out
    assert "pg_loss  step 2            1/3" in out and "kl       step 1            1/3" in out
    assert "1 differ beyond tolerance, 1 within tolerance, 1 on one side only" in out


def test_tensor_rows_carry_counts_means_and_places(tmp_path, capsys):
    record(tmp_path / "a")
    record(tmp_path / "b", bump=1e-3)
    code, doc = run_json(capsys, str(tmp_path / "a"), str(tmp_path / "b"))
    assert code == 1
    (golden,) = doc["goldens"]
    rows = [t for t in golden["tensors"] if not t["ok"]]
    assert len(rows) == 1
    row = rows[0]
    assert (row["name"], row["step"], row["rank"], row["micro"]) == ("forward/log_probs", 1, 0, 1)
    assert (row["mismatched"], row["numel"]) == (1, 6)
    assert row["abs_max"] == pytest.approx(1e-3, rel=1e-3)
    assert row["abs_mean"] == pytest.approx(1e-3 / 6, rel=1e-3)
    assert row["rel_max"] == pytest.approx(1e-3 / (5 / 7), rel=1e-3)
    assert row["shape"] == [[2, 3], [2, 3]] and row["dtype"] == ["float32", "float32"]
    assert golden["first_divergence"]["forward/log_probs"] == 1


def test_shape_dtype_and_one_sided_entries_are_differences(tmp_path, capsys):
    for name, value in (("a", torch.zeros(2, 3)), ("b", torch.zeros(3, 2, dtype=torch.float64))):
        with Golden(tmp_path / name, mode=Mode.AUTO) as golden:
            golden.check({"pg_loss": 0.5, **({"only_a": 1.0} if name == "a" else {})})
            golden.check_tensors("fwd", {"x": value, f"only_{name}": value})
    code, doc = run_json(capsys, str(tmp_path / "a"), str(tmp_path / "b"))
    assert code == 1
    tensors = {t["name"]: t for t in doc["goldens"][0]["tensors"]}
    assert "shape (3, 2) differs from the recorded (2, 3)" in tensors["fwd/x"]["detail"]
    assert tensors["fwd/only_a"]["detail"].startswith("only in A")
    assert tensors["fwd/only_b"]["detail"].startswith("only in B")
    metric = next(m for m in doc["goldens"][0]["metrics"] if m["name"] == "only_a")
    assert metric["ok"] is False and metric["detail"] == "only in A"


def test_ignored_metrics_are_listed_not_compared(tmp_path, capsys):
    record(tmp_path / "a")
    record(tmp_path / "b", kl=(0.01, 0.03, 0.03))
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--ignore", "kl"]) == 0
    out = capsys.readouterr().out
    assert "not compared (excluded on purpose): kl" in out
    assert "not compared (--ignore)" in out


def test_the_projects_ini_tolerances_apply(tmp_path, capsys, monkeypatch):
    record(tmp_path / "golden" / "a")
    record(tmp_path / "golden" / "b", losses=(0.5, 0.6, 0.7007))  # rel 1e-3 at step 2
    a, b = str(tmp_path / "golden" / "a"), str(tmp_path / "golden" / "b")
    assert main(["diff", a, b]) == 1
    (tmp_path / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\ngolden_tolerances = ["pg_loss:rtol=2e-3"]\n'
    )
    capsys.readouterr()
    assert main(["diff", a, b]) == 0
    assert f"tolerances also from {tmp_path / 'pyproject.toml'}" in capsys.readouterr().out
    assert main(["diff", a, b, "--no-config"]) == 1
    # pytest's order: a pytest.ini in the same folder wins over pyproject.toml.
    (tmp_path / "pytest.ini").write_text("[pytest]\ngolden_tolerances =\n    other:rtol=1\n")
    assert main(["diff", a, b]) == 1
    (tmp_path / "pytest.ini").write_text("[pytest]\ngolden_ignore =\n    pg_loss\n")
    assert main(["diff", a, b]) == 0
    # A tolerance on the command line sits above the ini.
    (tmp_path / "pytest.ini").write_text("[pytest]\ngolden_tolerances =\n    pg_loss:rtol=1\n")
    assert main(["diff", a, b, "--tolerance", "pg_loss:rtol=1e-4"]) == 1


def test_the_projects_metric_profile_applies(tmp_path, capsys):
    """`diff` gates like the plugin: the ini's golden_metric_profile names families and the
    keys never compared, and an unknown profile is an error naming the file."""
    for name, seconds in (("a", 1.0), ("b", 7.0)):
        with Golden(tmp_path / "golden" / name, mode=Mode.AUTO) as golden:
            golden.check({"timing_s/gen": seconds, "actor/ppo_kl": 0.01}, step=0)
    a, b = str(tmp_path / "golden" / "a"), str(tmp_path / "golden" / "b")
    (tmp_path / "pytest.ini").write_text("[pytest]\ngolden_metric_profile = verl\n")
    code, doc = run_json(capsys, a, b)
    assert code == 0
    timing = next(m for m in doc["goldens"][0]["metrics"] if m["name"] == "timing_s/gen")
    assert timing["compared"] is False
    assert timing["source"] == "golden_metric_profile = verl: never compared"
    kl = next(m for m in doc["goldens"][0]["metrics"] if m["name"] == "actor/ppo_kl")
    assert kl["source"] == "golden_metric_profile = verl"
    (tmp_path / "pytest.ini").write_text("[pytest]\ngolden_metric_profile = verl9\n")
    assert main(["diff", a, b]) == 2
    assert "pytest.ini: golden_metric_profile: unknown profile 'verl9'" in capsys.readouterr().err


def test_batch_files(tmp_path, capsys):
    save_batch(tmp_path / "a.safetensors", {"ids": torch.arange(4), "lp": torch.ones(4)})
    save_batch(tmp_path / "b.safetensors", {"ids": torch.arange(4), "lp": torch.ones(4) * 1.1})
    code, doc = run_json(capsys, str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"))
    assert code == 1
    rows = {t["name"]: t for t in doc["goldens"][0]["tensors"]}
    assert rows["ids"]["ok"] and not rows["lp"]["ok"] and rows["lp"]["mismatched"] == 4


@pytest.mark.parametrize(
    "case", ["missing", "corrupt", "not ours", "golden vs root", "file vs dir", "empty roots"]
)
def test_unusable_input_exits_2_with_a_named_error(tmp_path, capsys, case):
    record(tmp_path / "a" / "g")
    record(tmp_path / "b" / "g")
    a, b = tmp_path / "a", tmp_path / "b"
    if case == "missing":
        b = tmp_path / "nowhere"
    elif case == "corrupt":
        victim = b / "g" / "tensors-forward-step000001-rank0-micro1.safetensors"
        data = bytearray(victim.read_bytes())
        data[-1] ^= 1
        victim.write_bytes(bytes(data))
    elif case == "not ours":
        (b / "g" / "manifest.json").write_text('{"format": "something-else"}')
    elif case == "golden vs root":
        a = a / "g"
    elif case == "file vs dir":
        a = a / "g" / "metrics.json"
    else:
        a, b = tmp_path / "e1", tmp_path / "e2"
        a.mkdir(), b.mkdir()
    assert main(["diff", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    expected = {
        "missing": "nowhere: no such file or directory",
        "corrupt": "tensors-forward-step000001-rank0-micro1.safetensors",
        "not ours": "is not a pytest-rollout-golden manifest",
        "golden vs root": "is a golden directory but",
        "file vs dir": "compare two batch files or two directories",
        "empty roots": "no golden directory",
    }[case]
    assert err.startswith("error: ") and expected in err


def test_diff_of_two_example_roots_one_recorded_with_a_changed_loss(project, capsys):
    """The done-criterion: the committed example goldens against a root recorded with the KL
    coefficient of the loss changed from 0.01 to 0.02."""
    module = project.copy_example()
    a = project.path / "golden_a"
    committed = EXAMPLES.parent / "golden" / "examples" / "test_tiny_rl_golden"
    shutil.copytree(committed, a / module)
    source = (project.path / "example_rl.py").read_text()
    changed = source.replace("kl_coef: float = 0.01", "kl_coef: float = 0.02")
    (project.path / "example_rl.py").write_text(changed)
    project.run("--golden-dir", "golden_b", "-k", "matches_golden").assert_outcomes(passed=1)
    b = project.path / "golden_b"
    capsys.readouterr()
    code, doc = run_json(capsys, str(a), str(b))
    assert code == 1
    by_name = {g["golden"]: g for g in doc["goldens"]}
    assert by_name["test_example/grpo_layouts"]["problems"][0].startswith("golden only in A")
    first = by_name["test_example/test_grpo_training_matches_golden"]["first_divergence"]
    # The KL term enters the loss: grad_norm diverges once the weights moved apart.
    assert first["grad_norm"] == 1 and first["entropy"] is None
    assert main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "grad_norm        step 1" in out


def test_show_prints_statistics_and_a_steps_by_metrics_table(tmp_path, capsys):
    with Golden(tmp_path / "g", mode=Mode.AUTO) as golden:
        golden.rollout(
            lambda: {
                "response_mask": torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool),
                "log_probs": torch.tensor([[-1.0, -3.0, float("nan"), float("inf")], [0.0] * 4]),
            }
        )
        golden.check({"pg_loss": 0.25, "kl": 0.5}, step=0)
        golden.check({"pg_loss": 0.125}, step=1)
    assert main(["show", str(tmp_path / "g"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    stats = doc["files"]["rollout-rollout-step000000.safetensors"]["tensors"]
    lp = stats["log_probs"]
    assert (lp["nan"], lp["inf"], lp["min"], lp["max"]) == (1, 1, -3.0, 0.0)
    assert lp["mean"] == pytest.approx(-4 / 6) and lp["padding"] == pytest.approx(0.25)
    assert lp["mask"] == "response_mask"
    assert stats["response_mask"]["padding"] == pytest.approx(0.25)
    assert doc["metrics"] == {"0": {"pg_loss": 0.25, "kl": 0.5}, "1": {"pg_loss": 0.125}}

    assert main(["show", str(tmp_path / "g")]) == 0
    out = capsys.readouterr().out
    assert "metrics (2 steps × 2 metrics):" in out
    assert "  step  kl   pg_loss" in out and "  1     -    0.125" in out
    assert "log_probs      float32[2, 4]  -3   0    -0.666667" in out and "25.0%" in out


def test_a_calibrated_golden_brings_its_tolerances_to_diff(tmp_path, capsys):
    from pytest_rollout_golden._internal.tolerance.calibration import FORMAT, write

    record(tmp_path / "a")
    record(tmp_path / "b", losses=(0.5, 0.6, 0.7007))  # rel 1e-3 at step 2
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert main(["diff", a, b, "--no-config"]) == 1
    doc = {"format": FORMAT, "version": 1, "how": {}, "spreads": {},
           "tolerances": {"pg_loss": {"rtol": 2e-3, "atol": 1e-8}}}  # fmt: skip
    write(tmp_path / "a", doc)
    capsys.readouterr()
    code, out = run_json(capsys, a, b, "--no-config")
    assert code == 0
    row = next(m for m in out["goldens"][0]["metrics"] if m["name"] == "pg_loss" and m["step"] == 2)
    assert row["source"] == "calibrated (tolerances.json)" and row["allowed"].startswith(
        "rtol=0.002"
    )
    # ... and a --tolerance on the command line overrides it, as in the plugin.
    assert main(["diff", a, b, "--no-config", "--tolerance", "pg_loss:rtol=1e-6"]) == 1


def test_changed_non_tensor_values_are_a_difference(tmp_path, capsys):
    ids = torch.arange(4)
    save_batch(tmp_path / "a.safetensors", {"ids": ids, "meta": {"temperature": 1.0}})
    save_batch(tmp_path / "b.safetensors", {"ids": ids, "meta": {"temperature": 0.7}})
    save_batch(tmp_path / "c.safetensors", {"ids": ids.clone(), "meta": {"temperature": 1.0}})
    a, b, c = (str(tmp_path / f"{n}.safetensors") for n in "abc")
    code, doc = run_json(capsys, a, b)
    assert code == 1
    assert doc["goldens"][0]["problems"] == [
        "a.safetensors: non-tensor values or structure differ: meta/temperature"
    ]
    assert run_json(capsys, a, c)[0] == 0


def record_masked(directory: Path, pad: float) -> None:
    """A golden whose log-probs were checked under a mask of 5 of 8 positions."""
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    lp = torch.where(mask.bool(), -torch.arange(8.0).view(2, 4) / 7, torch.tensor(pad))
    with Golden(directory, mode=Mode.AUTO) as golden:
        golden.check_tensors("actor", {"log_probs": lp, "unmasked": torch.ones(3)}, mask=None)
        golden.check_tensors("ref", {"log_probs": lp}, mask=mask, step=1)


def test_a_tensor_recorded_under_a_mask_says_diff_compares_its_padding(tmp_path, capsys):
    """The golden records how many positions the mask selected; diff, which cannot apply
    the mask (it is not stored), says it compares every position, padding included."""
    record_masked(tmp_path / "a", pad=0.0)
    record_masked(tmp_path / "b", pad=-7.5)  # padding garbage only
    code, doc = run_json(capsys, str(tmp_path / "a"), str(tmp_path / "b"))
    assert code == 1
    tensors = {(t["name"], t["step"]): t for t in doc["goldens"][0]["tensors"]}
    masked = tensors[("ref/log_probs", 1)]
    assert (masked["mismatched"], masked["numel"]) == (3, 8)
    assert masked["mask_selected"] == 5
    assert masked["note"] == (
        "recorded under a mask of 5 of 8 positions; diff compares all 8 (padding included)"
    )
    plain = tensors[("actor/log_probs", 0)]
    assert plain["mask_selected"] is None and plain["note"] == ""

    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert (
        "    ref/log_probs (step 1):\n"
        "      recorded under a mask of 5 of 8 positions; diff compares all 8 (padding included)\n"
        "      Mismatched elements: 3 / 8 (37.5%)\n"
    ) in out


@pytest.mark.filterwarnings("ignore::pytest_rollout_golden.GoldenNaNWarning")
def test_a_nan_in_both_goldens_names_equal_nan_and_the_option_that_sets_it(tmp_path, capsys):
    """diff keeps the plugin's rule (NaN equals NaN only under equal_nan), so a golden
    diffed against itself fails on its NaN; the failure says how to allow it."""
    with Golden(tmp_path / "a", mode=Mode.AUTO) as golden:
        golden.check({"pg_loss": float("nan"), "kl": 0.1})
        golden.check_tensors("fwd", {"x": torch.tensor([1.0, float("nan")])})
    a = str(tmp_path / "a")
    hint = (
        "NaN equals NaN only where the tolerance sets equal_nan "
        "(e.g. --tolerance pg_loss:equal_nan=true)"
    )
    code, doc = run_json(capsys, a, a)
    assert code == 1
    (metric,) = [m for m in doc["goldens"][0]["metrics"] if not m["ok"]]
    assert metric["name"] == "pg_loss" and hint in metric["detail"]
    (tensor,) = doc["goldens"][0]["tensors"]
    assert "(e.g. --tolerance fwd/x:equal_nan=true)" in tensor["detail"]
    assert "--golden-tolerance" not in tensor["detail"]  # that is pytest's option, not diff's
    assert main(["diff", a, a]) == 1
    assert hint in capsys.readouterr().out
    allow = ["--tolerance", "pg_loss:equal_nan=true", "--tolerance", "fwd/x:equal_nan=true"]
    assert main(["diff", a, a, *allow]) == 0


def record_rollout(directory: Path, bump: float = 0.0) -> None:
    with Golden(directory, mode=Mode.AUTO) as golden:
        golden.rollout(lambda: {"input_ids": torch.arange(6).view(2, 3)}, step=0)
        golden.check({"pg_loss": 0.5}, step=0)
        lp = -torch.arange(6, dtype=torch.float32).view(2, 3) / 7
        golden.check_tensors("forward", {"log_probs": lp + bump}, step=0, rank=0)


def recorded_on_cuda(monkeypatch, directory: Path, bump: float) -> None:
    """``record_rollout`` as a CUDA machine records: every tensor's layout says ``cuda:0``."""
    from pytest_rollout_golden.store import codec

    tensor = codec._Flattener.tensor

    def on_cuda(self, v, path):
        return {**tensor(self, v, path), "device": "cuda:0"}

    with monkeypatch.context() as m:
        m.setattr(codec._Flattener, "tensor", on_cuda)
        record_rollout(directory, bump)


def a_gpu_that_fails(monkeypatch) -> None:
    """This machine says it has one GPU, and moving a tensor onto it fails as a busy or
    full GPU does."""
    to = torch.Tensor.to

    def failing(self, *args, **kwargs):
        if "cuda" in str(args[0] if args else kwargs.get("device")):
            raise RuntimeError("CUDA error: all CUDA-capable devices are busy or unavailable")
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.Tensor, "to", failing)


def test_goldens_recorded_on_other_devices_diff_on_the_cpu(tmp_path, capsys, monkeypatch):
    """A golden recorded on CUDA and one recorded on the CPU: diff loads both onto the CPU,
    never onto this machine's GPU, and reports values, not devices."""
    record_rollout(tmp_path / "cpu")
    recorded_on_cuda(monkeypatch, tmp_path / "cuda", bump=1e-3)
    with safetensors.safe_open(
        tmp_path / "cuda" / "rollout-rollout-step000000.safetensors", "pt"
    ) as f:
        layout = json.loads(f.metadata()["prg.layout"])
    assert layout["items"][0][1]["device"] == "cuda:0"  # as recorded on a GPU
    a_gpu_that_fails(monkeypatch)

    assert main(["diff", str(tmp_path / "cpu"), str(tmp_path / "cuda")]) == 1
    out = capsys.readouterr().out
    assert "forward/log_probs" in out and "DIFFERS (1 beyond tolerance)" in out
    assert "structure differ" not in out
    tensors = "tensors-forward-step000000-rank0.safetensors"
    assert main(["diff", str(tmp_path / "cpu" / tensors), str(tmp_path / "cuda" / tensors)]) == 1
    assert "log_probs" in capsys.readouterr().out
    assert main(["verify", str(tmp_path / "cuda")]) == 0
    assert main(["show", str(tmp_path / "cuda")]) == 0


def test_a_tensordict_with_and_without_a_device_is_no_structure_difference(tmp_path, capsys):
    """Where a TensorDict's tensors lived is not a value: diff does not report it."""
    tensordict = pytest.importorskip("tensordict")

    for name, device in (("a", None), ("b", "cpu")):
        batch = tensordict.TensorDict({"ids": torch.arange(4)}, batch_size=[4], device=device)
        with Golden(tmp_path / name, mode=Mode.AUTO) as golden:
            golden.rollout(lambda batch=batch: batch, step=0)
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert "structure differ" not in capsys.readouterr().out


def test_diff_resolves_the_ini_tolerances_pytest_resolves(tmp_path, capsys):
    """ini ``golden_precision = bf16`` loosens grad_norm to rtol 2e-3 in pytest: a drift of
    1e-3 relative passes there, so ``diff`` passes it too, naming the same source."""
    from pytest_rollout_golden._internal.pytest_plugin.options import session_tolerances

    for name, norm in (("a", 1.0), ("b", 1.001)):
        with Golden(tmp_path / "golden" / name, mode=Mode.AUTO) as golden:
            golden.check({"grad_norm": norm, "pg_loss": 0.5}, step=0)
    a, b = str(tmp_path / "golden" / "a"), str(tmp_path / "golden" / "b")
    assert main(["diff", a, b]) == 1  # float32: grad_norm's built-in rtol is tighter
    capsys.readouterr()
    (tmp_path / "pytest.ini").write_text("[pytest]\ngolden_precision = bf16\n")
    code, doc = run_json(capsys, a, b)
    grad_norm = next(m for m in doc["goldens"][0]["metrics"] if m["name"] == "grad_norm")
    _, pytest_source = (
        session_tolerances([], [], [], [], "", "bf16").resolver().resolve("grad_norm")
    )
    assert grad_norm["source"] == pytest_source == "ini golden_precision = bf16"
    assert (code, grad_norm["ok"]) == (0, True)
    (tmp_path / "pytest.ini").write_text("[pytest]\ngolden_precision = bf17\n")
    assert main(["diff", a, b]) == 2
    assert "pytest.ini: ini golden_precision: unknown precision 'bf17'" in capsys.readouterr().err
