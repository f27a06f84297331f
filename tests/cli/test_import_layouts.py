"""rollout-golden import (issue 17): each framework's dump layout as its own code writes it.

Where a framework is installed (verl 0.9.1) its writer runs; elsewhere the writer is
reproduced from its source, named with file@commit in each test's docstring. Every import
replays bit-identically through the ``golden`` fixture or :class:`Golden`.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import types
import zipfile
from pathlib import Path

import pytest
import torch

from pytest_rollout_golden import Golden, GoldenError, Mode, dumps
from pytest_rollout_golden.cli import main


def same(a, b) -> None:
    """Deep, bit-level equality of a dump and what the golden replays."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.view(torch.uint8) if a.is_floating_point() else a,
                           b.view(torch.uint8) if b.is_floating_point() else b)  # fmt: skip
    elif isinstance(a, dict):
        assert set(a) == set(b), (set(a), set(b))
        for key in a:
            same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    else:
        assert a == b and type(a) is type(b), (a, b)


def replay(golden: Path, step: int, name: str = "rollout"):
    with Golden(golden, mode=Mode.STRICT) as g:
        return g.rollout(lambda: pytest.fail("generated instead of replayed"), step=step, name=name)


def import_(source, target, *extra) -> int:
    return main(["import", str(source), "-o", str(target), *extra])


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def accounted(out: str, root: Path) -> None:
    """Every file under ``root`` is named once: imported (``->``) or skipped with a reason."""
    for path in files_under(root):
        lines = [line for line in out.splitlines() if line.startswith(str(path))
                 or line.startswith(f"skipped {path}")]  # fmt: skip
        assert len(lines) == 1, (path, out)
        assert " -> " in lines[0] or ": " in lines[0], lines[0]


# --- verl: RolloutTqSkip (V1 trainer) ------------------------------------------------


@pytest.fixture
def verl_tq_skip(monkeypatch, placeholder):
    """verl 0.9.1's RolloutTqSkip; ``transfer_queue`` (its data source) answers from a dict.

    ``ray`` and ``transformers`` are imported by verl.protocol only for annotations: empty
    placeholders stand in where they are missing (as in test_real_batches.py).
    """
    if importlib.util.find_spec("verl") is None:
        pytest.skip("verl is not installed; pip install --no-deps verl==0.9.1 (see .ci/run)")
    for name in ("ray", "transformers"):
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            monkeypatch.setitem(sys.modules, name, placeholder(name))
    store: dict = {}
    tq = types.ModuleType("transfer_queue")
    tq.kv_batch_get = lambda keys, partition_id: store[tuple(keys)]
    monkeypatch.setitem(sys.modules, "transfer_queue", tq)
    try:
        module = importlib.import_module("verl.utils.skip.rollout_skip")
    except ImportError as error:
        pytest.skip(f"verl.utils.skip needs {error.name!r}")
    return module.RolloutTqSkip, store


def test_verl_v1_step_from_the_outer_folder_and_one_rollout_per_inner_folder(
    tmp_path, verl_tq_skip, capsys
):
    """Item 2: verl 0.9.1 RolloutTqSkip.prepare_data writes {step}/{inner_idx}/tq_batch.pt."""
    from omegaconf import OmegaConf

    RolloutTqSkip, store = verl_tq_skip
    config = OmegaConf.create({
        "trainer": {"experiment_name": "exp", "project_name": "proj",
                    "v1": {"trainer_mode": "separate", "separate": {"parameter_sync_step": 2}}},
        "actor_rollout_ref": {"rollout": {"n": 2}},
        "data": {"train_batch_size": 2, "max_prompt_length": 3, "max_response_length": 4},
    })  # fmt: skip
    local = types.SimpleNamespace(action="cache", enable=True, dump_dir=str(tmp_path / "dump"),
                                  steps=None)  # fmt: skip
    skip = RolloutTqSkip(local, config)
    payloads = {}
    for step in (2, 5):  # no step 0 or 1: a dump that starts late
        for inner in (0, 1):
            keys = [f"u{step}{inner}_0_0", f"u{step}{inner}_0_1"]
            g = torch.Generator().manual_seed(10 * step + inner)
            store[tuple(keys)] = {
                "input_ids": torch.randint(0, 50, (2, 7), generator=g),
                "rollout_log_probs": -torch.rand(2, 4, generator=g, dtype=torch.bfloat16),
            }
            batch = types.SimpleNamespace(keys=keys, partition_id="train", tags=[{"s": 0}] * 2)
            skip.prepare_data(step, batch, global_steps=step)
            payloads[step, inner] = {"tensordict": store[tuple(keys)], "tags": batch.tags,
                                     "keys": keys, "global_steps": step}  # fmt: skip
    capsys.readouterr()
    out = tmp_path / "golden"
    assert import_(tmp_path / "dump", out) == 0
    printed = capsys.readouterr().out
    accounted(printed, tmp_path / "dump")
    assert "meta.json: verl's step record" in printed
    for (step, inner), payload in payloads.items():
        same(payload, replay(out, step, "rollout" if inner == 0 else f"rollout_inner{inner}"))
    with Golden(out, mode=Mode.STRICT) as g, pytest.raises(Exception, match="step 0"):
        g.rollout(lambda: {"x": torch.zeros(1)}, step=0)
    assert main(["verify", str(out)]) == 0


def test_verl_v0_rollout_skip_gen_batch_with_its_meta_json(tmp_path, verl_tq_skip, capsys):
    """verl 0.9.1 RolloutSkip.prepare_data: {step}/gen_batch.dp (DataProto.save_to_disk)."""
    from omegaconf import OmegaConf

    rollout_skip = importlib.import_module("verl.utils.skip.rollout_skip")
    protocol = importlib.import_module("verl.protocol")
    config = OmegaConf.create({
        "trainer": {"experiment_name": "exp", "project_name": "proj"},
        "actor_rollout_ref": {"rollout": {"n": 1}},
        "data": {"train_batch_size": 2, "max_prompt_length": 3, "max_response_length": 4},
    })  # fmt: skip
    local = types.SimpleNamespace(action="cache", enable=True, dump_dir=str(tmp_path / "dump"),
                                  steps=None)  # fmt: skip
    skip = rollout_skip.RolloutSkip(local, config)
    batches = {}
    for step in (4, 6):
        g = torch.Generator().manual_seed(step)
        batches[step] = protocol.DataProto.from_dict(
            tensors={"responses": torch.randint(0, 9, (2, 4), generator=g),
                     "rollout_log_probs": -torch.rand(2, 4, generator=g)},
            meta_info={"global_steps": step},
        )  # fmt: skip
        skip.prepare_data(step, batches[step])
    capsys.readouterr()
    out = tmp_path / "golden"
    assert import_(tmp_path / "dump", out, "--trust-pickle") == 0
    accounted(capsys.readouterr().out, tmp_path / "dump")
    for step, batch in batches.items():
        replayed = replay(out, step)  # a DataProto, or its parts as a dict (see codec.py)
        if not isinstance(replayed, dict):
            replayed = {"batch": replayed.batch, "meta_info": replayed.meta_info}
        for key in ("responses", "rollout_log_probs"):
            same(batch.batch[key], replayed["batch"][key])
        assert replayed["meta_info"] == {"global_steps": step}


@pytest.mark.parametrize("folders", ["GBS2_N1_in2_out4/3", "\u00b2/0"], ids=["name", "superscript"])
def test_verl_tq_batch_outside_a_step_folder_is_named(tmp_path, capsys, folders):
    """Item 2: a tq_batch.pt not under {step}/{inner_idx}/ is an error naming the file ("²"
    is a digit to str.isdigit, not a number to int())."""
    inner = tmp_path / "dump" / folders
    inner.mkdir(parents=True)
    torch.save({"tensordict": {"x": torch.zeros(2)}}, inner / "tq_batch.pt")
    assert import_(tmp_path / "dump", tmp_path / "golden") == 2
    err = capsys.readouterr().err
    assert f"{inner / 'tq_batch.pt'}: " in err and "{step}/{inner_idx}/tq_batch.pt" in err
    assert not (tmp_path / "golden").exists()


# --- NexRL: DataDumper ---------------------------------------------------------------


class NexRLDumper:
    """NexRL's DataDumper as written in nexrl/utils/data_dumper.py@6860191994413876a9d7f1431d
    79c29d114a12e6 (nex-agi/NexRL), dump_format "pt": the nine sub-folders it creates, its
    file names and the dict each dump_* method saves (reproduced, not imported: NexRL is not
    on the package index)."""

    SUBDIRS = ("trajectory", "old_log_probs", "forward_data", "loss", "param", "gradient",
               "prepared_trajectories", "datums", "training_metrics")  # fmt: skip

    def __init__(self, root: Path, rank: int = 0):
        self.root, self.rank = root, rank
        for sub in self.SUBDIRS:
            (root / sub).mkdir(parents=True, exist_ok=True)

    def _write(self, sub: str, name: str, data: dict) -> None:
        torch.save(data, self.root / sub / f"{name}.pt")

    @staticmethod
    def trajectory(i: int) -> dict:
        return {"tokens": [1, 2, 3 + i], "loss_mask": [0, 1, 1], "reward": 0.5 * i,
                "is_val": False, "extra_fields": {"uid": f"u{i}", "score": 1.0 + i}}  # fmt: skip

    def dump_trajectory(self, step: int, n: int) -> dict:
        data = {"step": step, "num_trajectories": n,
                "trajectories": [self.trajectory(i) for i in range(n)]}  # fmt: skip
        self._write("trajectory", f"step_{step:06d}", data)
        return data

    def dump_old_log_probs(self, step: int, old: torch.Tensor) -> dict:
        data = {"step": step, "old_log_probs": old, "shape": list(old.shape),
                "batch_info": {"batch_size": old.shape[0], "input_ids_shape": [2, 9]}}  # fmt: skip
        self._write("old_log_probs", f"step_{step:06d}", data)
        return data

    def dump_forward_data(self, step: int, micro: int, lp: torch.Tensor, ent: torch.Tensor,
                          mask: torch.Tensor) -> dict:  # fmt: skip
        data = {"step": step, "rank": self.rank, "micro_idx": micro, "log_probs": lp,
                "entropy": ent, "response_mask": mask, "log_probs_shape": list(lp.shape),
                "entropy_shape": list(ent.shape)}  # fmt: skip
        self._write("forward_data", f"step_{step:06d}_rank{self.rank}_micro{micro}", data)
        return data

    def dump_loss(self, step: int, micro: int, loss: float, pg: float, ent: float) -> dict:
        data = {"step": step, "rank": self.rank, "micro_idx": micro, "loss": float(loss),
                "pg_loss": float(pg), "entropy_loss": float(ent),
                "metrics": {"actor/pg_clipfrac": 0.125, "actor/ppo_kl": float(torch.tensor(1e-3))},
                "extra_info": {"epoch": 0, "batch_idx": micro,
                               "first_1000_entropy_loss": ent / 3}}  # fmt: skip
        self._write("loss", f"step_{step:06d}_rank{self.rank}_micro{micro}", data)
        return data

    def _param_like(self, sub: str, key: str, step: int, name: str, t: torch.Tensor) -> dict:
        f = t.float()
        data = {"step": step, "rank": self.rank, "param_name": name, key: t,
                "shape": list(t.shape), "dtype": str(t.dtype), "norm": float(f.norm()),
                "mean": float(f.mean()), "std": float(f.std())}  # fmt: skip
        self._write(sub, f"step_{step:06d}_rank{self.rank}", data)
        return data

    def dump_param(self, step: int, name: str, param: torch.Tensor) -> dict:
        return self._param_like("param", "param", step, name, param)

    def dump_gradient(self, step: int, name: str, grad: torch.Tensor) -> dict:
        return self._param_like("gradient", "gradient", step, name, grad)

    def dump_prepared_trajectories(self, step: int, n: int) -> dict:
        data = {"step": step, "num_trajectories": n,
                "trajectories": [self.trajectory(i) for i in range(n)],
                "advantages": [0.25 * i - 0.5 for i in range(n)]}  # fmt: skip
        self._write("prepared_trajectories", f"step_{step:06d}", data)
        return data

    def dump_datums(self, step: int) -> dict:
        datums = [{"model_input": {"chunks": [[1, 2, 3], [4, 5]]},
                   "loss_fn_inputs": {"target_tokens": [2, 3, 4], "weights": [0.0, 1.0, 1.0],
                                      "advantages": [0.1, 0.1, 0.1]}}]  # fmt: skip
        data = {"step": step, "num_datums": len(datums), "datums": datums}
        self._write("datums", f"step_{step:06d}", data)
        return data

    def dump_training_metrics(self, step: int) -> dict:
        data = {"step": step, "metrics": {"loss:sum": 1.5, "clip": [0.0, 0.25], "lr": 1e-6,
                                          "backend": "weaver"}}  # fmt: skip
        self._write("training_metrics", f"step_{step:06d}", data)
        return data


def test_nexrl_every_file_imports_dicts_flatten_and_bookkeeping_is_not_checked(tmp_path, capsys):
    """Item 4: all 9 kinds (param/gradient without micro index) import; the natural gate passes."""
    root = tmp_path / "debug_dump"
    dumped: dict = {}
    for rank in (0, 1):
        d = NexRLDumper(root, rank)
        for micro in (0, 1):
            g = torch.Generator().manual_seed(100 * rank + micro)
            dumped["forward", rank, micro] = d.dump_forward_data(
                3, micro, -torch.rand(2, 5, generator=g), torch.rand(2, 5, generator=g),
                torch.ones(2, 5, dtype=torch.int64))  # fmt: skip
            dumped["loss", rank, micro] = d.dump_loss(3, micro, 0.1 + rank, 0.05 * micro, -0.01)
        w = torch.randn(4, 3, generator=torch.Generator().manual_seed(rank)).bfloat16()
        dumped["param", rank] = d.dump_param(3, "model.layers.0.mlp.weight", w)
        dumped["gradient", rank] = d.dump_gradient(3, "model.layers.0.mlp.weight", w * 0.5)
    d = NexRLDumper(root, 0)
    trajectory = d.dump_trajectory(3, 2)
    old = d.dump_old_log_probs(3, -torch.rand(2, 5))
    prepared = d.dump_prepared_trajectories(3, 2)
    datums = d.dump_datums(3)
    metrics = d.dump_training_metrics(3)
    (root / "README.txt").write_text("notes\n")
    n_files = len(files_under(root))

    out = tmp_path / "golden"
    assert import_(root, out) == 0
    printed = capsys.readouterr().out
    accounted(printed, root)
    assert printed.count(" -> ") == n_files - 1
    assert f"skipped {root / 'README.txt'}: " in printed

    with Golden(out, mode=Mode.STRICT) as g:
        same(trajectory, g.rollout(lambda: pytest.fail("generated"), step=3))
        for rank in (0, 1):
            for micro in (0, 1):
                f = dumped["forward", rank, micro]
                natural = {k: f[k] for k in ("log_probs", "entropy", "response_mask")}
                g.check_tensors("forward_data", natural, step=3, rank=rank, micro=micro)
                loss = dumped["loss", rank, micro]
                g.check_tensors("loss", {
                    "loss": loss["loss"], "pg_loss": loss["pg_loss"],
                    "entropy_loss": loss["entropy_loss"],
                    "metrics/actor/pg_clipfrac": loss["metrics"]["actor/pg_clipfrac"],
                    "metrics/actor/ppo_kl": loss["metrics"]["actor/ppo_kl"],
                    "extra_info/first_1000_entropy_loss":
                        loss["extra_info"]["first_1000_entropy_loss"],
                }, step=3, rank=rank, micro=micro)  # fmt: skip
            g.check_tensors("param", {"param": dumped["param", rank]["param"]}, step=3, rank=rank)
            grad = dumped["gradient", rank]["gradient"]
            g.check_tensors("gradient", {"gradient": grad}, step=3, rank=rank)
        g.check_tensors("old_log_probs", {"old_log_probs": old["old_log_probs"]}, step=3)
        for kind, payload in (("prepared_trajectories", prepared), ("datums", datums),
                              ("training_metrics", metrics)):  # fmt: skip
            bookkeeping = ("step", "num_trajectories", "num_datums")  # kept as metadata
            checked = dumps.flatten({k: v for k, v in payload.items() if k not in bookkeeping})
            g.check_tensors(kind, checked, step=3)
    # ...and a drifted value fails, named by its flattened name.
    drifted = pytest.raises(AssertionError, match="loss/metrics/actor/pg_clipfrac")
    with drifted, Golden(out, mode=Mode.STRICT) as g:
        g.check_tensors("loss", {
            "loss": 0.1, "pg_loss": 0.0, "entropy_loss": -0.01,
            "metrics/actor/pg_clipfrac": 0.126,
            "metrics/actor/ppo_kl": dumped["loss", 0, 0]["metrics"]["actor/ppo_kl"],
            "extra_info/first_1000_entropy_loss": -0.01 / 3,
        }, step=3, rank=0, micro=0)  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    grad_info = manifest["files"]["tensors-gradient-step000003-rank1.safetensors"]
    assert grad_info["dump"]["param_name"] == "model.layers.0.mlp.weight"
    assert grad_info["dump"]["norm"] == dumped["gradient", 1]["norm"]
    assert main(["verify", str(out)]) == 0


def test_nexrl_jsonl_format_imports_with_json_only(tmp_path, capsys):
    """DataDumper with dump_format "jsonl": the same records, tensors as lists, one line each."""
    root = tmp_path / "debug_dump"
    for kind in ("trajectory", "loss"):
        (root / kind).mkdir(parents=True)
    trajectory = {"step": 1, "num_trajectories": 1, "trajectories": [NexRLDumper.trajectory(0)]}
    (root / "trajectory" / "step_000001.jsonl").write_text(json.dumps(trajectory) + "\n")
    loss = {"step": 1, "rank": 0, "micro_idx": 0, "loss": 0.5, "pg_loss": 0.25,
            "entropy_loss": 0.125}  # fmt: skip
    (root / "loss" / "step_000001_rank0_micro0.jsonl").write_text(json.dumps(loss) + "\n")
    out = tmp_path / "golden"
    assert import_(root, out) == 0
    with Golden(out, mode=Mode.STRICT) as g:
        same(trajectory, g.rollout(lambda: pytest.fail("generated"), step=1))
        checked = {"loss": 0.5, "pg_loss": 0.25, "entropy_loss": 0.125}
        assert [r.verdict for r in g.check_tensors("loss", checked, step=1, rank=0, micro=0)] == [
            "pass"
        ] * 3


def test_flatten_names_nested_entries_and_keeps_float_bits():
    flat = dumps.flatten({"a": {"b": 0.1, "c": [1, 2]}, "d": [{"e": True}], "s": "text"})
    assert sorted(flat) == ["a/b", "a/c", "d/0/e"]
    assert flat["a/b"].dtype == torch.float64 and flat["a/b"].item() == 0.1
    assert flat["a/c"].dtype == torch.int64 and flat["d/0/e"].dtype == torch.bool


def test_nexrl_keys_that_flatten_to_one_name_are_refused_and_nothing_is_written(tmp_path, capsys):
    """Two of five values named ``metrics/actor/kl`` (a key holding "/" and a nested dict)
    would keep one and drop the other: refused, naming the file, the step and both keys."""
    root = tmp_path / "debug_dump"
    (root / "loss").mkdir(parents=True)
    torch.save({"step": 2, "loss": 0.5}, root / "loss" / "step_000001_rank0_micro0.pt")
    loss = {"step": 2, "rank": 0, "micro_idx": 0, "loss": 0.5, "pg_loss": 0.25,
            "metrics": {"actor/kl": 0.1, "actor": {"kl": 0.2, "clipfrac": 0.0}}}  # fmt: skip
    path = root / "loss" / "step_000002_rank0_micro0.pt"
    torch.save(loss, path)
    out = tmp_path / "golden"
    assert import_(root, out) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: step 2, {path}: ")
    assert "the keys ['metrics']['actor']['kl'] and ['metrics']['actor/kl']" in err
    assert "both flatten to the name 'metrics/actor/kl'" in err
    assert "rename one of the two keys" in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("value", "keys"),
    [
        ({"a/b": 1.0, "a": {"b": 2.0}}, ("['a/b']", "['a']['b']")),
        ({1: 1.0, "1": 2.0}, ("[1]", "['1']")),
        ({"x": [1, "s"], "x/0": 3}, ("['x'][0]", "['x/0']")),
        ({"": {"a": 1}, "a": "text"}, ("['']['a']", "['a']")),
    ],
    ids=["slash", "int-and-str-key", "list-index", "empty-key"],
)
def test_flatten_refuses_two_values_of_one_name(value, keys):
    with pytest.raises(GoldenError) as raised:
        dumps.flatten(value)
    assert keys[0] in str(raised.value) and keys[1] in str(raised.value)


# --- slime: save_debug_rollout_data / save_debug_train_data ---------------------------


def slime_sample(i: int, rollout_id: int) -> dict:
    """A Sample.to_dict() (slime/utils/types.py@624b824a): status as its value, infos as dicts."""
    return {"group_index": 0, "index": i, "prompt": f"q{i}", "tokens": [1, 2, 3 + i],
            "response": "a", "response_length": 2, "label": "4", "reward": 0.5 * i,
            "loss_mask": None, "rollout_log_probs": [-0.25, -0.125 * (i + 1)],
            "status": "completed", "metadata": {"rollout": rollout_id},
            "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0,
                          "spec_verify_ct": 0, "completion_token_num": 0},
            "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 3}}  # fmt: skip


def test_slime_train_eval_and_per_rank_train_data_do_not_collide(tmp_path, capsys):
    """Item 5: --dump-details DIR writes rollout_data/{rollout_id}.pt, eval_{rollout_id}.pt
    (slime/observability/rollout_data_utils.py@624b824a898ab0ec1fcb4d373004c7f3852bf515,
    save_debug_rollout_data) and train_data/{rollout_id}_{rank}.pt, one per rank
    (slime/utils/train_dump_utils.py and arguments.py@d38dc29c9d72c88d221e12c320fc6aa41982e5a2,
    save_debug_train_data: {rollout_id, rank, rollout_data})."""
    root = tmp_path / "details"
    (root / "rollout_data").mkdir(parents=True)
    (root / "train_data").mkdir(parents=True)
    rollouts, evals, trains = {}, {}, {}
    for rollout_id in (0, 1):
        samples = [slime_sample(i, rollout_id) for i in range(2)]
        rollouts[rollout_id] = {"rollout_id": rollout_id, "samples": samples}
        torch.save(rollouts[rollout_id], root / "rollout_data" / f"{rollout_id}.pt")
        evals[rollout_id] = {"rollout_id": rollout_id,
                             "samples": [slime_sample(7, rollout_id)]}  # fmt: skip
        torch.save(evals[rollout_id], root / "rollout_data" / f"eval_{rollout_id}.pt")
        for rank in (0, 1):
            data = {"tokens": [torch.tensor([1, 2, 3 + rank])],
                    "log_probs": [-torch.rand(2, generator=torch.Generator().manual_seed(rank))],
                    "advantages": [torch.tensor([0.5, 0.5])]}  # fmt: skip
            trains[rollout_id, rank] = {"rollout_id": rollout_id, "rank": rank,
                                        "rollout_data": data}  # fmt: skip
            torch.save(trains[rollout_id, rank],
                       root / "train_data" / f"{rollout_id}_{rank}.pt")  # fmt: skip
    out = tmp_path / "golden"
    assert import_(root, out, "--layout", "slime") == 0
    accounted(capsys.readouterr().out, root)
    for rollout_id in (0, 1):
        same(rollouts[rollout_id], replay(out, rollout_id))
        same(evals[rollout_id], replay(out, rollout_id, "eval"))
        for rank in (0, 1):
            same(trains[rollout_id, rank], replay(out, rollout_id, f"train_rank{rank}"))
    assert main(["verify", str(out)]) == 0


def test_slime_format_2_train_data_is_the_train_rollout_of_its_rank(tmp_path):
    """Newer save_debug_train_data (train_data_utils.py@624b824a, _build_dump_payload): one
    file per DP source rank, {format_version: 2, rollout_id, rank, samples, dp_shards, ...}."""
    root = tmp_path / "details" / "train_data"
    root.mkdir(parents=True)
    payload = {"format_version": 2, "rollout_id": 4, "rank": 2,
               "samples": [{"data_parallel_rank": 0, "rollout_position": 0,
                            "tokens": torch.tensor([1, 2, 3]),
                            "log_probs": torch.tensor([-0.5, -0.25])}],
               "dp_shards": [{"rank": 2, "data_parallel_rank": 0, "sample_indices": None,
                              "partition": [0]}],
               "total_lengths": [3]}  # fmt: skip
    torch.save(payload, root / "4.pt")
    out = tmp_path / "golden"
    assert import_(tmp_path / "details", out, "--layout", "slime") == 0
    same(payload, replay(out, 4, "train_rank2"))


def test_slime_two_dumps_of_one_rollout_name_both_files(tmp_path, capsys):
    root = tmp_path / "dump"
    root.mkdir()
    for name in ("a_3.pt", "b_3.pt"):
        torch.save({"rollout_id": 3, "samples": [slime_sample(0, 3)]}, root / name)
    assert import_(root, tmp_path / "golden", "--layout", "slime") == 2
    err = capsys.readouterr().err
    assert f"step 3, {root / 'b_3.pt'}: a second dump for rollout-rollout-step000003" in err


@pytest.mark.parametrize("rollout_id", [-5, True, 2.0, "3"], ids=repr)
def test_slime_rollout_id_that_is_not_a_step_is_refused_at_import(tmp_path, capsys, rollout_id):
    """A step is an integer >= 0 (not a bool): what import accepts, verify accepts."""
    root = tmp_path / "dump"
    root.mkdir()
    path = root / "rollout_7.pt"
    torch.save({"rollout_id": rollout_id, "samples": [slime_sample(0, 7)]}, path)
    out = tmp_path / "golden"
    assert import_(root, out, "--layout", "slime") == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: step 7, {path}: its rollout_id is {rollout_id!r}, not a step (an integer >= 0)"
    )
    assert "remove the key to take the step from the file name" in err
    assert not out.exists()


def test_slime_rank_that_is_not_a_rank_is_refused_at_import(tmp_path, capsys):
    root = tmp_path / "dump"
    root.mkdir()
    path = root / "3_0.pt"
    torch.save({"rollout_id": 3, "rank": True, "rollout_data": {"tokens": [1, 2]}}, path)
    assert import_(root, tmp_path / "golden", "--layout", "slime") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: step 3, {path}: its rank is True, not a rank (an integer >= 0)")


def test_slime_error_before_the_payload_is_read_names_the_step_of_the_file_name(tmp_path, capsys):
    """A file that is neither a torch.save archive nor a pickle is not called a raw pickle."""
    root = tmp_path / "dump" / "rollout_data"
    root.mkdir(parents=True)
    torch.save({"rollout_id": 3, "samples": [slime_sample(0, 3)]}, root / "3.pt")
    (root / "4.pt").write_text("rollout 4 was not dumped: out of disk\n")
    assert import_(tmp_path / "dump", tmp_path / "golden", "--layout", "slime") == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: step 4, {root / '4.pt'}: neither a torch.save archive nor a pickle: it is "
        "text (it starts 'rollout 4 was not dumped')"
    )
    assert "raw pickle" not in err
    assert "move it out of the dump folder" in err


# --- AReaL: WorkflowExecutor._dump_trajectory (JSONL) ---------------------------------


def areal_dump(log_path: Path, task_id: int, versions: list[int], rewards: list[float],
               *, is_eval: bool = False) -> list[dict]:  # fmt: skip
    """WorkflowExecutor._dump_trajectory, areal/infra/workflow_executor.py@628c389e39ff6a90a1f
    46aaa05940546981f4bb8 (inclusionAI/AReaL): one JSON line per sample, appended to
    {log_path}/{rollout|eval-rollout}/{max(versions)}/{task_id}.jsonl (the decoded text is
    written as a tokenizer would give it; no tokenizer needed here)."""
    folder = log_path / ("eval-rollout" if is_eval else "rollout") / str(max(versions))
    folder.mkdir(parents=True, exist_ok=True)
    records = []
    with open(folder / f"{task_id}.jsonl", "a") as f:
        for i, reward in enumerate(rewards):
            record = {"task_id": task_id, "sample_idx": i, "seqlen": 6 + i, "prompt_len": 3,
                      "head_version": min(versions), "tail_version": max(versions),
                      "reward": reward, "prompt": f"<|im_start|>user {task_id}",
                      "completion": f"answer {i} \u00e9"}  # fmt: skip
            f.write(json.dumps(record) + "\n")
            records.append(record)
    return records


def test_areal_jsonl_rollouts_per_version_replay_in_the_plugin(project, tmp_path, capsys):
    """Item 7: AReaL's JSONL dump, one golden rollout per version (step), eval apart."""
    log_path = tmp_path / "logs" / "exp" / "trial"
    v1 = areal_dump(log_path, 3, [1], [1.0, 0.0]) + areal_dump(log_path, 12, [0, 1], [0.1])
    v2 = areal_dump(log_path, 4, [2], [0.3333333333333333])
    ev = areal_dump(log_path, 0, [2], [1.0], is_eval=True)
    target = project.golden / "test_it" / "test_replay"
    assert import_(log_path, target) == 0
    accounted(capsys.readouterr().out, log_path)
    same(v1, replay(target, 1))
    same(v2, replay(target, 2))
    same(ev, replay(target, 2, "eval"))
    assert main(["verify", str(target)]) == 0
    project.write(
        "import pytest\n"
        "def test_replay(golden):\n"
        "    for step in (1, 2):\n"
        "        rows = golden.rollout(lambda: pytest.fail('generated'), step=step)\n"
        "        golden.check({'reward': sum(r['reward'] for r in rows)}, step=step)\n"
    )
    project.run().assert_outcomes(passed=1)
    project.run("--golden-strict").assert_outcomes(passed=1)


def test_areal_bad_json_line_names_file_line_and_step(tmp_path, capsys):
    areal_dump(tmp_path / "log", 5, [4], [1.0])
    path = tmp_path / "log" / "rollout" / "4" / "5.jsonl"
    with open(path, "a") as f:
        f.write('{"task_id": 5, "reward": \n')
    assert import_(tmp_path / "log", tmp_path / "golden", "--layout", "areal") == 2
    err = capsys.readouterr().err
    assert f"step 4, {path}: line 2 is not JSON" in err


def test_areal_names_of_digits_int_cannot_read_are_skipped_with_a_line(tmp_path, capsys):
    """ "²" is a digit to str.isdigit, not a number to int(): skipped, never a traceback."""
    records = areal_dump(tmp_path / "log", 5, [4], [1.0])
    odd = tmp_path / "log" / "rollout" / "4" / "\u00b2.jsonl"
    odd.write_text(json.dumps(records[0]) + "\n")
    assert import_(tmp_path / "log", tmp_path / "golden", "--layout", "areal") == 0
    assert f"skipped {odd}: not an AReaL dump" in capsys.readouterr().out
    assert main(["verify", str(tmp_path / "golden")]) == 0


def test_import_help_lists_each_layouts_file_patterns(capsys):
    """Item 7: `rollout-golden import -h` says which files each layout reads."""
    with pytest.raises(SystemExit):
        main(["import", "-h"])
    text = capsys.readouterr().out
    for pattern in ("{step}/{inner_idx}/tq_batch.pt", "{step}/gen_batch.dp",
                    "step_{step}_rank{rank}_micro{micro}.pt", "step_{step}_rank{rank}.pt",
                    "rollout/{version}/{task_id}.jsonl", "eval_{rollout_id}.pt",
                    "[train|val/]step_{step}.pkl", "{step}.jsonl  trainer.rollout_data_dir",
                    "rollout_dump_data.step_{step}.jsonl", "train_data_step{step}.jsonl",
                    "val_data_step{step}.jsonl", "nemo-rl:"):  # fmt: skip
        assert pattern in text, pattern


def test_a_layout_without_its_files_lists_what_it_reads(tmp_path, capsys):
    (tmp_path / "dump").mkdir()
    (tmp_path / "dump" / "x.txt").write_text("")
    assert import_(tmp_path / "dump", tmp_path / "golden", "--layout", "areal") == 2
    err = capsys.readouterr().err
    assert "rollout/{version}/{task_id}.jsonl" in err and "import -h" not in err


# --- Messages ------------------------------------------------------------------------


class _Blocked:
    """Pickles as a call of os.system: torch names it 'posix.system' and blocks its module."""

    def __reduce__(self):
        return (os.system, ("true",))


class _Custom:
    pass


@pytest.mark.skipif(os.name != "posix", reason="os.system is posix.system on POSIX")
@pytest.mark.parametrize(
    ("payload", "shown"),
    [
        ({"x": _Blocked()}, "it names posix.system, whose module posix torch blocks outright"),
        ({"x": _Custom()}, f"it names {__name__}._Custom, which is not an allowed type"),
    ],
    ids=["blocked-module", "unsupported-global"],
)
def test_torch_refusal_names_the_global_in_a_whole_sentence(tmp_path, capsys, payload, shown):
    """Item 8: both of torch's refusal forms, shown whole with the global they name."""
    dump = tmp_path / "dump"
    dump.mkdir()
    torch.save([payload], dump / "step_000002.pt")
    assert import_(dump, tmp_path / "golden", "--layout", "areal") == 2
    err = capsys.readouterr().err
    assert f"step 2, {dump / 'step_000002.pt'}: cannot be loaded without full unpickling" in err
    assert shown in err
    assert "Weights only load failed" not in err and "In PyTorch 2.6" not in err


def test_a_zip_that_is_not_a_torch_archive_says_so(tmp_path, capsys):
    """Item 8: not 'dump that step again' but what the file is."""
    dump = tmp_path / "dump"
    dump.mkdir()
    with zipfile.ZipFile(dump / "step_000001.pt", "w") as z:
        z.writestr("notes/readme.txt", "hello")
    assert import_(dump, tmp_path / "golden", "--layout", "areal") == 2
    err = capsys.readouterr().err
    assert f"step 1, {dump / 'step_000001.pt'}: a zip archive but not a torch.save" in err
    assert "notes/readme.txt" in err and "dump that step again" not in err
