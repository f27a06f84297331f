"""Long-run metric traces: tiny models trained for many steps on fixed rollout batches.

The data that long-run gates (per-step envelopes, trend gates, bias statistics) are tuned
and evaluated on; no gate logic here. For every setting (model family x dtype) and seed::

    python benchmarks/longrun/traces.py --out FILE --seeds 20 --steps 40 \\
        [--settings policy-float32,policy-bfloat16,qwen2-float32,qwen2-bfloat16] [--jobs 2]

``--seeds 1 --steps 3`` runs in a few seconds (a smoke test). CPU only, deterministic per
seed; each (setting, seed) is one task of a pool of ``--jobs`` spawned workers.

Families:

* ``policy``: the project's reference policy (:mod:`pytest_rollout_golden.parallel.policy`,
  one process, its forward and head), batches from its ``make_rollout`` (4 prompts x 4
  responses), params and compute in the setting's dtype, plain SGD; ``autocast``: float32
  params and SGD, the forward under bf16 autocast (matmuls in bf16, as the frameworks
  train with float32 master weights).
* ``qwen2``: a tiny ``Qwen2ForCausalLM`` from a config, random init from the seed, 4 prompts
  x 4 responses of 4 + 8 tokens, AdamW on float32 weights; ``bfloat16`` is autocast of the
  forward, log-softmax of the logits in float32.

One step: the trainer's log probs of the batch's tokens (gradient), PPO-clip GRPO loss
against the batch's rollout log probs (GRPO advantages from random rewards by
:func:`~pytest_rollout_golden.reference.advantages.grpo_advantages`) plus ``kl_coef`` times
the k3 KL to the initial weights (the batch's ``ref_log_prob``), token-mean, computed in
float32, one optimizer step. Logged per step: ``loss`` (the PPO-clip part), ``grad_norm``,
``entropy``, ``kl`` and every :func:`pytest_rollout_golden.mismatch.metrics` value as
``mismatch/<name>``, with the log probs of the step (before its update).

Rollout log probs ("the engine"): recorded once per seed during the golden run. At step
``t`` the golden run computes its log probs, and the engine's are those plus Gaussian noise
(fixed per seed and step, sd such that ``mismatch/abs_logprob_diff_mean`` is about 0.011),
stored as float32. The golden run's loss at ``t`` uses them, so it is computed after they
exist; every other run of the seed replays the recorded ones. The golden mismatch is thus
the noise alone, flat over the run; a run drifting from the golden adds its own gap.

Runs per (setting, seed): ``golden`` (one micro-batch, torch's default threads);
``calibration`` (reference, 2 and 4 micro-batches of gradient accumulation, each at 2, 1
and 4 threads); ``held_out`` (reference at 3 threads, 8 micro-batches, 4 micro-batches in
reversed order, the loss as a mean rescaled to the token-mean); ``bugs``: ``loss_x1.001``
(the loss times 1.001 in float32 before backward, logged so), ``logprob_gap_3x`` (the
trainer's head divided by a temperature ``1 + c*step``), ``kl_3x`` (the head plus a fixed
random error whose size grows linearly with the step, as a drifting quantization error).

Output (metric values are float64 Python floats, a non-finite one a string such as "nan")::

    {"format": "rollout-golden-longrun-traces", "version": 1, "steps": S, "how": {...},
     "settings": {SETTING: {"seeds": {"0": {
         "golden": {"metrics": {NAME: [S values], ...}},
         "calibration": [{"label", "variant", "threads", "metrics"}, ...],
         "held_out": [{"label", "kind": "unchanged" | "same-math", "metrics"}, ...],
         "bugs": [{"label", "metrics"}, ...]}, ...}}}}

Workers run with ``OMP_WAIT_POLICY=PASSIVE`` unless set: spinning OpenMP threads make a
multi-threaded tiny step cost seconds on a busy machine.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pytest_rollout_golden.mismatch import metrics as mismatch_metrics
from pytest_rollout_golden.parallel.comm import make_groups
from pytest_rollout_golden.parallel.layout import Layout
from pytest_rollout_golden.parallel.moe import RouterStats
from pytest_rollout_golden.parallel.policy import (
    PolicyConfig,
    full_weights,
    head_log_probs,
    make_micro_batch,
    make_rollout,
    stage_forward,
)
from pytest_rollout_golden.reference.advantages import grpo_advantages
from pytest_rollout_golden.reference.losses import aggregate_loss, kl_penalty, ppo_clip_token_losses

SETTINGS = (
    "policy-float32",
    "policy-bfloat16",
    "policy-autocast",
    "qwen2-float32",
    "qwen2-bfloat16",
)
ENGINE_SD = 0.011 / math.sqrt(2 / math.pi)  # E|N(0, sd)| = 0.011
KL_COEF = 0.05
CLIP = (0.2, 0.28)
PROMPTS, GROUP = 4, 4
QWEN2 = {"vocab": 128, "hidden": 64, "ffn": 128, "layers": 2, "prompt": 4, "response": 8}
QWEN2_HEAD_STD = 0.25  # logits of sd ~2: peaked next-token distributions
# The policy's SGD step moves the mean |log prob| of its batch by ~0.03 a step (0% of the tokens
# beyond the clip range), as an RL step does; 0.5 (``--policy-lr 0.5``) moves it by ~0.65, 80%
# of the tokens beyond the clip range, and same-math bf16 trajectories decorrelate. Qwen2's
# 3e-4 moves it by 0.65 at the first step, ~0.1 by the 40th.
LR = {"policy": 0.02, "qwen2": 3e-4}
# Bug strengths per family, tuned on seed 0 of float32 for ~3x growth at the default learning
# rates (see the printed summary; the policy's KL slope was 0.00037 at lr 0.5).
TEMPERATURE_SLOPE = {"policy": 0.0011, "qwen2": 0.0003}
HEAD_ERROR_SLOPE = {"policy": 0.00053, "qwen2": 0.0003}

HeadFn = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class Run:
    """One training run: how the step is computed, and its label in the output."""

    label: str
    micro: int = 1
    threads: int | None = None  # None: torch's default
    reverse: bool = False
    mean_rescaled: bool = False
    loss_scale: float | None = None
    head: str = ""  # "", "temperature" or "error"
    variant: str = "reference"
    kind: str = ""


def runs() -> dict[str, list[Run]]:
    """The runs of one (setting, seed), by output section."""
    calibration = [
        Run(f"{name}-threads{n}", micro=m, threads=n, variant=name)
        for n in (2, 1, 4)
        for name, m in (("reference", 1), ("mb2", 2), ("mb4", 4))
    ]
    held_out = [
        Run("unchanged-threads3", threads=3, kind="unchanged"),
        Run("mb8", micro=8, variant="mb8", kind="same-math"),
        Run("mb4-reversed", micro=4, reverse=True, variant="mb4-reversed", kind="same-math"),
        Run("mean-rescaled", mean_rescaled=True, variant="mean-rescaled", kind="same-math"),
    ]
    bugs = [
        Run("loss_x1.001", loss_scale=1.001),
        Run("logprob_gap_3x", head="temperature"),
        Run("kl_3x", head="error"),
    ]
    variant_bugs = [  # a declared (calibrated) variant that has the defect
        Run(f"mb4+{run.label}", micro=4, loss_scale=run.loss_scale, head=run.head, variant="mb4")
        for run in bugs
    ]
    return {
        "golden": [Run("golden")],
        "calibration": calibration,
        "held_out": held_out,
        "bugs": bugs,
        "variant_bugs": variant_bugs,
    }


# ------------------------------------------------------------------------- families


class Family:
    """A model family: its batches, a fresh model, a forward and an optimizer step."""

    name = ""

    def __init__(self, dtype: str, seed: int, steps: int) -> None:
        self.dtype, self.seed, self.steps = dtype, seed, steps

    def batches(self) -> list[dict[str, Tensor]]:
        raise NotImplementedError

    def new_model(self) -> Any:
        raise NotImplementedError

    def log_probs(
        self, model: Any, batch: dict[str, Tensor], rows: list[int], head: HeadFn
    ) -> tuple[Tensor, Tensor]:
        """Log probs (with gradient) and entropies of the valid tokens of ``rows``, in the
        order of ``batch["response_mask"][rows]``'s ``True`` entries."""
        raise NotImplementedError

    def parameters(self, model: Any) -> list[Tensor]:
        raise NotImplementedError

    def optimizer(self, model: Any) -> Callable[[], None]:
        """A function doing one update from the parameters' ``.grad`` and clearing them."""
        raise NotImplementedError

    def head_weight(self, model: Any) -> Tensor:
        raise NotImplementedError


class PolicyFamily(Family):
    """The project's reference policy, one process, SGD in the setting's dtype; ``autocast``:
    float32 weights and SGD, the forward under bf16 autocast (as the frameworks train)."""

    name = "policy"

    def __init__(self, dtype: str, seed: int, steps: int) -> None:
        super().__init__(dtype, seed, steps)
        weights = "float32" if dtype == "autocast" else dtype
        self.cfg = PolicyConfig(dtype=weights, seed=seed, lr=LR["policy"], kl_coef=KL_COEF)
        self.groups = make_groups(Layout(), 0)
        self.initial = full_weights(self.cfg)

    def batches(self) -> list[dict[str, Tensor]]:
        return [make_rollout(self.cfg, t, prompts=PROMPTS, group=GROUP) for t in range(self.steps)]

    def new_model(self) -> dict[str, Tensor]:
        return {k: v.clone().requires_grad_(True) for k, v in self.initial.items()}

    def log_probs(self, model, batch, rows, head):
        mb = make_micro_batch(batch, rows, self.cfg, packed=False, leak=False)
        w = {**model, "head": head(model["head"])}
        stats = RouterStats(0, self.cfg.top_k)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.dtype == "autocast"):
            h = stage_forward(mb.input_ids, w, self.cfg, mb, self.groups, stats)
            log_probs, entropy, _ = head_log_probs(h, w, mb, self.groups)
        return log_probs.float(), entropy.float()

    def parameters(self, model):
        return list(model.values())

    def optimizer(self, model):
        def sgd() -> None:
            with torch.no_grad():
                for p in model.values():
                    p -= self.cfg.lr * p.grad
                    p.grad = None

        return sgd

    def head_weight(self, model):
        return model["head"]


class Qwen2Family(Family):
    """A tiny Hugging Face Qwen2, AdamW on float32 weights, bf16 as autocast."""

    name = "qwen2"

    def __init__(self, dtype: str, seed: int, steps: int) -> None:
        super().__init__(dtype, seed, steps)
        from transformers import Qwen2Config, Qwen2ForCausalLM

        self.config = Qwen2Config(
            vocab_size=QWEN2["vocab"],
            hidden_size=QWEN2["hidden"],
            intermediate_size=QWEN2["ffn"],
            num_hidden_layers=QWEN2["layers"],
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            tie_word_embeddings=False,
            attn_implementation="eager",
        )
        self.model_class = Qwen2ForCausalLM
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(self.config)
        with torch.no_grad():  # HF's 0.02 gives near-uniform next-token distributions
            model.lm_head.weight.normal_(0.0, QWEN2_HEAD_STD)
        self.initial = model.state_dict()

    def batches(self) -> list[dict[str, Tensor]]:
        model = self.new_model()
        return [self._batch(model, t) for t in range(self.steps)]

    def _batch(self, model: Any, step: int) -> dict[str, Tensor]:
        """Random prompts shared by each group, random responses of random lengths, a random
        reward on the last token; ``ref_log_prob`` from the initial weights."""
        g = torch.Generator().manual_seed(10_000 + 1_000 * self.seed + step)
        size, p, r = PROMPTS * GROUP, QWEN2["prompt"], QWEN2["response"]
        ids = torch.randint(1, QWEN2["vocab"], (size, p + r), generator=g)
        ids[:, :p] = ids[::GROUP, :p].repeat_interleave(GROUP, 0)
        lengths = torch.randint(1, r + 1, (size,), generator=g)
        mask = torch.arange(r).unsqueeze(0) < lengths.unsqueeze(1)
        ids[:, p:][~mask] = 0
        uid = torch.arange(PROMPTS).repeat_interleave(GROUP)
        rewards = torch.zeros(size, r, dtype=torch.float64)
        rewards[torch.arange(size), lengths - 1] = torch.rand(
            size, generator=g, dtype=torch.float64
        )
        batch = {"input_ids": ids, "response_mask": mask, "uid": uid}
        batch["advantages"] = grpo_advantages(rewards, mask, uid).float()
        with torch.no_grad():
            ref, _ = self.log_probs(model, batch, list(range(size)), lambda w: w)
        batch["ref_log_prob"] = torch.zeros(size, r)
        batch["ref_log_prob"][mask] = ref.float()
        return batch

    def new_model(self) -> Any:
        model = self.model_class(self.config)
        model.load_state_dict(self.initial)
        return model

    def log_probs(self, model, batch, rows, head):
        index = torch.tensor(rows, dtype=torch.long)
        ids, mask = batch["input_ids"][index], batch["response_mask"][index]
        p = QWEN2["prompt"]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.dtype == "bfloat16"):
            h = model.model(input_ids=ids).last_hidden_state[:, p - 1 : -1]
            logits = h @ head(model.lm_head.weight).T
        log_softmax = torch.log_softmax(logits.float(), -1)
        targets = ids[:, p:]
        picked = log_softmax.gather(-1, targets.unsqueeze(-1)).squeeze(-1)[mask]
        with torch.no_grad():
            entropy = -(log_softmax.exp() * log_softmax).sum(-1)[mask]
        return picked, entropy

    def parameters(self, model):
        return list(model.parameters())

    def optimizer(self, model):
        adamw = torch.optim.AdamW(model.parameters(), lr=LR["qwen2"])

        def step() -> None:
            adamw.step()
            adamw.zero_grad(set_to_none=True)

        return step

    def head_weight(self, model):
        return model.lm_head.weight


FAMILIES = {"policy": PolicyFamily, "qwen2": Qwen2Family}


# ------------------------------------------------------------------------- training


def micro_batches(size: int, count: int, reverse: bool) -> list[list[int]]:
    """``count`` contiguous row ranges of ``size`` rows (the same as the reference's split)."""
    bounds = [size * i // count for i in range(count + 1)]
    pieces = [list(range(bounds[i], bounds[i + 1])) for i in range(count)]
    return pieces[::-1] if reverse else pieces


def head_defect(run: Run, family: Family, model: Any, step: int) -> HeadFn:
    """The trainer-side head the run uses at ``step`` (identity unless a head bug)."""
    if run.head == "temperature":
        temperature = 1.0 + TEMPERATURE_SLOPE[family.name] * step
        return lambda w: w / temperature
    if run.head == "error":
        weight = family.head_weight(model)
        g = torch.Generator().manual_seed(30_000 + family.seed)
        error = torch.randn(weight.shape, generator=g) * float(weight.detach().float().std())
        size = HEAD_ERROR_SLOPE[family.name] * step
        return lambda w: w + (size * error).to(w.dtype)
    return lambda w: w


def train_step(
    run: Run,
    family: Family,
    model: Any,
    batch: dict[str, Tensor],
    rollout: Tensor | None,
    noise: Tensor,
    step: int,
) -> tuple[dict[str, float], Tensor]:
    """One step of ``run``; returns its metrics and the rollout log probs it used (recorded
    from its own log probs plus ``noise`` when ``rollout`` is None)."""
    mask = batch["response_mask"]
    tokens = int(mask.sum())
    head = head_defect(run, family, model, step)
    all_log_probs = torch.zeros(mask.shape, dtype=torch.float64)
    recorded = torch.zeros(mask.shape, dtype=torch.float32)
    sums = torch.zeros(3, dtype=torch.float64)  # pg, kl, entropy over the step's tokens
    for rows in micro_batches(mask.shape[0], run.micro, run.reverse):
        index, valid = torch.tensor(rows, dtype=torch.long), mask[rows]
        log_probs, entropy = family.log_probs(model, batch, rows, head)
        log_probs = log_probs.float()
        if rollout is None:
            engine = (log_probs.detach().double() + noise[index][valid]).float()
        else:
            engine = rollout[index][valid]
        recorded[index] = torch.zeros(valid.shape).masked_scatter(valid, engine)
        ref = batch["ref_log_prob"][index][valid].float()
        adv = batch["advantages"][index][valid].float()
        pg, _, _ = ppo_clip_token_losses(
            log_probs, engine, adv, clip_ratio_low=CLIP[0], clip_ratio_high=CLIP[1]
        )
        kl = kl_penalty(log_probs, ref, "low_var_kl")
        per_token = (pg + KL_COEF * kl).unsqueeze(0)
        if run.mean_rescaled:
            loss = per_token.mean() * (per_token.numel() / tokens)
        else:
            loss = aggregate_loss(per_token, torch.ones_like(per_token), global_tokens=tokens)
        scale = 1.0
        if run.loss_scale is not None:
            loss = loss.float() * run.loss_scale
            scale = float(torch.tensor(run.loss_scale, dtype=torch.float32))
        loss.backward()
        with torch.no_grad():
            sums += torch.stack([pg.sum() * scale, kl.sum(), entropy.float().sum()]).double()
            all_log_probs[index] = torch.zeros(valid.shape, dtype=torch.float64).masked_scatter(
                valid, log_probs.double()
            )
    params = family.parameters(model)
    norm = math.sqrt(sum(float(p.grad.double().square().sum()) for p in params))
    sums /= tokens
    out = {
        "loss": float(sums[0]),
        "grad_norm": norm,
        "entropy": float(sums[2]),
        "kl": float(sums[1]),
    }
    engine_all = recorded.double() if rollout is None else rollout.double()
    for name, value in mismatch_metrics(all_log_probs, engine_all, mask).items():
        out[f"mismatch/{name}"] = value
    return out, recorded


def train_run(
    run: Run,
    family: Family,
    batches: list[dict[str, Tensor]],
    rollouts: list[Tensor] | None,
    noises: list[Tensor],
) -> tuple[dict[str, list[float]], list[Tensor]]:
    """Every step of ``run`` from the initial weights; per-metric lists and the rollout log
    probs (recorded when ``rollouts`` is None)."""
    default = torch.get_num_threads()
    torch.set_num_threads(run.threads or default)
    try:
        model = family.new_model()
        update = family.optimizer(model)
        traces: dict[str, list[float]] = {}
        recorded = []
        for t, batch in enumerate(batches):
            rollout = None if rollouts is None else rollouts[t]
            values, used = train_step(run, family, model, batch, rollout, noises[t], t)
            recorded.append(used)
            update()
            for name, value in values.items():
                traces.setdefault(name, []).append(value)
        return traces, recorded
    finally:
        torch.set_num_threads(default)


SECTIONS = ("calibration", "held_out", "bugs", "variant_bugs")


def seed_task(
    setting: str, seed: int, steps: int, sections: tuple[str, ...] = SECTIONS
) -> dict[str, Any]:
    """The runs of one (setting, seed) in ``sections`` (the golden always); what the output
    holds under that seed."""
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    name, dtype = setting.split("-")
    family = FAMILIES[name](dtype, seed, steps)
    batches = family.batches()
    noises = [
        torch.randn(b["response_mask"].shape, generator=torch.Generator().manual_seed(s))
        .double()
        .mul(ENGINE_SD)
        for s, b in ((20_000 + 1_000 * seed + t, b) for t, b in enumerate(batches))
    ]
    started = time.perf_counter()
    plan = runs()
    golden, rollouts = train_run(plan["golden"][0], family, batches, None, noises)
    out: dict[str, Any] = {"golden": {"metrics": golden}}
    for section in sections:
        out[section] = []
        for run in plan[section]:
            traces, _ = train_run(run, family, batches, rollouts, noises)
            entry: dict[str, Any] = {"label": run.label}
            if section == "calibration":
                entry.update(variant=run.variant, threads=run.threads)
            elif section == "held_out":
                entry["kind"] = run.kind
            entry["metrics"] = traces
            out[section].append(entry)
    return {"setting": setting, "seed": seed, "seconds": time.perf_counter() - started, "out": out}


def _task(args: tuple[str, int, int, tuple[str, ...]]) -> dict[str, Any]:
    return seed_task(*args)


def _worker_policy(lr: float, kl_slope: float) -> None:
    """The policy family's learning rate and (c)'s slope, in this process."""
    LR["policy"], HEAD_ERROR_SLOPE["policy"] = lr, kl_slope


# ------------------------------------------------------------------------- summary


def _at(values: list[float], step: int) -> float:
    return values[min(step, len(values) - 1)]


def summary(setting: str, seed_out: dict[str, Any]) -> list[str]:
    """Spread of the same-math runs against the golden, thread effects, bug growths."""
    if not {"calibration", "held_out", "bugs"} <= set(seed_out):
        return []
    golden = seed_out["golden"]["metrics"]
    steps = len(golden["loss"])
    lines = [f"{setting}, seed 0:"]
    for metric in ("loss", "grad_norm", "mismatch/abs_logprob_diff_mean"):
        spread = []
        for t in (0, 10, steps - 1):
            others = [r["metrics"][metric][min(t, steps - 1)] for r in _same_math(seed_out)]
            ref = _at(golden[metric], t)
            diff = max(abs(v - ref) for v in others)
            spread.append(
                f"step {min(t, steps - 1)}: {diff:.2e} ({diff / max(abs(ref), 1e-300):.1e})"
            )
        lines.append(
            f"  max |diff| (rel.) to golden, same-math runs, {metric}: " + ", ".join(spread)
        )
    by_label = {r["label"]: r["metrics"] for r in seed_out["calibration"]}
    for variant in ("reference", "mb2", "mb4"):
        runs_of = [by_label[f"{variant}-threads{n}"] for n in (2, 1, 4)]
        same = all(r == runs_of[0] for r in runs_of)
        lines.append(f"  {variant}: threads 2/1/4 {'bit-identical' if same else 'DIFFER'}")
    unchanged = seed_out["held_out"][0]["metrics"]
    lines.append(f"  unchanged-threads3 == golden: {unchanged == golden}")
    bugs = {r["label"]: r["metrics"] for r in seed_out["bugs"]}
    ratio = bugs["loss_x1.001"]["loss"][0] / golden["loss"][0]
    lines.append(f"  loss_x1.001: loss[0] / golden loss[0] = {ratio:.9f}")
    for label, metric, step in (
        ("logprob_gap_3x", "mismatch/abs_logprob_diff_mean", 30),
        ("kl_3x", "mismatch/k3_kl", 32),
    ):
        trace = bugs[label][metric]
        growth = _at(trace, step) / trace[0]
        golden_growth = _at(golden[metric], step) / golden[metric][0]
        lines.append(
            f"  {label}: {metric} step {min(step, steps - 1)} / step 0 = {growth:.2f} "
            f"(golden {golden_growth:.2f}; {trace[0]:.4g} -> {_at(trace, step):.4g})"
        )
    return lines


def _same_math(seed_out: dict[str, Any]) -> list[dict[str, Any]]:
    return seed_out["calibration"] + seed_out["held_out"]


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float as a string ("nan", "inf", "-inf")."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def write(path: str, args: argparse.Namespace, results: dict[str, Any], seconds: float) -> None:
    """The output document of ``results`` (setting -> seed -> runs) to ``path``."""
    how = {
        "torch": torch.__version__,
        "default_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "batch": f"{PROMPTS} prompts x {GROUP} responses",
        "policy": {"config": "PolicyConfig defaults", "lr": LR["policy"], "optimizer": "SGD"},
        "qwen2": {**QWEN2, "lr": LR["qwen2"], "optimizer": "AdamW, float32 weights"},
        "engine_noise_sd": ENGINE_SD,
        "kl_coef": KL_COEF,
        "clip": list(CLIP),
        "temperature_slope": TEMPERATURE_SLOPE,
        "head_error_slope": HEAD_ERROR_SLOPE,
        "jobs": args.jobs,
        "wall_seconds": round(seconds, 1),
        "command": " ".join(sys.argv),
    }
    doc = {
        "format": "rollout-golden-longrun-traces",
        "version": 1,
        "steps": args.steps,
        "how": how,
        "settings": {
            s: {"seeds": {k: runs[k] for k in sorted(runs, key=int)}} for s, runs in results.items()
        },
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(_finite(doc), f)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--policy-lr", type=float, default=LR["policy"])
    parser.add_argument(
        "--policy-kl-slope",
        type=float,
        default=HEAD_ERROR_SLOPE["policy"],
        help="kl_3x's head-error slope for the policy (0.00037 gives ~3x at --policy-lr 0.5)",
    )
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help="the runs to make besides the golden (gates.py merges files of other sections)",
    )
    args = parser.parse_args(argv)
    sections = tuple(args.sections.split(","))
    _worker_policy(args.policy_lr, args.policy_kl_slope)
    if set(sections) - set(SECTIONS):
        parser.error(f"unknown sections {sorted(set(sections) - set(SECTIONS))}")
    settings = args.settings.split(",")
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        parser.error(f"unknown settings {unknown}; choose from {','.join(SETTINGS)}")
    tasks = [(s, seed, args.steps, sections) for seed in range(args.seeds) for s in settings]
    # Idle OpenMP threads spin by default: on a busy machine, several threads per tiny op
    # then cost seconds a step instead of milliseconds.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {s: {} for s in settings}
    context = multiprocessing.get_context("spawn")
    with context.Pool(args.jobs, _worker_policy, (args.policy_lr, args.policy_kl_slope)) as pool:
        for i, done in enumerate(pool.imap_unordered(_task, tasks), 1):
            results[done["setting"]][str(done["seed"])] = done["out"]
            elapsed = time.perf_counter() - started
            print(
                f"[{i}/{len(tasks)}] {done['setting']} seed {done['seed']}: "
                f"{done['seconds']:.1f} s ({elapsed:.0f} s elapsed)",
                flush=True,
            )
            if done["seed"] == 0:
                print("\n".join(summary(done["setting"], done["out"])), flush=True)
            if i % len(settings) == 0 and i < len(tasks):  # in case the run is cut short
                write(args.out + ".partial", args, results, elapsed)
    for setting in settings:
        print("\n".join(summary(setting, results[setting]["0"])))
    write(args.out, args, results, time.perf_counter() - started)
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
