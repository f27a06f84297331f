"""A tiny, offline, CPU-only run of TRL's ``GRPOTrainer`` or ``RLOOTrainer`` with golden hooks.

Everything is built locally (no model hub): a Qwen2 from a config (hidden 64, 2 layers,
float32, seeded) saved to a folder and loaded from there (``beta > 0`` rebuilds the reference
model from ``model.config._name_or_path``), a ByteLevel BPE tokenizer trained on a few strings,
``datasets.Dataset.from_list`` prompts and a deterministic reward.

The recording boundary is what the engine and the environment return, nothing the trainer
computes from them:

* ``generation``: wraps ``_generate_single_turn`` (both trainers), the call that hands the
  tokenized prompts to ``model.generate`` (or vLLM) and gets the sampled token ids back. The
  batch holds ``prompt_ids``/``prompt_lengths`` (what the engine was given, ragged rows padded
  with -1), ``completion_ids``/``completion_lengths`` (what it returned, cut after the first EOS
  by TRL) and, where the engine returns them (GRPO with vLLM), ``logprobs``. On replay the
  prompts the trainer tokenized must equal the recorded ones (else the rollout belongs to
  other prompts: :class:`RuntimeError`).
* ``rewards``: wraps ``_calculate_rewards``, the reward functions' ``rewards_per_func``
  (``[completions, reward functions]``).

Everything between and after (decoding, padding and masks, old and reference log-probs, the
KL penalty, group baselines, advantages and their normalization, the loss) is the trainer's
code and runs on replay too, so a bug there changes the replayed run. Generation-side metrics
(``completions/*``, ``reward*``) are therefore logged on replay as well.

Hook points:

* ``rollout(step, generate, name) -> batch``: called with ``name`` ``"generation"`` and then
  ``"rewards"`` once per generated batch: with the default ``steps_per_generation ==
  gradient_accumulation_steps`` once per optimizer step; ``step`` is the optimizer step it
  happens at; a further engine call at the same step (GRPO's tool loop) is
  ``"generation-1"``, and so on. ``generate()`` returns the batch (a flat dict of CPU
  tensors). Pass
  ``lambda step, generate, name: golden.rollout(generate, step=step, name=name)``.
* ``on_step(step, metrics)``: the metrics TRL logs after optimizer step ``step`` (0-based),
  taken from ``TrainerCallback.on_log`` with ``logging_steps=1``.

Knobs (:class:`Knobs`): ``algo`` (``grpo``/``rloo``), ``batch`` (per_device_train_batch_size),
``ga`` (gradient_accumulation_steps), ``loss_type`` (GRPO), ``normalize_advantages`` (RLOO),
``beta``, ``max_grad_norm``, ``num_iterations``, ``dtype``/``bf16`` and ``bug``, a seeded bug
monkeypatched into the trainer instance (see :data:`BUGS`).

What RLOO logs as ``loss``: ``-mean over sequences of min(r*A, clip(r)*A)`` with ``r = exp(logp -
old_logp)`` of whole sequences; with ``num_iterations=1`` ``r`` is 1 up to rounding, and the
leave-one-out advantages sum to zero in every group (and are centred again by
``normalize_advantages``), so the logged loss is ``-mean(A)``: zero up to rounding (~1e-8).

Numerics worth knowing:

* ``bf16=False`` by default here. TRL's configs default to ``bf16=True``, which on CPU is bf16
  autocast, and TRL's fused log-prob head (``trl/kernels/chunked_logprob.py``) then computes
  its logit tiles in bf16: gradients carry ~2e-3 relative error (even a float64 model) and
  same-math micro-batching moves grad_norm by up to ~1e-3 (``MEASURED.md``).
* ``dtype="float64", bf16=False`` (what the golden's float64 oracle runs) keeps the weights,
  gradients, advantages, loss and grad_norm in float64, but TRL's fused log-prob head still
  computes in float32: its ``running_max``/``sum_exp``/``target_logit`` accumulators, the
  ``tile.float()`` of the CPU path and the backward's ``grad_hidden``/``grad_weight`` are
  float32 whatever the model's dtype, so per-token log-probs and entropies are float32 and
  same-math micro-batching moves loss by ~3e-9 and grad_norm by ~2e-8 relative in the oracle
  (not ~1e-15): 0.003-0.016x its 1e-6 bound (``MEASURED.md``).
* Plain SGD (lr 0.2, clipped at max_grad_norm 1) by default; ``optim="adamw_torch"`` (lr
  1e-3) gives the same same-math agreement (loss <= 3e-7 relative, grad_norm bit-equal over
  3 steps with bf16 off).
* EOS gets a sampling-only bias (:data:`EOS_BIAS`): a random model would otherwise never stop
  early and micro-batching could not matter (ragged completions are what separate dapo from
  bnpo).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

HIDDEN = 64
LAYERS = 2
NUM_GENERATIONS = 4
MAX_COMPLETION = 8
STEPS = 3
EOS_BIAS = 3.0  # added to the EOS logit when sampling (not in training)

# Metrics TRL computes on the training side; compared across replays.
TRAINING_METRICS = (
    "loss",
    "grad_norm",
    "kl",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
)

BUGS = {
    # loss not divided by gradient_accumulation_steps (gradients GA times too large; with
    # max_grad_norm the clipped update hides it, so grad_norm and loss are what show it).
    # GRPO divides inside _compute_loss, RLOO leaves it to the HF Trainer: x GA undoes either.
    "drop_ga_scale": "loss not divided by gradient_accumulation_steps",
    # dapo promises one token-mean over the whole optimizer step (num_items_in_batch); this
    # normalizes each micro-batch by its own token count instead (then divides by GA)
    "microbatch_token_mean": "dapo normalized per micro-batch instead of by num_items_in_batch",
    # padding after EOS counted as completion tokens in the loss
    "loss_on_padding": "completion_mask ignored: padding after EOS enters the loss",
    # KL penalty sign flipped (GRPO: per_token_loss - beta*kl; RLOO: reward + beta*kl): needs
    # beta > 0
    "kl_sign": "KL penalty subtracted instead of added",
    # KL computed and logged, but its penalty never applied (GRPO: to the loss, RLOO: to the
    # reward): needs beta > 0
    "beta_ignored": "beta ignored: KL computed and logged, its penalty multiplied by 0",
    # GRPO: scale_rewards "group" acts as "none"; RLOO: normalize_advantages=True ignored (its
    # centring is a no-op: leave-one-out advantages already sum to 0 per group)
    "advantage_no_std": "advantages not divided by their std",
    # the PPO ratio left unclipped (needs num_iterations > 1: else the ratio is always 1)
    "no_clip": "PPO clipping dropped: the ratio is never clipped",
    # not a bug: the smallest error the lane must still catch (loss off by 1e-3 relative)
    "loss_x1.001": "loss scaled by 1.001 (a 1e-3 relative error)",
}

TEXTS = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "one two three four five six",
    "red green blue yellow",
    "hello world, how are you?",
    "numbers: 1 2 3 4 5 6 7 8 9 0",
    "aeiou aeiou aeiou",
]
PROMPTS = [
    "count to five",
    "name a color",
    "say hello",
    "where is the cat",
    "what did the dog do",
    "list vowels",
    "say a number",
    "end now",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@dataclasses.dataclass(frozen=True)
class Knobs:
    algo: str = "grpo"  # "grpo": GRPOTrainer, "rloo": RLOOTrainer
    batch: int = 8  # per_device_train_batch_size
    ga: int = 1  # gradient_accumulation_steps
    loss_type: str = "dapo"  # GRPO only
    normalize_advantages: bool = False  # RLOO only (TRL's default False)
    beta: float = 0.04
    max_grad_norm: float = 1.0
    bug: str | None = None
    seed: int = 0
    steps: int = STEPS
    learning_rate: float = 0.2
    optim: str = "sgd"
    dtype: str = "float32"  # float64: what is left is the math, not rounding
    bf16: bool = False  # TRL's default is True (CPU autocast to bf16)
    # > 1: each generated batch trains num_iterations optimizer steps; the batch then carries
    # old_per_token_logps and the PPO ratio moves off 1, so clip_ratio/* are not all 0
    num_iterations: int = 1

    @property
    def id(self) -> str:
        if self.algo == "rloo":
            text = "rloo" + ("-norm" if self.normalize_advantages else "")
        else:
            text = self.loss_type
        text += f"-b{self.batch}ga{self.ga}"
        text += "-f64" if self.dtype == "float64" else ""
        text += "-bf16" if self.bf16 else ""
        text += f"-mu{self.num_iterations}" if self.num_iterations != 1 else ""
        return text + (f"-{self.bug}" if self.bug else "")


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<eos>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(TEXTS + PROMPTS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_model_dir(path: str | os.PathLike, seed: int = 0) -> Path:
    """Save the tokenizer and a seeded tiny Qwen2 (float32) to ``path`` (idempotent); the
    same weights whatever torch's default dtype (the float64 oracle sets it to float64)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    if (path / "config.json").is_file():
        return path
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        dtype="float32",
    )
    default = torch.get_default_dtype()  # float64 under --golden-certify: init in float32
    torch.set_default_dtype(torch.float32)
    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = Qwen2ForCausalLM(config).to(torch.float32)
    finally:
        torch.set_default_dtype(default)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def reward_vowels(completions, **kwargs) -> list[float]:
    """Deterministic: share of vowels among the letters of the completion text."""
    rewards = []
    for completion in completions:
        text = completion[0]["content"] if isinstance(completion, list) else completion
        letters = [c for c in text if c.isalpha()]
        vowels = sum(c in "aeiou" for c in letters)
        rewards.append(vowels / len(letters) if letters else 0.2)  # early EOS: not punished
    return rewards


def dataset():
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS])


def _ragged(rows: list[list], dtype: torch.dtype, fill) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged rows as (a right-padded [rows, longest] tensor, the row lengths)."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    out = torch.full((len(rows), max((len(r) for r in rows), default=0)), fill, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out, lengths


def _rows(values: torch.Tensor, lengths: torch.Tensor) -> list[list]:
    return [values[i, :n].tolist() for i, n in enumerate(lengths.tolist())]


def engine_batch(prompt_ids, completion_ids, logprobs=None) -> dict[str, torch.Tensor]:
    """What the engine was given and returned (ragged token-id lists) as flat CPU tensors."""
    out = {}
    out["prompt_ids"], out["prompt_lengths"] = _ragged(prompt_ids, torch.long, -1)
    out["completion_ids"], out["completion_lengths"] = _ragged(completion_ids, torch.long, -1)
    if logprobs is not None:
        out["logprobs"], _ = _ragged(logprobs, torch.float32, 0.0)
    return out


class _IgnoredBeta(float):
    """0.0 that claims to be non-zero: TRL's ``if self.beta != 0.0`` branches still compute and
    log the KL, and ``self.beta * kl`` adds nothing."""

    def __new__(cls):
        return super().__new__(cls, 0.0)

    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    __hash__ = float.__hash__


def _install_bug(trainer, knobs: Knobs) -> None:
    bug = knobs.bug
    if bug is None:
        return
    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}; known: {sorted(BUGS)}")
    rloo = knobs.algo == "rloo"

    # bugs in what _generate_and_score_completions computes: an attribute TRL reads there
    if bug in ("kl_sign", "beta_ignored"):
        if knobs.beta == 0.0:
            raise ValueError(f"bug {bug!r} needs beta > 0")
        trainer.beta = -knobs.beta if bug == "kl_sign" else _IgnoredBeta()
        return
    if bug == "advantage_no_std":
        if rloo and not knobs.normalize_advantages:
            raise ValueError("bug 'advantage_no_std' needs normalize_advantages=True under RLOO")
        if rloo:
            trainer.normalize_advantages = False
        elif trainer.scale_rewards == "none":
            raise ValueError("bug 'advantage_no_std' needs scale_rewards != 'none'")
        else:
            trainer.scale_rewards = "none"
        return

    # bugs in the loss
    original = trainer._compute_loss
    if bug == "drop_ga_scale":

        def compute(model, inputs):
            return original(model, inputs) * trainer.current_gradient_accumulation_steps

    elif bug == "microbatch_token_mean":
        if rloo or knobs.loss_type != "dapo":
            raise ValueError("bug 'microbatch_token_mean' is a GRPO loss_type='dapo' bug")

        def compute(model, inputs):
            local = inputs["completion_mask"].sum()
            spg = trainer.args.steps_per_generation
            # TRL divides by num_items_in_batch * GA / steps_per_generation: make that
            # local_tokens * GA, i.e. a per-micro-batch token-mean scaled by 1/GA
            return original(model, {**inputs, "num_items_in_batch": local * spg})

    elif bug == "loss_on_padding":

        def compute(model, inputs):
            return original(
                model, {**inputs, "completion_mask": torch.ones_like(inputs["completion_mask"])}
            )

    elif bug == "no_clip":
        if trainer.num_iterations == 1:
            raise ValueError("bug 'no_clip' needs num_iterations > 1")

        def compute(model, inputs):
            low, high = trainer.epsilon_low, trainer.epsilon_high
            trainer.epsilon_low = trainer.epsilon_high = 1e9  # clamp(ratio, -1e9, 1e9) = ratio
            try:
                return original(model, inputs)
            finally:
                trainer.epsilon_low, trainer.epsilon_high = low, high

    else:  # loss_x1.001

        def compute(model, inputs):
            return original(model, inputs) * 1.001

    trainer._compute_loss = compute


def _config(knobs: Knobs, output_dir):
    import trl

    kwargs = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        num_generations=NUM_GENERATIONS,
        per_device_train_batch_size=knobs.batch,
        gradient_accumulation_steps=knobs.ga,
        max_completion_length=MAX_COMPLETION,
        max_steps=knobs.steps,
        beta=knobs.beta,
        max_grad_norm=knobs.max_grad_norm,
        learning_rate=knobs.learning_rate,
        optim=knobs.optim,
        num_iterations=knobs.num_iterations,
        model_init_kwargs={"dtype": getattr(torch, knobs.dtype)},
        # TRL's configs default to bf16=True: on CPU that is bf16 autocast, and TRL's fused
        # log-prob head then computes its logit tiles in bf16 (~2e-3 relative gradient error)
        bf16=knobs.bf16,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=knobs.seed,
        data_seed=knobs.seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    if knobs.algo == "grpo":
        return trl.GRPOConfig(loss_type=knobs.loss_type, **kwargs), trl.GRPOTrainer
    if knobs.algo == "rloo":
        config = trl.RLOOConfig(normalize_advantages=knobs.normalize_advantages, **kwargs)
        return config, trl.RLOOTrainer
    raise ValueError(f"unknown algo {knobs.algo!r}: grpo or rloo")


def _install_boundary(trainer, rollout) -> None:
    """Route the engine call and the reward functions through ``rollout`` (module docstring)."""
    from trl import GRPOTrainer

    generate_single_turn = trainer._generate_single_turn
    calculate_rewards = trainer._calculate_rewards
    device = trainer.accelerator.device
    # GRPO's returns (completion_ids, logprobs), RLOO's the completion ids alone
    returns_logprobs = isinstance(trainer, GRPOTrainer)

    calls: dict[tuple[str, int], int] = {}

    def through(name, generate):
        if rollout is None:
            return generate()
        step = trainer.state.global_step
        # a second engine call at one step (GRPO's tool loop) is a rollout of its own
        n = calls[name, step] = calls.get((name, step), -1) + 1
        return rollout(step, generate, name if n == 0 else f"{name}-{n}")

    def engine(prompt_ids, *args, **kwargs):
        def generate():
            out = generate_single_turn(prompt_ids, *args, **kwargs)
            completion_ids, logprobs = out if returns_logprobs else (out, None)
            return engine_batch(prompt_ids, completion_ids, logprobs)

        batch = through("generation", generate)
        recorded = _rows(batch["prompt_ids"], batch["prompt_lengths"])
        if recorded != [list(p) for p in prompt_ids]:
            raise RuntimeError(
                f"step {trainer.state.global_step}: the recorded generation was for other "
                "prompts than the trainer tokenized (the data order or the chat template changed)"
            )
        completion_ids = _rows(batch["completion_ids"], batch["completion_lengths"])
        if not returns_logprobs:
            return completion_ids
        logprobs = batch.get("logprobs")
        if logprobs is not None:
            logprobs = _rows(logprobs, batch["completion_lengths"])
        return completion_ids, logprobs

    def rewards(*args, **kwargs):
        def generate():
            return {"rewards_per_func": calculate_rewards(*args, **kwargs).detach().cpu()}

        return through("rewards", generate)["rewards_per_func"].to(device)

    trainer._generate_single_turn = engine
    trainer._calculate_rewards = rewards


def make_trainer(
    knobs: Knobs,
    model_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    rollout: Callable[[int, Callable[[], dict], str], dict] | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
):
    from transformers import AutoTokenizer, PrinterCallback, TrainerCallback

    config, trainer_class = _config(knobs, output_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    # A random model almost never samples EOS, so every completion would run to
    # max_completion_length and micro-batching could not matter. A sampling-only bias on EOS
    # (~15% per token) makes completions ragged; training log-probs are the model's own.
    config.generation_kwargs = {"sequence_bias": {(tokenizer.eos_token_id,): EOS_BIAS}}
    trainer = trainer_class(
        model=str(model_dir),
        reward_funcs=reward_vowels,
        args=config,
        train_dataset=dataset(),
        processing_class=tokenizer,
    )
    _install_boundary(trainer, rollout)
    trainer.remove_callback(PrinterCallback)  # it prints every log dict with disable_tqdm
    _install_bug(trainer, knobs)

    if on_step is not None:

        class Metrics(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "grad_norm" in logs:  # the per-step log, not the run summary
                    on_step(state.global_step - 1, dict(logs))

        trainer.add_callback(Metrics())
    return trainer


def train(knobs: Knobs, model_dir, output_dir, rollout=None) -> list[dict[str, float]]:
    """Run ``knobs.steps`` optimizer steps; the logged metrics of each step."""
    logged: list[dict[str, float]] = []
    trainer = make_trainer(
        knobs, model_dir, output_dir, rollout, on_step=lambda step, m: logged.append(m)
    )
    with quiet():
        trainer.train()
    return logged


def training_metrics(logs: dict[str, float]) -> dict[str, float]:
    return {k: float(logs[k]) for k in TRAINING_METRICS if logs.get(k) is not None}


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    import logging
    import warnings

    level = logging.getLogger("transformers").level
    logging.getLogger("transformers").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logging.getLogger("transformers").setLevel(level)


class Recorder:
    """A stand-in golden for :func:`train`: records batches, then replays them."""

    def __init__(self) -> None:
        self.batches: dict[tuple[str, int], dict[str, torch.Tensor]] = {}

    def __call__(self, step: int, generate: Callable[[], dict], name: str = "rollout") -> dict:
        key = (name, step)
        if key in self.batches:
            return {k: v.clone() for k, v in self.batches[key].items()}
        with torch.random.fork_rng():  # like golden.rollout: replay consumes no randomness
            batch = generate()
        self.batches[key] = {k: v.clone() for k, v in batch.items()}
        return batch
