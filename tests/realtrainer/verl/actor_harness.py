"""verl 0.7's legacy ``DataParallelPPOActor`` on CPU, for the real-trainer lane.

Runs ONLY in a process whose ``sys.path`` puts the verl 0.7 target dir first
(``PYTHONPATH=.venv/verl07``; see ``tests/realtrainer/requirements-verl.txt``):
the main venv holds verl 0.9.1, which no longer ships ``verl/workers/actor/dp_actor.py``.

What it takes to run that actor on one CPU process (ANCHORS section 9):

* a ray stand-in: any ``ray.*`` import works, ``@ray.remote`` is the identity;
* a one-process gloo group (the actor's ``__init__`` calls ``get_rank()``);
* verl's pure-torch ``verl/utils/npu_flash_attn_utils.py`` in place of
  ``flash_attn.bert_padding`` (the unpad/pad helpers of ``use_remove_padding``);
  transformers' sdpa attention then finds the packed sequences from ``position_ids``;
* ``fsdp_config.dtype=float32`` (autocast to float32 on CPU is a no-op),
  ``use_torch_compile=False``, and ``torch.cpu.empty_cache`` as a no-op;
* one torch thread (``VERL_LANE_THREADS`` overrides).

Metrics are what verl's ``RayPPOTrainer`` logs for the actor: ``update_policy``'s
(its per-micro-batch / per-mini-batch lists reduced by ``reduce_metrics``: a mean) and
``actor/entropy`` from the old-log-prob pass over the whole batch. With
``update_entropy=True`` (``actor.calculate_entropy``) ``update_policy`` logs its own
``actor/entropy`` instead: a mean over micro-batches, which moves with dynamic batching.

The rollout batch is a plain dict of tensors (``make_batch``): GRPO groups of
identical ragged prompts with ragged random responses and random rewards, all drawn
from a seeded ``torch.Generator``, so a golden can record it and replay it.

Seeded bugs (``bug=``) patch verl's own ``update_policy`` source for one actor
instance (nothing global is changed):

* ``"grad_accum_scale"``: the micro-batch loss is no longer scaled by
  ``1/gradient_accumulation`` (grad clipping stays on, Adam hides the scale from the
  weights, so only ``actor/grad_norm`` shows it);
* ``"dynamic_bsz_weight"``: under ``use_dynamic_bsz`` each micro-batch weighs
  ``1/len(micro_batches)`` instead of its share ``bsz/ppo_mini_batch_size``;
* ``"micro_token_mean"``: the policy loss is aggregated by a per-micro-batch
  token-mean although the config asks for ``loss_agg_mode`` (seq-mean-token-mean);
* ``"loss_scale_1e-3"``: the backward loss is 1e-3 relative too large (the smallest
  error the default tolerances must still catch; only ``actor/grad_norm`` shows it).
"""

from __future__ import annotations

import atexit
import importlib.machinery
import inspect
import os
import re
import shutil
import sys
import tempfile
import textwrap
import types
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

PAD_ID = 0
VOCAB_SIZE = 96
BUGS = ("grad_accum_scale", "dynamic_bsz_weight", "micro_token_mean", "loss_scale_1e-3")

# ---------------------------------------------------------------------- CPU shims


class _AnyModule(types.ModuleType):
    """A ``ray.*`` module: every attribute is a harmless class, ``remote`` is identity."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "remote":
            return _remote
        stub = type(name, (), {"__init__": lambda self, *a, **k: None})
        setattr(self, name, stub)
        return stub


def _remote(*args: Any, **kwargs: Any) -> Any:
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda obj: obj


class _RayFinder:
    """Meta-path finder that serves every ``ray`` / ``ray.*`` import with ``_AnyModule``."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname == "ray" or fullname.startswith("ray."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _AnyModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


_SHIMS_DONE = False


def install_cpu_shims() -> None:
    """Ray stand-in, flash_attn.bert_padding from verl's pure-torch helpers, gloo group."""
    global _SHIMS_DONE
    if _SHIMS_DONE:
        return
    if "ray" in sys.modules and not isinstance(sys.modules["ray"], _AnyModule):
        raise RuntimeError("a real ray is already imported; the harness needs its stand-in")
    sys.meta_path.insert(0, _RayFinder())

    import verl

    version = getattr(verl, "__version__", "?")
    from verl.utils import npu_flash_attn_utils as pure_torch_padding

    if not version.startswith("0.7"):
        raise RuntimeError(f"actor_harness needs verl 0.7.x first on sys.path, got {version}")
    # verl's attention_utils imports flash_attn.bert_padding on first use (CUDA) or these
    # pure-torch twins (NPU); serve the twins. (A fake ``flash_attn`` module in sys.modules
    # would break transformers' find_spec("flash_attn") probe.)
    from verl.utils import attention_utils

    twins = (
        pure_torch_padding.index_first_axis,
        pure_torch_padding.pad_input,
        pure_torch_padding.rearrange,
        pure_torch_padding.unpad_input,
    )
    attention_utils._get_attention_functions = lambda: twins

    # one intra-op thread: the model is tiny, and with 2 OpenMP threads on a shared 2-core
    # CI box a step is 10-30x slower (spin-waits); one thread also fixes reduction order
    torch.set_num_threads(int(os.environ.get("VERL_LANE_THREADS", "1")))
    if not hasattr(torch.cpu, "empty_cache"):
        torch.cpu.empty_cache = lambda: None

    if not torch.distributed.is_initialized():
        folder = tempfile.mkdtemp(prefix="verl07_gloo_")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        store = os.path.join(folder, "store")
        torch.distributed.init_process_group(
            "gloo", init_method=f"file://{store}", rank=0, world_size=1
        )
    _SHIMS_DONE = True


# ---------------------------------------------------------------------- rollout batch


def make_batch(
    step: int,
    *,
    seed: int = 1234,
    batch_size: int = 16,
    group_size: int = 4,
    prompt_len: int = 6,
    response_len: int = 12,
    vocab_size: int = VOCAB_SIZE,
) -> dict[str, torch.Tensor]:
    """A GRPO rollout batch of random tokens: groups share a prompt; lengths are ragged.

    Prompts are left-padded, responses right-padded (verl's layout); the reward is a
    per-response scalar placed on its last token (``token_level_scores``); ``uid``
    numbers the group.
    """
    gen = torch.Generator().manual_seed(seed * 1000 + step)
    groups = batch_size // group_size
    prompts = torch.full((batch_size, prompt_len), PAD_ID, dtype=torch.long)
    prompt_mask = torch.zeros(batch_size, prompt_len, dtype=torch.long)
    for g in range(groups):
        n = int(torch.randint(2, prompt_len + 1, (1,), generator=gen))
        tokens = torch.randint(1, vocab_size, (n,), generator=gen)
        rows = slice(g * group_size, (g + 1) * group_size)
        prompts[rows, prompt_len - n :] = tokens
        prompt_mask[rows, prompt_len - n :] = 1
    lengths = torch.randint(1, response_len + 1, (batch_size,), generator=gen)
    lengths[0] = response_len  # at least one full-length response
    responses = torch.randint(1, vocab_size, (batch_size, response_len), generator=gen)
    response_mask = (torch.arange(response_len)[None, :] < lengths[:, None]).long()
    responses = responses * response_mask + PAD_ID * (1 - response_mask)
    rewards = torch.randint(0, 2, (batch_size,), generator=gen).float()
    rewards += 0.1 * torch.rand(batch_size, generator=gen)
    scores = torch.zeros(batch_size, response_len)
    scores[torch.arange(batch_size), lengths - 1] = rewards
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0)
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "token_level_scores": scores,
        "uid": torch.arange(batch_size) // group_size,
    }


# ---------------------------------------------------------------------- the actor


def qwen2_config(**extra: Any) -> Any:
    """The config of the tiny Qwen2 both lanes train (hidden 64, 2 layers, sdpa attention),
    with the ``extra`` fields of its head."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation="sdpa",
        **extra,
    )


def tiny_qwen2(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A Qwen2 with hidden 64 and 2 layers in ``dtype``, built from a config (no download)."""
    from transformers import Qwen2ForCausalLM

    config = qwen2_config(tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(dtype)
    return model


@dataclass
class StepOutput:
    metrics: dict[str, float]
    old_log_prob: torch.Tensor
    response_mask: torch.Tensor
    micro_batch_sizes: list[int] = field(default_factory=list)


def _undecorated(func: Any, name: str) -> Any:
    """The function under verl's ``GPUMemoryLogger`` wrapper (it keeps no ``__wrapped__``)."""
    for cell in func.__closure__ or ():
        inner = cell.cell_contents
        if inspect.isfunction(inner) and inner.__name__ == name:
            return _undecorated(inner, name)
    return func


def patched_method(obj: Any, name: str, edits: list[tuple[str, str]]) -> types.MethodType:
    """``obj.name`` recompiled from verl's source with ``edits`` (regex, replacement; each
    must match exactly once, so a verl release that moved the code fails loudly)."""
    func = _undecorated(getattr(type(obj), name), name)
    source = textwrap.dedent(inspect.getsource(func))
    for pattern, replacement in edits:
        source, count = re.subn(pattern, replacement, source)
        if count != 1:
            raise RuntimeError(f"seeded bug: {pattern!r} matched {count} times in {name}")
    namespace = dict(vars(sys.modules[type(obj).__module__]))
    exec(compile(source, f"<seeded bug in {name}>", "exec"), namespace)
    return types.MethodType(namespace[name], obj)


_BUG_EDITS = {
    # (a) the micro-batch loss is no longer divided by the number of micro-batches
    "grad_accum_scale": [
        (
            r"(else:\s+)loss = policy_loss \* loss_scale_factor",
            r"\1loss = policy_loss",
        )
    ],
    # (b) dynamic batching weighs each micro-batch equally, not by its sample share
    "dynamic_bsz_weight": [
        (
            r"loss_scale_factor = response_mask\.shape\[0\] / self\.config\.ppo_mini_batch_size",
            "loss_scale_factor = 1 / len(micro_batches)",
        )
    ],
    # the smallest error the lane must catch: the backward loss 1e-3 too large (Adam hides
    # it from the weights; actor/grad_norm is 1e-3 relative off)
    "loss_scale_1e-3": [
        (
            r"(else:\s+)loss = policy_loss \* loss_scale_factor",
            r"\1loss = policy_loss * loss_scale_factor * 1.001",
        )
    ],
    # (c) the policy loss is a per-micro-batch token-mean whatever loss_agg_mode says
    "micro_token_mean": [
        (
            r"(response_mask=response_mask,\s+)loss_agg_mode=loss_agg_mode,",
            r'\1loss_agg_mode="token-mean",',
        )
    ],
}


class BatchRun:
    """What the actor and critic runs share: the batching settings, the seeded-bug check,
    AdamW, and the rollout batch as verl's ``DataProto`` (``meta_info`` as verl's trainer
    sets it, with the ``extra_meta`` of the role)."""

    extra_meta: ClassVar[dict[str, float]] = {}

    def __init__(
        self, bug: str | None, bugs: tuple[str, ...], micro: int, dynamic: bool, max_len: int
    ):
        if bug is not None and bug not in bugs:
            raise ValueError(f"unknown seeded bug {bug!r}; one of {bugs}")
        self.use_dynamic_bsz = dynamic
        self.max_token_len = max_len
        self.micro_batch_size = micro

    @staticmethod
    def adamw(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=0.01)

    def _dataproto(self, batch: dict[str, torch.Tensor]) -> Any:
        from verl import DataProto

        tensors = {k: v for k, v in batch.items() if k != "uid"}
        uid = np.array([str(int(u)) for u in batch["uid"]], dtype=object)
        return DataProto.from_dict(
            tensors,
            non_tensors={"uid": uid},
            meta_info={
                "micro_batch_size": self.micro_batch_size,
                **self.extra_meta,
                "use_dynamic_bsz": self.use_dynamic_bsz,
                "max_token_len": self.max_token_len,
                "pad_token_id": PAD_ID,
            },
        )


class ActorRun(BatchRun):
    """One tiny Qwen2 + AdamW + verl 0.7 ``DataParallelPPOActor``, stepped on rollout batches."""

    extra_meta: ClassVar[dict[str, float]] = {"temperature": 1.0}

    def __init__(
        self,
        *,
        ppo_micro_batch_size_per_gpu: int = 8,
        use_dynamic_bsz: bool = False,
        max_token_len: int = 48,
        use_remove_padding: bool = False,
        loss_agg_mode: str = "seq-mean-token-mean",
        ppo_mini_batch_size: int = 8,
        grad_clip: float = 0.05,
        lr: float = 1e-2,
        clip_ratio: float = 0.2,
        update_entropy: bool = False,
        bug: str | None = None,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
    ):
        install_cpu_shims()
        from verl.workers.actor.dp_actor import DataParallelPPOActor
        from verl.workers.config import FSDPActorConfig, FSDPEngineConfig

        super().__init__(bug, BUGS, ppo_micro_batch_size_per_gpu, use_dynamic_bsz, max_token_len)
        config = FSDPActorConfig(
            strategy="fsdp",
            rollout_n=4,
            ppo_mini_batch_size=ppo_mini_batch_size,
            ppo_micro_batch_size_per_gpu=ppo_micro_batch_size_per_gpu,
            use_dynamic_bsz=use_dynamic_bsz,
            ppo_max_token_len_per_gpu=max_token_len,
            use_remove_padding=use_remove_padding,
            loss_agg_mode=loss_agg_mode,
            grad_clip=grad_clip,
            clip_ratio=clip_ratio,
            clip_ratio_low=clip_ratio,
            clip_ratio_high=clip_ratio,
            entropy_coeff=0.0,
            calculate_entropy=update_entropy,
            use_kl_loss=False,
            use_torch_compile=False,
            ppo_epochs=1,
            shuffle=False,
            fsdp_config=FSDPEngineConfig(dtype="float32"),
        )
        self.model = tiny_qwen2(seed, dtype)
        self.optimizer = self.adamw(self.model, lr)
        self.actor = DataParallelPPOActor(config, self.model, self.optimizer)
        if bug is not None:
            self.actor.update_policy = patched_method(self.actor, "update_policy", _BUG_EDITS[bug])

    def step(self, batch: dict[str, torch.Tensor]) -> StepOutput:
        """compute_log_prob (old policy), GRPO advantages, update_policy; reduced metrics."""
        from verl.trainer.ppo.core_algos import agg_loss, compute_grpo_outcome_advantage
        from verl.utils.metric import reduce_metrics
        from verl.utils.seqlen_balancing import prepare_dynamic_batch

        data = self._dataproto(batch)
        old = self.actor.compute_log_prob(data, calculate_entropy=True)
        old_log_prob = old["log_probs"]
        data.batch["old_log_probs"] = old_log_prob
        # as verl's RayPPOTrainer: actor/entropy from the old-log-prob pass, whole batch
        config = self.actor.config
        entropy = agg_loss(
            loss_mat=old["entropys"],
            loss_mask=data.batch["response_mask"],
            loss_agg_mode=config.loss_agg_mode,
            loss_scale_factor=config.loss_scale_factor,
        )
        advantages, returns = compute_grpo_outcome_advantage(
            token_level_rewards=data.batch["token_level_scores"],
            response_mask=data.batch["response_mask"],
            index=data.non_tensor_batch["uid"],
        )
        data.batch["advantages"] = advantages
        data.batch["returns"] = returns
        sizes: list[int] = []
        for mini in data.split(self.actor.config.ppo_mini_batch_size):
            if self.use_dynamic_bsz:
                micro, _ = prepare_dynamic_batch(mini, max_token_len=self.max_token_len)
                sizes.append([len(m) for m in micro])
            else:
                sizes.append([len(m) for m in mini.split(self.micro_batch_size)])
        raw = self.actor.update_policy(data)
        # the trainer's metrics.update order: update_policy's own actor/entropy (a mean of
        # per-micro-batch values, only with calculate_entropy or entropy_coeff) wins
        metrics = {"actor/entropy": float(entropy)}
        metrics.update({k: float(v) for k, v in reduce_metrics(raw).items()})
        return StepOutput(
            metrics=metrics,
            old_log_prob=old_log_prob.detach().clone(),
            response_mask=batch["response_mask"].bool(),
            micro_batch_sizes=sizes,
        )


# ---------------------------------------------------------------------- the cases

REFERENCE = "mb8"
TOKEN_MEAN_REFERENCE = "tm_mb8"


def same_math_cases(prefix: str = "") -> dict[str, dict[str, Any]]:
    """The same-math variants of the reference (seq-mean-token-mean, micro-batch 8, padded,
    static), each name after ``prefix``."""
    return {
        f"{prefix}mb8": {},
        f"{prefix}mb4": {"ppo_micro_batch_size_per_gpu": 4},
        f"{prefix}mb2": {"ppo_micro_batch_size_per_gpu": 2},
        f"{prefix}dynbsz": {"use_dynamic_bsz": True, "max_token_len": 48},
        f"{prefix}rmpad": {"use_remove_padding": True},
    }


def token_mean_cases(prefix: str = "") -> dict[str, dict[str, Any]]:
    """Micro-batch 8 and 4 under ``loss_agg_mode=token-mean``, each name after ``prefix``."""
    return {
        f"{prefix}tm_mb8": {"loss_agg_mode": "token-mean"},
        f"{prefix}tm_mb4": {"loss_agg_mode": "token-mean", "ppo_micro_batch_size_per_gpu": 4},
    }


SAME_MATH = same_math_cases()
# seeded bugs, each declared as a variant of the reference: each must fail
BUGGED: dict[str, dict[str, Any]] = {
    "bug_gradaccum": {"ppo_micro_batch_size_per_gpu": 4, "bug": "grad_accum_scale"},
    "bug_dynweight": {"use_dynamic_bsz": True, "max_token_len": 48, "bug": "dynamic_bsz_weight"},
    "bug_microtokmean": {"ppo_micro_batch_size_per_gpu": 4, "bug": "micro_token_mean"},
    "bug_loss1e-3": {"bug": "loss_scale_1e-3"},
}
# under token-mean the legacy actor divides per micro-batch: micro-batching is a real change
TOKEN_MEAN = token_mean_cases()
ALL_CASES = {**SAME_MATH, **BUGGED, **TOKEN_MEAN}
# measure.py only: update_policy's own actor/entropy (calculate_entropy=True)
UPDATE_ENTROPY_REFERENCE = "ue_mb8"
UPDATE_ENTROPY: dict[str, dict[str, Any]] = {
    "ue_mb8": {"update_entropy": True},
    "ue_mb4": {"update_entropy": True, "ppo_micro_batch_size_per_gpu": 4},
    "ue_dynbsz": {"update_entropy": True, "use_dynamic_bsz": True, "max_token_len": 48},
}
STEPS = 3
