"""pytest_rollout_golden.bitwise: ULP distances, bit-for-bit comparison of two computations,
and the first module where two forward passes part.

The toy pair: an "engine" that computes each sample's log probs alone and a "trainer" that
walks the whole batch, both with one row kernel (so they agree in every bit on any CPU), and
a control whose log-sum-exp is split in four chunks (as a split-K kernel chosen by batch size
would), which moves the last bits of some tokens.
"""

from __future__ import annotations

import math

import pytest
import torch

from pytest_rollout_golden import bitwise

B, T, H, V = 6, 12, 32, 64


def log_probs(hidden, weight, tokens, split=1):
    """Per token: its logit minus the log-sum-exp of its row, the sum cut in ``split`` chunks;
    the logits row by row, one vector-matrix kernel whatever the batch."""
    rows = hidden.reshape(-1, hidden.shape[-1])
    logits = torch.stack([row @ weight for row in rows]).reshape(*hidden.shape[:-1], -1)
    chunks = logits.split(logits.shape[-1] // split, dim=-1)
    lse = torch.stack([c.logsumexp(-1) for c in chunks], -1).logsumexp(-1)
    return logits.gather(-1, tokens[..., None]).squeeze(-1) - lse


def pair(seed):
    """(engine, trainer, control, mask) of one seeded batch; ragged rows, right padding."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g)
    weight = torch.randn(H, V, generator=g) / H**0.5
    tokens = torch.randint(0, V, (B, T), generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    engine = torch.cat([log_probs(hidden[i : i + 1], weight, tokens[i : i + 1]) for i in range(B)])
    trainer = log_probs(hidden, weight, tokens)
    control = log_probs(hidden, weight, tokens, split=4)
    return engine, trainer, control, mask


def bumped(x, flat_index):
    """``x`` with one element moved to the next representable value (one ULP up)."""
    out = x.clone().reshape(-1)
    out[flat_index] = torch.nextafter(out[flat_index], torch.tensor(math.inf, dtype=x.dtype))
    return out.reshape(x.shape)


def test_the_bitwise_pair_agrees_in_every_bit_over_50_seeds():
    found = [bitwise.compare(t, e, m) for e, t, _, m in map(pair, range(50))]
    assert [d.differing for d in found] == [0] * 50
    assert all(d.compared > 0 for d in found)


def test_the_control_differs_somewhere_on_every_seed():
    found = [bitwise.compare(c, e, m) for e, _, c, m in map(pair, range(50))]
    assert all(d.differing > 0 for d in found)


def test_a_one_ulp_change_in_one_token_is_found_20_of_20():
    for seed in range(20):
        engine, trainer, _, mask = pair(seed)
        valid = mask.reshape(-1).nonzero().squeeze(-1)
        where = int(
            valid[torch.randint(len(valid), (1,), generator=torch.Generator().manual_seed(seed))]
        )
        found = bitwise.compare(bumped(trainer, where), engine, mask)
        assert (found.differing, found.ulps, found.max_ulps) == (1, 1, 1.0)
        assert found.first == divmod(where, T)


def test_a_difference_on_padding_is_not_compared():
    engine, trainer, _, mask = pair(0)
    padding = int((~mask).reshape(-1).nonzero()[0])
    assert bitwise.compare(bumped(trainer, padding), engine, mask).equal
    assert not bitwise.compare(bumped(trainer, padding), engine).equal  # no mask: everywhere


def test_the_description_names_the_first_token_both_values_bits_and_ulps():
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = bumped(bumped(a, 1), 3)
    b[1, 1] = torch.nextafter(b[1, 1], torch.tensor(math.inf))  # 2 ULP at (1, 1)
    text = bitwise.compare(b, a).describe(axes=("sample", "token"))
    assert text == (
        "2 of 4 values differ in their bits (float32); first at (sample 0, token 1): "
        "trainer 2.00000024 (0x40000001), engine 2.0 (0x40000000), 1 ULP apart; "
        "the furthest 2 ULP apart"
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_adjacent_values_are_one_ulp_apart_in_every_dtype(dtype):
    bits = {torch.float64: torch.int64, torch.float32: torch.int32}.get(dtype, torch.int16)
    x = torch.tensor([-2.5, -1e-3, 0.5, 7.0], dtype=dtype)
    up = (x.view(bits) + torch.tensor([-1, -1, 1, 1], dtype=bits)).view(dtype)  # away from 0
    assert bitwise.ulp_distance(x, up).tolist() == [1.0] * 4
    assert bitwise.compare(up, x).ulps == 1


def test_zeros_of_two_signs_differ_in_bits_but_not_in_ulps():
    found = bitwise.compare(torch.tensor([-0.0]), torch.tensor([0.0]))
    assert (found.differing, found.ulps) == (1, 0)


def test_nan_against_a_number_has_no_distance_and_equal_nans_are_equal():
    nan = torch.tensor([math.nan])
    found = bitwise.compare(nan, torch.tensor([1.0]))
    assert (found.differing, found.ulps, found.max_ulps) == (1, None, math.inf)
    assert "NaN, no ULP distance" in found.describe()
    assert bitwise.compare(nan, nan.clone()).equal


def test_float64_extremes_keep_an_exact_first_distance():
    found = bitwise.compare(
        torch.tensor([-1e308], dtype=torch.float64), torch.tensor([1e308], dtype=torch.float64)
    )
    big = torch.tensor([1e308], dtype=torch.float64).view(torch.int64).item()
    assert found.ulps == 2 * big


def test_a_top_k_tensor_is_compared_under_a_token_mask():
    engine = torch.randn(2, 3, 4)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    found = bitwise.compare(bumped(engine, 1 * 12 + 0 * 4 + 2), engine, mask)
    assert (found.differing, found.first, found.compared) == (1, (1, 0, 2), 12)
    assert bitwise.compare(bumped(engine, 2 * 4), engine, mask).equal  # (0, 2): padding


@pytest.mark.parametrize(
    ("a", "b", "error", "says"),
    [
        (torch.zeros(2), torch.zeros(2, dtype=torch.float64), TypeError, "needs one dtype"),
        (torch.zeros(2), torch.zeros(3), ValueError, "shapes differ"),
        (
            torch.zeros(2, dtype=torch.int64),
            torch.zeros(2, dtype=torch.int64),
            TypeError,
            "floating",
        ),
    ],
)
def test_pairs_that_cannot_be_compared_bit_for_bit_are_refused(a, b, error, says):
    with pytest.raises(error, match=says):
        bitwise.compare(a, b)


def test_a_mask_that_does_not_line_up_is_refused():
    with pytest.raises(ValueError, match="does not line up"):
        bitwise.compare(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(3, 2))


class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(V, H)
        self.proj = torch.nn.Linear(H, H)
        self.head = torch.nn.Linear(H, V, bias=False)

    def forward(self, tokens):
        return self.head(torch.tanh(self.proj(self.embed(tokens)))).log_softmax(-1)


def test_first_divergence_names_the_first_module_whose_output_differs():
    trainer, engine = Toy(), Toy()
    with torch.no_grad():
        trainer.proj.bias[3] = torch.nextafter(trainer.proj.bias[3], torch.tensor(1.0))
    tokens = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(1))
    found = bitwise.first_divergence(
        trainer, lambda: trainer(tokens), lambda: engine(tokens), other=engine
    )
    assert (found.module, found.call, found.output) == ("proj", 0, 0)
    assert found.describe().startswith(
        "first module whose output differs: proj (call 0, output 0): "
    )
    assert bitwise.first_divergence(engine, lambda: engine(tokens), lambda: engine(tokens)) is None


def test_first_divergence_reports_a_module_the_second_pass_never_called():
    model = Toy()
    tokens = torch.zeros(1, 2, dtype=torch.long)
    found = bitwise.first_divergence(
        model, lambda: model(tokens), lambda: model.head(model.embed(tokens))
    )
    assert (found.module, found.detail) == ("proj", "the second pass never called it")
