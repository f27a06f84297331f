"""check_group_diversity and check_token_ids_kept against a broken and a correct
implementation each: a sampler seeded alike per prompt (UniRL #208) and one seeded per
sample; an agent loop that re-tokenizes each turn's text with a real BPE tokenizer and one
that keeps the sampled ids."""

from __future__ import annotations

import pytest
import torch

from pytest_rollout_golden.invariants import check_group_diversity, check_token_ids_kept

VOCAB, LENGTH, N = 32, 8, 4


def sample_group(prompt: int, seeds: list[int]) -> torch.Tensor:
    """One prompt's completions at temperature 1 from a fixed next-token distribution."""
    logits = torch.linspace(0.0, 2.0, VOCAB) + 0.1 * prompt
    rows = []
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        rows.append(torch.multinomial(logits.softmax(-1), LENGTH, replacement=True, generator=g))
    return torch.stack(rows)


def rollout(seed_of) -> dict:
    prompts = range(6)
    responses = torch.cat([sample_group(p, [seed_of(p, i) for i in range(N)]) for p in prompts])
    return {
        "uid": [f"p{p}" for p in prompts for _ in range(N)],
        "responses": responses,
        "response_mask": torch.ones_like(responses),
    }


def test_a_sampler_seeded_per_prompt_repeats_every_group_and_fails():
    batch = rollout(lambda prompt, index: 1000 + prompt)  # the defect: one seed per prompt
    with pytest.raises(AssertionError, match=r"\[rollout.identical_groups\] 6 of 6 groups"):
        check_group_diversity(batch)


def test_a_sampler_seeded_per_sample_passes():
    check_group_diversity(rollout(lambda prompt, index: 1000 + N * prompt + index))


def test_padding_does_not_make_completions_differ_and_a_few_repeats_pass():
    batch = rollout(lambda prompt, index: 1000 + N * prompt + index)
    batch["responses"][:N] = batch["responses"][0]  # one group of six repeats (an easy prompt)
    check_group_diversity(batch)
    batch["responses"][N : 4 * N] = batch["responses"][N]  # now four of six (the last one
    mask = torch.ones_like(batch["responses"])  # differs only in its padding)
    batch["responses"][4 * N - 1, -1] = 0
    mask[N : 4 * N, -1] = 0
    batch["response_mask"] = mask
    with pytest.raises(AssertionError, match=r"4 of 6 groups hold one completion repeated"):
        check_group_diversity(batch)
    check_group_diversity(batch, max_identical=0.7)


@pytest.fixture(scope="module")
def tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["the answer is 42", "the tool says 40 + 2", "answer: 42"] * 50
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["[UNK]"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    return tok


def agent_trajectory(tok, *, retokenize: bool):
    """A two-turn trajectory: the engine samples 'answer' one character at a time (a
    non-canonical tokenization an LLM may sample); the tool's output sits between turns."""
    by_char = [tok.token_to_id(c) for c in "answer"]
    turns = [by_char + tok.encode(" is").ids, tok.encode("42").ids]
    prompt, tool = tok.encode("the tool").ids, tok.encode(" says 40 + 2 ").ids
    kept = [tok.encode(tok.decode(t)).ids if retokenize else t for t in turns]
    ids = prompt + kept[0] + tool + kept[1]
    mask = [0] * len(prompt) + [1] * len(kept[0]) + [0] * len(tool) + [1] * len(kept[1])
    return turns, ids, mask


def test_an_agent_loop_that_retokenizes_each_turn_fails_at_the_merged_token(tokenizer):
    turns, ids, mask = agent_trajectory(tokenizer, retokenize=True)
    assert turns[0] != tokenizer.encode(tokenizer.decode(turns[0])).ids  # BPE merges them
    with pytest.raises(AssertionError) as failed:
        check_token_ids_kept(turns, ids, mask, decode=tokenizer.decode)
    message = str(failed.value)
    assert message.startswith("[rollout.token_ids_kept] turn 0, its token 0: the engine sampled")
    assert "('a')" in message and "token in, token out" in message


def test_an_agent_loop_that_keeps_the_sampled_ids_passes(tokenizer):
    turns, ids, mask = agent_trajectory(tokenizer, retokenize=False)
    check_token_ids_kept(turns, torch.tensor(ids), torch.tensor(mask), decode=tokenizer.decode)


def test_a_loss_mask_over_what_follows_the_last_turn_fails_on_the_count():
    with pytest.raises(AssertionError, match=r"trains on 4 positions, the engine sampled 3 ids"):
        check_token_ids_kept([[7, 8], [9]], [1, 7, 8, 4, 9, 5], [0, 1, 1, 0, 1, 1])
