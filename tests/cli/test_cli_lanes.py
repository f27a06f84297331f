"""rollout-golden over goldens with lanes: verify checks every lane, show lists them and shows
one, diff and plot compare two lanes (``GOLDEN@LANE``); and diff on tensors of two devices."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from pytest_rollout_golden import Golden, Mode
from pytest_rollout_golden._internal.golden.lanes import LaneSetting
from pytest_rollout_golden.cli import main

DOCS = Path(__file__).parents[2] / "docs"


def _batch() -> dict[str, torch.Tensor]:
    return {"ids": torch.arange(6).reshape(2, 3), "logp": torch.linspace(-2, -0.1, 6)}


def record(directory: Path, lane: str | None, loss: float, *, gen=_batch, bump: float = 0.0):
    """One step of a golden in ``lane`` (``None``: lanes off), its values made of ``loss``."""
    setting = LaneSetting(lane, "test") if lane else None
    test_id = "tests/test_grpo.py::test_step"
    with Golden(directory, mode=Mode.UPDATE, lane=setting, test_id=test_id) as g:
        batch = g.rollout(gen, step=0)
        g.check({"pg_loss": loss, "grad_norm": 2.0}, step=0)
        logp = batch["logp"] * (1 + bump)
        g.check_tensors("forward", {"log_probs": logp}, step=0, rank=0)


def two_lanes(directory: Path, *, gpu_loss: float = 0.5 * (1 + 1e-3), bump: float = 0.0) -> Path:
    record(directory, "cpu", 0.5)
    record(directory, "cuda-sm90", gpu_loss, bump=bump)
    return directory


def make_stale(directory: Path, tmp_path: Path) -> None:
    """Re-record the inputs under the lanes' feet (as an older plugin or a hand copy could)."""
    shutil.move(directory / "@lanes", tmp_path / "lanes-aside")

    def other() -> dict[str, torch.Tensor]:
        return {"ids": torch.arange(6).reshape(2, 3), "logp": torch.linspace(-3, -0.1, 6)}

    with Golden(directory, mode=Mode.UPDATE, regenerate=True, lane=LaneSetting("cpu", "t")) as g:
        g.rollout(other, step=0)
        g.check({"pg_loss": 0.5, "grad_norm": 2.0}, step=0)
    shutil.move(tmp_path / "lanes-aside", directory / "@lanes")


def set_fingerprint(directory: Path, **fields) -> None:
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["fingerprint"] = {**(manifest.get("fingerprint") or {}), **fields}
    path.write_text(json.dumps(manifest, indent=2))


# ------------------------------------------------------------------ verify


def test_verify_checks_every_lane_and_names_it(tmp_path, capsys):
    g = two_lanes(tmp_path / "golden" / "t" / "g")
    assert main(["verify", str(tmp_path / "golden")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"ok   {g} (3 files)",
        f"ok   {g / '@lanes' / 'cuda-sm90'} (lane cuda-sm90, 2 files)",
        "1 golden and 1 lane checked, 0 with problems, 0 could not be checked",
    ]

    victim = g / "@lanes" / "cuda-sm90" / "tensors-forward-step000000-rank0.safetensors"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0x01
    victim.write_bytes(bytes(data))
    assert main(["verify", str(g)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"ok   {g} (3 files)"
    assert out[1].startswith(f"FAIL {g / '@lanes' / 'cuda-sm90'}: {victim}: ")
    assert out[2] == "1 golden and 1 lane checked, 1 with problems, 0 could not be checked"


def test_verify_reports_a_lane_computed_on_other_inputs_with_its_remedy(tmp_path, capsys):
    g = two_lanes(tmp_path / "g")
    make_stale(g, tmp_path)
    assert main(["verify", str(g)]) == 1
    row = capsys.readouterr().out.splitlines()[1]
    assert row.startswith(f"FAIL {g / '@lanes' / 'cuda-sm90'}: the values of lane 'cuda-sm90'")
    assert "computed on other inputs than the golden holds" in row
    assert "(rollout-rollout-step000000.safetensors changed since)" in row
    assert "`pytest --update-golden --golden-lane cuda-sm90`" in row


def test_verify_reports_stray_entries_in_lanes_and_deletes_nothing(tmp_path, capsys):
    g = two_lanes(tmp_path / "g")
    (g / "@lanes" / "notes.txt").write_text("mine")
    (g / "@lanes" / "Big").mkdir()
    (g / "@lanes" / "Big" / "metrics.json").write_text("{}")
    (g / "@lanes" / "h100").mkdir()
    (g / "@lanes" / "h100" / "metrics.json").write_text("{}")  # a lane without its manifest
    before = sorted(p for p in g.rglob("*"))
    assert main(["verify", str(g)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {g / '@lanes' / 'Big'}: not a lane of this golden" in out
    assert f"FAIL {g / '@lanes' / 'notes.txt'}: not a lane of this golden" in out
    assert "verify deletes nothing" in out
    assert f"FAIL {g / '@lanes' / 'h100'}: holds golden files (metrics.json) but no" in out
    assert f"ok   {g / '@lanes' / 'cuda-sm90'} (lane cuda-sm90, 2 files)" in out
    assert out.splitlines()[-1].startswith("1 golden and 1 lane checked, 3 with problems")
    assert sorted(p for p in g.rglob("*")) == before


def test_verify_of_a_golden_recorded_before_lanes_is_as_before(tmp_path, capsys):
    record(tmp_path / "g", None, 0.5)
    assert main(["verify", str(tmp_path / "g")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "1 golden checked, 0 with problems, 0 could not be checked"
    )


# ------------------------------------------------------------------ show


def test_show_lists_the_lanes_with_the_device_each_recorded_on(tmp_path, capsys):
    g = two_lanes(tmp_path / "g")
    set_fingerprint(g / "@lanes" / "cuda-sm90", device="NVIDIA H200", cuda="12.8")
    assert main(["show", str(g)]) == 0
    out = capsys.readouterr().out.splitlines()
    start = out.index("lanes (2):")
    device = json.loads((g / "manifest.json").read_text())["fingerprint"]["device"]
    assert [re.split(r"\s{2,}", line.strip()) for line in out[start + 1 : start + 4]] == [
        ["lane", "values", "recorded on"],
        ["cpu", "beside the inputs (base lane)", device],
        ["cuda-sm90", "@lanes/cuda-sm90", "NVIDIA H200"],
    ]

    assert main(["show", str(g), "--json"]) == 0
    lanes = json.loads(capsys.readouterr().out)["lanes"]
    assert [(x["lane"], x["base"], x["device"], x["stale"]) for x in lanes] == [
        ("cpu", True, device, []),
        ("cuda-sm90", False, "NVIDIA H200", []),
    ]
    assert lanes[1]["directory"] == str(g / "@lanes" / "cuda-sm90")


def test_show_lane_shows_that_lanes_values_with_the_golden_inputs(tmp_path, capsys):
    g = two_lanes(tmp_path / "g", gpu_loss=0.75)
    assert main(["show", str(g), "--lane", "cuda-sm90"]) == 0
    out = capsys.readouterr().out
    assert f"lane cuda-sm90: values from {g / '@lanes' / 'cuda-sm90'}, inputs from" in out
    assert re.search(r"\n  0 +2 +0\.75\n", out), out  # grad_norm, pg_loss of that lane
    assert "rollout-rollout-step000000.safetensors (rollout 'rollout', step 0)" in out
    assert "tensors-forward-step000000-rank0.safetensors (tensors 'forward'" in out

    assert main(["show", str(g), "--lane", "cuda-sm90", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["lane"] == "cuda-sm90"
    assert document["metrics"] == {"0": {"grad_norm": 2.0, "pg_loss": 0.75}}
    assert sorted(document["files"]) == [
        "rollout-rollout-step000000.safetensors",
        "tensors-forward-step000000-rank0.safetensors",
    ]
    assert main(["show", str(g), "--lane", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["metrics"]["0"]["pg_loss"] == 0.5


def test_show_of_a_lane_the_golden_lacks_names_the_lanes_it_holds(tmp_path, capsys):
    g = two_lanes(tmp_path / "g")
    assert main(["show", str(g), "--lane", "rocm-gfx942"]) == 2
    err = capsys.readouterr().err
    assert f"golden {g} has no lane 'rocm-gfx942'; it holds lanes cpu, cuda-sm90" in err


def test_show_of_a_golden_recorded_before_lanes_names_its_fingerprints_lane(tmp_path, capsys):
    record(tmp_path / "g", None, 0.5)
    assert main(["show", str(tmp_path / "g"), "--json"]) == 0
    (lane,) = json.loads(capsys.readouterr().out)["lanes"]
    assert lane["lane"] == "cpu" and lane["base"] is True


# ------------------------------------------------------------------ diff and plot


def test_diff_compares_two_lanes_of_one_golden_with_the_tolerances(tmp_path, capsys):
    g = two_lanes(tmp_path / "g")
    assert main(["diff", f"{g}@cpu", f"{g}@cuda-sm90", "--no-config"]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"A: {g}@cpu\nB: {g}@cuda-sm90\n")
    assert "g (lane cpu vs cuda-sm90): DIFFERS (1 beyond tolerance); 2 metric values," in out
    assert "pg_loss  0     0.5  0.5005" in out
    assert "only in" not in out, "the inputs are the golden's, not a lane's: not compared"
    within = ["--tolerance", "pg_loss:rtol=2e-3", "--no-config"]
    assert main(["diff", f"{g}@cpu", f"{g}@cuda-sm90", *within]) == 0
    capsys.readouterr()

    code = main(["diff", f"{g}@cpu", f"{g}@cuda-sm90", "--json", "--no-config"])
    document = json.loads(capsys.readouterr().out)
    assert code == 1 and document["a"] == f"{g}@cpu"
    (golden,) = document["goldens"]
    assert golden["a"] == str(g) and golden["b"] == str(g / "@lanes" / "cuda-sm90")
    assert golden["first_divergence"]["pg_loss"] == 0


def test_diff_of_lanes_compares_tensors_and_lane_of_a_root(tmp_path, capsys):
    two_lanes(tmp_path / "golden" / "t" / "bumped", gpu_loss=0.5, bump=1e-3)
    two_lanes(tmp_path / "golden" / "t" / "same", gpu_loss=0.5)
    record(tmp_path / "golden" / "t" / "cpu_only", "cpu", 0.5)
    root = tmp_path / "golden"
    code = main(["diff", f"{root}@cpu", f"{root}@cuda-sm90", "--json", "--no-config"])
    document = json.loads(capsys.readouterr().out)
    assert code == 1
    by_name = {d["golden"]: d for d in document["goldens"]}
    assert by_name["t/same (lane cpu vs cuda-sm90)"]["differences"] == 0
    bumped = by_name["t/bumped (lane cpu vs cuda-sm90)"]
    assert [t["name"] for t in bumped["tensors"] if not t["ok"]] == ["forward/log_probs"]
    assert by_name["t/cpu_only (lane cpu vs cuda-sm90)"]["problems"] == [
        f"golden {root / 't' / 'cpu_only'} has no lane 'cuda-sm90'; it holds lane cpu"
    ]


def test_diff_of_a_lane_computed_on_other_inputs_is_a_difference_not_a_comparison(tmp_path, capsys):
    g = two_lanes(tmp_path / "g", gpu_loss=0.5)
    make_stale(g, tmp_path)
    code = main(["diff", f"{g}@cpu", f"{g}@cuda-sm90", "--json", "--no-config"])
    (golden,) = json.loads(capsys.readouterr().out)["goldens"]
    assert code == 1 and golden["metrics"] == [] and golden["tensors"] == []
    (problem,) = golden["problems"]
    assert "computed on other inputs" in problem and "--golden-lane cuda-sm90" in problem


def test_diff_of_a_lane_a_golden_lacks_could_not_compare(tmp_path, capsys):
    g = two_lanes(tmp_path / "g")
    assert main(["diff", f"{g}@cpu", f"{g}@h100", "--no-config"]) == 2
    assert f"golden {g} has no lane 'h100'; it holds lanes cpu, cuda-sm90" in (
        capsys.readouterr().err
    )
    assert main(["diff", f"{g / 'nope'}@cpu", str(g), "--no-config"]) == 2
    assert f"{g / 'nope'}@cpu: no such file or directory" in capsys.readouterr().err


def test_a_golden_recorded_before_lanes_diffs_as_its_fingerprints_lane(tmp_path, capsys):
    record(tmp_path / "g", None, 0.5)
    record(tmp_path / "g", "gpu", 0.5)  # a lane beside a golden that names none
    assert main(["diff", f"{tmp_path / 'g'}@cpu", f"{tmp_path / 'g'}@gpu", "--no-config"]) == 0


def test_plot_draws_two_lanes_of_one_golden(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    g = two_lanes(tmp_path / "g")
    out = tmp_path / "lanes.png"
    assert main(["plot", f"{g}@cpu", f"{g}@cuda-sm90", "-o", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {out}"


def test_plot_of_two_roots_lanes_names_a_golden_without_the_lane(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    root = tmp_path / "golden"
    two_lanes(root / "t" / "both")
    record(root / "t" / "cpu_only", "cpu", 0.5)
    out = tmp_path / "plots"
    assert main(["plot", f"{root}@cpu", f"{root}@cuda-sm90", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (out / "t" / "both.png").read_bytes().startswith(b"\x89PNG")
    assert not (out / "t" / "cpu_only.png").exists()
    assert (
        f"not drawn: t/cpu_only: golden {root / 't' / 'cpu_only'} has no lane 'cuda-sm90'; "
        "it holds lane cpu"
    ) in printed


def test_only_an_existing_golden_followed_by_a_lane_name_is_split(tmp_path):
    from pytest_rollout_golden._internal.golden.lanes import split_lane

    (tmp_path / "g").mkdir()
    (tmp_path / "named@cpu").mkdir()
    assert split_lane(tmp_path / "g@cpu") == (tmp_path / "g", "cpu")
    assert split_lane(tmp_path / "named@cpu") == (tmp_path / "named@cpu", None)
    assert split_lane(tmp_path / "nope@cpu") == (tmp_path / "nope@cpu", None)
    assert split_lane(tmp_path / "g@CPU") == (tmp_path / "g@CPU", None)
    assert split_lane(tmp_path / "@shared") == (tmp_path / "@shared", None)


# ------------------------------------------------------------------ devices


class OnAnotherDevice(torch.Tensor):
    """A tensor that behaves as a CUDA one does beside CPU tensors, on a machine without a GPU:
    it says it is on ``cuda:0``, an op that mixes it with a CPU tensor raises torch's own
    error, and ``.cpu()`` or ``.to("cpu")`` gives a CPU tensor."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__self__", None) is torch.Tensor.device:  # the device property
            return torch.device("cuda", 0)
        to_cpu = func is torch.Tensor.cpu
        if func is torch.Tensor.to:
            target = [*args[1:], *kwargs.values()][:1]
            to_cpu = isinstance(target[0], (str, torch.device)) if target else False
            to_cpu = to_cpu and torch.device(target[0]).type == "cpu"
        if to_cpu:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs).as_subclass(torch.Tensor)
        flat = [*args, *kwargs.values()]
        flat += [x for a in args if isinstance(a, (list, tuple)) for x in a]
        plain = [t for t in flat if type(t) is torch.Tensor and t.dim() > 0]
        if plain:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two "
                "devices, cuda:0 and cpu!"
            )
        return super().__torch_function__(func, types, args, kwargs)


def test_the_stand_in_for_a_cuda_tensor_fails_as_one_does():
    cuda, cpu = torch.ones(3).as_subclass(OnAnotherDevice), torch.ones(3)
    assert cuda.device == torch.device("cuda", 0)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        cuda.isnan() & cpu.isnan()
    assert type(cuda.cpu()) is torch.Tensor and type(cuda.to("cpu")) is torch.Tensor
    assert type(cuda.to(cpu.device)) is torch.Tensor


@pytest.mark.parametrize("cuda_side", ["a", "b"])
def test_diff_compares_goldens_of_two_devices_on_the_cpu(tmp_path, capsys, monkeypatch, cuda_side):
    """A golden whose tensors this machine would put on its GPU (codec restores the recorded
    device), diffed against a CPU golden: every comparison runs on the CPU."""
    from pytest_rollout_golden._internal.report import diff as diff_module
    from pytest_rollout_golden.store import codec

    record(tmp_path / "a", None, 0.5)
    record(tmp_path / "b", None, 0.5)
    with Golden(tmp_path / "a", mode=Mode.UPDATE) as g:  # NaN in both: _nan_in_both runs
        g.rollout(_batch, step=0)
        g.check({"pg_loss": 0.5, "grad_norm": 2.0}, step=0)
        g.check_tensors("forward", {"log_probs": torch.tensor([float("nan"), 1.0])}, step=0)
    shutil.copytree(tmp_path / "a", tmp_path / "b", dirs_exist_ok=True)
    cuda_dir = tmp_path / cuda_side
    loaded = diff_module.load_golden

    def load_golden(directory):
        with monkeypatch.context() as m:
            if Path(directory) == cuda_dir:
                m.setattr(codec, "_device_here", lambda device, path: "cuda:0")
                m.setattr(codec, "_to_device", _on_gpu)
            return loaded(directory)

    monkeypatch.setattr(diff_module, "load_golden", load_golden)
    code = main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--json", "--no-config"])
    (golden,) = json.loads(capsys.readouterr().out)["goldens"]
    assert code == 1  # NaN in both, equal_nan off: the plugin's verdict, on the CPU
    (row,) = [t for t in golden["tensors"] if not t["ok"]]
    assert "NaN against NaN at 1 element(s) (equal_nan is off)" in row["detail"]
    assert "--tolerance forward/log_probs:equal_nan=true" in row["detail"]


def _on_gpu(tensor, device):
    """``codec._to_device`` on a machine whose GPU the stand-in plays."""
    return tensor if device == "cpu" else tensor.as_subclass(OnAnotherDevice)


# ------------------------------------------------------------------ the docs


def test_the_lanes_guide_shows_what_show_and_diff_print(tmp_path, capsys, monkeypatch):
    """docs/guide/lanes.md's "Inspecting lanes" block is this output, paths made relative."""
    monkeypatch.chdir(tmp_path)
    g = Path("golden") / "test_grpo" / "test_step"
    two_lanes(g)
    set_fingerprint(g, device="cpu (x86_64)")
    set_fingerprint(g / "@lanes" / "cuda-sm90", device="NVIDIA H200", cuda="12.8")
    printed = []
    for args in (["show", str(g)], ["diff", f"{g}@cpu", f"{g}@cuda-sm90", "--no-config"]):
        code = main(args)
        printed += [f"$ rollout-golden {' '.join(args)}", *capsys.readouterr().out.splitlines()]
        printed += ["$ echo $?", str(code)] if code else []
    page = (DOCS / "guide" / "lanes.md").read_text()
    block = page.split("## Inspecting lanes")[1].split("```\n")[1].splitlines()
    shown = [line for line in block if line != "..."]
    missing = [line for line in shown if line not in printed]
    assert not missing, "lanes.md shows lines the commands did not print:\n" + "\n".join(
        [*missing, "--- printed:", *printed]
    )
