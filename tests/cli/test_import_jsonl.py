"""rollout-golden import of the JSON-lines rollout logs of verl, ROLL and NeMo-RL.

verl 0.9.1 is installed: its own writer runs (the methods of ``RayPPOTrainer``, compiled from
the installed source, on a stand-in trainer). ROLL and NeMo-RL are not installable here: their
writers are reproduced line for line from the upstream file, function and commit named in each
docstring. Every import replays exactly what ``json.loads`` gives for each line: text stays
text, floats keep their bits (NaN, -0.0, subnormals).
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import math
import os
import struct
import sys
import types
from collections import UserDict
from pathlib import Path

import numpy as np
import pytest
import torch

from pytest_rollout_golden import Golden, Mode
from pytest_rollout_golden.cli import main

# Floats a JSON log must keep exactly: repr round-trips them; NaN and inf as json writes them.
HARD_FLOATS = [0.1 + 0.2, -0.0, 5e-324, 1.0 / 3.0, float("nan"), float("inf"), -1e308]


def bits_equal(a, b) -> None:
    """Deep equality of two JSON values, floats by their bits and types by name."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, dict):
        assert list(a) == list(b), (list(a), list(b))
        for key in a:
            bits_equal(a[key], b[key])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            bits_equal(x, y)
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b), (a, b)
    else:
        assert a == b, (a, b)


def json_lines(path: Path) -> list:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def replay(golden: Path, step: int, name: str = "rollout"):
    with Golden(golden, mode=Mode.STRICT) as g:
        return g.rollout(lambda: pytest.fail("generated instead of replayed"), step=step, name=name)


def import_(source: Path, target: Path, *extra: str) -> int:
    return main(["import", str(source), "-o", str(target), *extra])


# --- verl: RayPPOTrainer._log_rollout_data -> {rollout_data_dir}/{global_steps}.jsonl ----------

_VERL_WRITER = ("_write_generations", "_dump_generations", "_init_dump_executor",
                "_shutdown_dump_executor", "_log_rollout_data")  # fmt: skip


class Tokenizer:
    """Decodes token ids to text (non-ASCII included), as ``batch_decode`` does."""

    WORDS = ("the", " answer", " é", " 42", " ∑", "\n", ' "quoted"', " 😀")

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["".join(self.WORDS[int(i) % len(self.WORDS)] for i in row) for row in ids]


@pytest.fixture
def verl_trainer(monkeypatch, placeholder):
    """verl 0.9.1's own rollout-log writer on a stand-in trainer.

    ``verl/trainer/ppo/ray_trainer.py`` needs ray, torchdata and a cluster to import; the five
    methods that write ``rollout_data_dir`` (``_log_rollout_data`` -> ``_dump_generations`` ->
    ``_write_generations`` on the trainer's dump thread) are compiled from the installed file,
    unchanged, with the module-level names they use.
    """
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        pytest.skip("verl is not installed; pip install --no-deps verl==0.9.1 (see .ci/run)")
    for name in ("ray", "transformers"):
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            monkeypatch.setitem(sys.modules, name, placeholder(name))
    from concurrent.futures import ThreadPoolExecutor

    from verl.protocol import DataProto
    from verl.utils.debug import marked_timer

    path = Path(spec.origin).parent / "trainer" / "ppo" / "ray_trainer.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    trainer = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RayPPOTrainer"
    )
    methods = [n for n in trainer.body if isinstance(n, ast.FunctionDef) and n.name in _VERL_WRITER]
    assert sorted(m.name for m in methods) == sorted(_VERL_WRITER)
    writer = ast.ClassDef(name="RayPPOTrainer", bases=[], keywords=[], body=methods,
                          decorator_list=[], type_params=[])  # fmt: skip
    module = ast.fix_missing_locations(ast.Module(body=[writer], type_ignores=[]))
    namespace = {"json": json, "os": os, "np": np, "ThreadPoolExecutor": ThreadPoolExecutor,
                 "DataProto": DataProto, "marked_timer": marked_timer}  # fmt: skip
    exec(compile(module, str(path), "exec"), namespace)

    class Trainer(namespace["RayPPOTrainer"]):
        def __init__(self):
            self.tokenizer, self.global_steps = Tokenizer(), 0
            self._init_dump_executor()

    return Trainer(), DataProto


def verl_batch(DataProto, step: int):
    """A batch as ``fit`` hands ``_log_rollout_data`` (prompts, responses, token_level_scores)."""
    g = torch.Generator().manual_seed(step)
    scores = torch.zeros(3, 4)
    scores[:, -1] = torch.tensor([1.0, 0.1, -0.0]) + step
    return DataProto.from_dict(
        tensors={"prompts": torch.randint(0, 8, (3, 5), generator=g),
                 "responses": torch.randint(0, 8, (3, 4), generator=g),
                 "token_level_scores": scores},
        non_tensors={"reward_model": np.array([{"ground_truth": "42"}, {"ground_truth": "∑"},
                                               {}], dtype=object),
                     "request_id": np.array([f"r{step}-{i}" for i in range(3)], dtype=object)},
    )  # fmt: skip


def run_verl_writer(trainer, DataProto, root: Path, steps) -> dict[int, Path]:
    """``fit``'s call for each step: ``_log_rollout_data`` with the step's reward extra infos."""
    for step in steps:
        trainer.global_steps = step
        hard = HARD_FLOATS[:3] if step % 2 else HARD_FLOATS[3:6]
        extra = {"acc": np.array(hard), "hard": hard, "pred": ["42", None, "x"],
                 "f32": [np.float32(0.1)] * 3}  # fmt: skip
        trainer._log_rollout_data(verl_batch(DataProto, step), extra, {}, str(root))
    trainer._shutdown_dump_executor()
    return {step: root / f"{step}.jsonl" for step in steps}


def test_verl_rollout_data_dir_from_verls_writer_replays_every_line_exactly(
    tmp_path, verl_trainer, capsys
):
    trainer, DataProto = verl_trainer
    written = run_verl_writer(trainer, DataProto, tmp_path / "rollout_data", (1, 2))
    records = {step: json_lines(path) for step, path in written.items()}
    assert records[1][0]["step"] == 1 and records[1][1]["gts"] == "∑"  # the writer ran
    assert records[1][0]["f32"] == "0.1"  # default=str: numpy scalars as text
    assert math.isnan(records[2][1]["hard"])
    capsys.readouterr()
    out = tmp_path / "golden"
    assert import_(tmp_path / "rollout_data", out) == 0
    printed = capsys.readouterr().out
    for step, path in written.items():
        assert f"{path} -> rollout-rollout-step{step:06d}.safetensors" in printed
        bits_equal(records[step], replay(out, step))
    assert main(["verify", str(out)]) == 0


# --- ROLL: dump_rollout_to_specific_path -> rollout_dump_data.step_{N}.jsonl ---------------

ROLL_COLUMNS = [
    ["global_step", "bigint"], ["id", "string"], ["source", "string"],
    ["difficulty", "string"], ["prompt", "string"], ["messages", "string"],
    ["ground_truth", "string"], ["case_type", "string"], ["test_case_function", "string"],
    ["test_cases", "string"], ["tag", "string"], ["domain", "string"],
    ["responses", "string"], ["scores", "double"], ["sampling_params", "string"],
]  # fmt: skip


def roll_dump(path: str, global_step: int, data, tokenizer) -> None:
    """ROLL's RLVR writer, roll/pipeline/rlvr/utils.py@8eb27cc2dc34c4d1310b169d9b86d339004d811a
    (alibaba/ROLL; the file last changed in 7f9d4d3873a87679c8d070085a4bd3bdeea7e589):
    ``dump_rollout_to_specific_path`` builds the columns and ``write_to_json_process`` (run in
    a ``multiprocessing.Process`` upstream, called directly here) writes them as ONE JSON line.
    Called from ``rlvr_pipeline.py`` with ``rollout_dump_dir``; upstream only dumps to an
    absolute path (``json_checker``)."""
    assert path.startswith("/")
    write_data = {k: copy.deepcopy(v) for k, v in data.non_tensor_batch.items()}
    responses = tokenizer.batch_decode(data.batch["responses"], skip_special_tokens=True)
    data_cnt = len(responses)
    write_data["responses"] = responses
    write_data["scores"] = data.batch["scores"].tolist()
    write_data["sampling_params"] = [json.dumps(data.meta_info)] * data_cnt
    write_data["global_step"] = [global_step] * data_cnt
    # write_to_json_process(path, write_data, COLUMMNS_CONFIG):
    os.makedirs(path, exist_ok=True)
    column_names = {item[0] for item in ROLL_COLUMNS}
    write_data = {k: v.tolist() if isinstance(v, np.ndarray) else v
                  for k, v in write_data.items() if k in column_names}  # fmt: skip
    step = write_data.get("global_step", [0])[0]
    with open(
        os.path.join(path, f"rollout_dump_data.step_{step}.jsonl"), "w", encoding="utf-8"
    ) as f:
        f.write(json.dumps(write_data, ensure_ascii=False) + "\n")


def roll_batch(step: int):
    """A generate_output as ROLL's RLVR pipeline has it (DataProto fields the writer reads)."""
    g = torch.Generator().manual_seed(step)
    scores = torch.tensor([0.1 + 0.2, -0.0, float("nan")], dtype=torch.float64) + step
    return types.SimpleNamespace(
        batch={"responses": torch.randint(0, 8, (3, 4), generator=g), "scores": scores},
        non_tensor_batch={"id": np.array(["a", "b", "c"], dtype=object),
                          "prompt": np.array(["1+1?", "∑ 1..3?", "é"], dtype=object),
                          "tag": np.array(["math"] * 3, dtype=object),
                          "domain": np.array(["math_rule"] * 3, dtype=object),
                          "uid_not_dumped": np.array([0, 1, 2])},
        meta_info={"temperature": 0.99, "top_p": 1.0},
    )  # fmt: skip


def test_roll_rlvr_rollout_dump_dir_alone_is_detected_and_replays_its_columns(tmp_path, capsys):
    root = tmp_path / "rollout_dump"
    for step in (0, 3):
        roll_dump(str(root), step, roll_batch(step), Tokenizer())
    out = tmp_path / "golden"
    assert import_(root, out) == 0
    assert "(roll layout)" not in capsys.readouterr().err
    for step in (0, 3):
        (record,) = json_lines(root / f"rollout_dump_data.step_{step}.jsonl")
        assert record["sampling_params"][0] == '{"temperature": 0.99, "top_p": 1.0}'
        bits_equal(record, replay(out, step))
    assert json.loads((out / "manifest.json").read_text())["imported"]["layout"] == "roll"


# --- NeMo-RL: Logger.log_batched_dict_as_jsonl -> train_data_step{N}.jsonl ---------------------


class BatchedDataDict(UserDict):
    """nemo_rl/distributed/batched_data_dict.py@96b32710b6bb72140ff746f4a49de34e7ce25083
    (NVIDIA-NeMo/RL): ``size``, ``slice`` and ``make_microbatch_iterator`` as upstream (its
    PackedTensor branch left out: the logged dicts hold lists and tensors)."""

    @property
    def size(self) -> int:
        if not self.data:
            return 0
        key = next(iter(self.data))
        if not torch.is_tensor(self.data[key]):
            return len(self.data[key])
        return self.data[key].shape[0]

    def slice(self, start: int, end: int) -> BatchedDataDict:
        sliced_batch = BatchedDataDict()
        for k in self.data:
            if isinstance(self.data[k], torch.Tensor):
                assert end <= self.data[k].shape[0]
            sliced_batch[k] = self.data[k][start:end]
        return sliced_batch

    def make_microbatch_iterator(self, microbatch_size: int):
        bsize = self.size
        assert bsize % microbatch_size == 0
        for i in range(0, bsize, microbatch_size):
            yield self.slice(i, i + microbatch_size)


def nemo_log_batched_dict_as_jsonl(base_log_dir: Path, to_log, filename: str) -> None:
    """``Logger.log_batched_dict_as_jsonl``, nemo_rl/utils/logger.py@7ea279abfbeb698b092856d0dab
    61e7cf39bc909 (NVIDIA-NeMo/RL; the file last changed in 3ee5fa362212c167e4878a7b7792a42b
    add97e1c): one line per sample, each value a one-sample slice, plus ``idx``;
    ``default=str``. Line for line as upstream (its two tensor/ndarray branches kept)."""
    if not isinstance(to_log, BatchedDataDict):
        to_log = BatchedDataDict(to_log)
    filepath = os.path.join(base_log_dir, filename)
    os.makedirs(os.path.dirname(filepath), exist_ok=True)
    with open(filepath, "w") as f:
        for i, sample in enumerate(to_log.make_microbatch_iterator(1)):
            for key, value in sample.items():
                if isinstance(value, torch.Tensor):  # noqa: SIM114 (as upstream)
                    sample[key] = value.tolist()
                elif isinstance(value, np.ndarray):
                    sample[key] = value.tolist()
            f.write(json.dumps({**sample, "idx": i}, default=str) + "\n")


def nemo_grpo_log(base_log_dir: Path, step: int) -> None:
    """What ``grpo_train`` (nemo_rl/algorithms/grpo.py@7ea279ab) logs after step ``step - 1``:
    ``train_data_step{total_steps + 1}.jsonl``; ``validate`` logs ``val_data_step{step}.jsonl``."""
    g = torch.Generator().manual_seed(step)
    rewards = torch.tensor(HARD_FLOATS[:2], dtype=torch.float32) + step
    log_data = {
        "content": [[{"role": "user", "content": "1+1? é"}, {"role": "assistant", "content": "2"}],
                    [{"role": "user", "content": "∑"}, {"role": "assistant", "content": "😀"}]],
        "rewards": rewards.tolist(),
        "input_lengths": torch.tensor([5, 7]).tolist(),
        "token_ids": torch.randint(0, 50, (2, 7), generator=g).tolist(),
        "token_loss_mask": torch.tensor([[0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 1]]).tolist(),
        "sample_loss_mask": torch.ones(2).tolist(),
        "advantages": (torch.randn(2, 7, generator=g) * 1e-3).tolist(),
        "generation_logprobs": (-torch.rand(2, 7, generator=g)).tolist(),
        "prev_logprobs": (-torch.rand(2, 7, generator=g)).tolist(),
    }  # fmt: skip
    nemo_log_batched_dict_as_jsonl(base_log_dir, log_data, f"train_data_step{step}.jsonl")
    val_log_data = {"content": log_data["content"][:1], "rewards": [float("nan")]}
    nemo_log_batched_dict_as_jsonl(base_log_dir, val_log_data, f"val_data_step{step}.jsonl")


def test_nemo_rl_train_and_val_data_jsonl_replay_every_sample(tmp_path, capsys):
    log_dir = tmp_path / "logs" / "exp_001"
    for step in (1, 2):
        nemo_grpo_log(log_dir, step)
    (log_dir / "config.yaml").write_text("grpo: {}\n")
    out = tmp_path / "golden"
    assert import_(tmp_path / "logs", out) == 0
    printed = capsys.readouterr().out
    assert f"skipped {log_dir / 'config.yaml'}: not a NeMo-RL" in printed
    for step in (1, 2):
        train = json_lines(log_dir / f"train_data_step{step}.jsonl")
        assert [r["idx"] for r in train] == [0, 1] and len(train[0]["token_ids"]) == 1
        bits_equal(train, replay(out, step))
        bits_equal(json_lines(log_dir / f"val_data_step{step}.jsonl"), replay(out, step, "val"))
    assert main(["verify", str(out)]) == 0


# --- a folder of several layouts; named by --layout; replayed by a test ----------------------


def mixed_folder(root: Path, verl_trainer) -> None:
    trainer, DataProto = verl_trainer
    run_verl_writer(trainer, DataProto, root / "verl_rollouts", (4,))
    roll_dump(str(root / "roll"), 4, roll_batch(4), Tokenizer())
    nemo_grpo_log(root / "nemo", 4)


def test_a_mixed_folder_imports_one_layout_and_says_where_the_others_go(
    tmp_path, verl_trainer, capsys
):
    root = tmp_path / "dumps"
    mixed_folder(root, verl_trainer)
    assert import_(root, tmp_path / "g_verl") == 0
    printed = capsys.readouterr().out
    roll_file = root / "roll" / "rollout_dump_data.step_4.jsonl"
    assert f"skipped {roll_file}: not a verl dump" in printed
    assert "--layout roll" in printed.split(f"skipped {roll_file}")[1].splitlines()[0]
    nemo_line = printed.split(f"skipped {root / 'nemo' / 'train_data_step4.jsonl'}")[1]
    assert "--layout nemo-rl" in nemo_line.splitlines()[0]
    assert "(3 files" not in printed and "(1 file, 3 dump files skipped)" in printed
    for layout, name in (("roll", "rollout"), ("nemo-rl", "val")):
        assert import_(root, tmp_path / f"g_{layout}", "--layout", layout) == 0
        assert replay(tmp_path / f"g_{layout}", 4, name)


@pytest.mark.parametrize("layout", ["verl", "roll", "nemo-rl"])
def test_an_imported_jsonl_golden_replays_in_a_test(project, tmp_path, verl_trainer, layout):
    root = tmp_path / "dumps"
    mixed_folder(root, verl_trainer)
    target = project.golden / "test_it" / "test_replay"
    assert import_(root, target, "--layout", layout) == 0
    project.write(
        "import json, pytest\n"
        "def test_replay(golden):\n"
        "    rows = golden.rollout(lambda: pytest.fail('generated'), step=4)\n"
        "    text = json.dumps(rows, sort_keys=True)\n"
        "    golden.check({'chars': float(len(text))}, step=4)\n"
    )
    project.run().assert_outcomes(passed=1)
    project.run("--golden-strict").assert_outcomes(passed=1)
