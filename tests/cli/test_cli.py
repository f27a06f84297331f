"""The rollout-golden command line: verify, show, diff."""

from __future__ import annotations

import torch

from pytest_rollout_golden import Golden, Mode
from pytest_rollout_golden.cli import main


def record(directory, *, pg_loss: float, log_probs: torch.Tensor) -> None:
    with Golden(directory, mode=Mode.AUTO) as golden:
        golden.rollout(lambda: {"ids": torch.arange(6).view(2, 3)}, step=0)
        golden.check({"pg_loss": pg_loss, "grad_norm": 2.0}, step=0)
        golden.check_tensors("forward", {"log_probs": log_probs}, step=0, rank=0)


def test_verify_passes_on_intact_goldens_and_fails_on_a_flipped_bit(tmp_path, capsys):
    record(tmp_path / "golden" / "a", pg_loss=0.5, log_probs=-torch.ones(2, 3))
    assert main(["verify", str(tmp_path / "golden")]) == 0

    victim = tmp_path / "golden" / "a" / "tensors-forward-step000000-rank0.safetensors"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0x01
    victim.write_bytes(bytes(data))
    assert main(["verify", str(tmp_path / "golden")]) == 1
    assert "tensors-forward-step000000-rank0.safetensors" in capsys.readouterr().out


def test_verify_with_no_golden_could_not_run(tmp_path, capsys):
    assert main(["verify", str(tmp_path)]) == 2
    assert f"{tmp_path}: no golden" in capsys.readouterr().err


def test_diff_gates_on_the_plugins_tolerances(tmp_path, capsys):
    lp = -torch.rand(2, 3, dtype=torch.float32)
    record(tmp_path / "a", pg_loss=0.5, log_probs=lp)
    record(tmp_path / "same", pg_loss=0.5, log_probs=lp.clone())
    record(tmp_path / "drift", pg_loss=0.5 * (1 + 1e-3), log_probs=lp)

    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "same")]) == 0
    capsys.readouterr()
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "drift")]) == 1
    out = capsys.readouterr().out
    assert "pg_loss  0     0.5  0.5005" in out  # the row beyond tolerance, values in full
    assert "grad_norm  -                 0/1" in out  # within tolerance: no divergence
    # A tolerance wide enough turns the same drift into a pass.
    assert (
        main(
            [
                "diff",
                str(tmp_path / "a"),
                str(tmp_path / "drift"),
                "--tolerance",
                "pg_loss:rtol=1e-3",
            ]
        )
        == 0
    )


def test_diff_compares_tensor_files_element_wise(tmp_path, capsys):
    lp = -torch.rand(2, 3)
    bumped = lp.clone()
    bumped[1, 2] -= 1e-3
    record(tmp_path / "a", pg_loss=0.5, log_probs=lp)
    record(tmp_path / "b", pg_loss=0.5, log_probs=bumped)
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert "Mismatched elements: 1 / 6" in out and "at index (1, 2)" in out


def test_show_lists_metrics_and_tensors(tmp_path, capsys):
    record(tmp_path / "g", pg_loss=0.25, log_probs=-torch.ones(2, 3))
    assert main(["show", str(tmp_path / "g")]) == 0
    out = capsys.readouterr().out
    assert "pg_loss" in out and "0.25" in out and "tensors-forward-step000000-rank0" in out
    assert main(["show", str(tmp_path / "g" / "rollout-rollout-step000000.safetensors")]) == 0
    assert "  ids     int64[2, 3]   0    5" in capsys.readouterr().out


def test_show_lists_the_calibrated_tolerances_of_both_lanes(tmp_path, capsys):
    from pytest_rollout_golden._internal.tolerance.calibration import FORMAT, write

    record(tmp_path / "g", pg_loss=0.25, log_probs=-torch.ones(2, 3))
    # the reference's runs kept every default; only the variants' lane holds an entry
    doc = {"format": FORMAT, "version": 1, "how": {}, "spreads": {}, "tolerances": {},
           "layout_tolerances": {"pg_loss": {"rtol": 2e-3, "atol": 1e-8}}}  # fmt: skip
    write(tmp_path / "g", doc)
    capsys.readouterr()
    assert main(["show", str(tmp_path / "g")]) == 0
    out = capsys.readouterr().out
    assert (
        "calibrated tolerances (tolerances.json):\n"
        "  same layout: every value keeps its default\n"
        "  across variants:\n"
        "    pg_loss: rtol=0.002, atol=1e-08\n"
    ) in out
