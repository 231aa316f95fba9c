"""KV-cached generation equals full recomputation; greedy is deterministic; limits are named."""

from __future__ import annotations

import pytest
import torch

from littlelm.errors import LittleLMError
from littlelm.model.generate import check_sampling, fit_prompt, generate, pick
from littlelm.model.gpt import GPT, GPTConfig


def model(n_kv_head=None) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(
        name="gpt",
        vocab_size=97,
        n_layer=2,
        d_model=32,
        n_head=4,
        n_kv_head=n_kv_head,
        max_seq_len=48,
    )
    m = GPT(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m.eval()


@torch.no_grad()
def recompute(m: GPT, prompt, max_tokens, temperature, top_k, seed) -> list[int]:
    """The obvious decoder: rerun the whole sequence for every new token, no cache."""
    gen = torch.Generator().manual_seed(seed)
    seq, out = list(prompt), []
    for _ in range(max_tokens):
        logits = m(torch.tensor([seq]))[:, -1]
        nxt = pick(logits, temperature, top_k, gen)
        out.append(nxt)
        seq.append(nxt)
    return out


@pytest.mark.parametrize("kv", [None, 2])
@pytest.mark.parametrize("temperature, top_k", [(0.0, None), (1.0, None), (0.8, 5)])
def test_cached_generation_equals_recomputation(kv, temperature, top_k):
    m = model(kv)
    prompt = [1, 5, 9, 3, 7]
    got = generate(m, prompt, 30, temperature, top_k, seed=3)
    assert got == recompute(m, prompt, 30, temperature, top_k, 3)
    assert len(got) == 30


def test_greedy_is_deterministic_and_seeded_sampling_repeats():
    m = model()
    assert generate(m, [1, 2, 3], 20, 0.0, seed=1) == generate(m, [1, 2, 3], 20, 0.0, seed=2)
    a = generate(m, [1, 2, 3], 20, 1.0, seed=7)
    assert a == generate(m, [1, 2, 3], 20, 1.0, seed=7)
    assert a != generate(m, [1, 2, 3], 20, 1.0, seed=8)
    state = torch.get_rng_state()
    generate(m, [1, 2, 3], 5, 1.0, seed=7)
    assert torch.equal(state, torch.get_rng_state())  # the global RNG is untouched


def test_generation_stops_at_the_stop_token():
    m = model()
    free = generate(m, [1, 2], 20, 0.0)
    stop = free[4]
    assert generate(m, [1, 2], 20, 0.0, stop=stop) == free[: free.index(stop) + 1]


def test_top_k_one_is_greedy():
    m = model()
    assert generate(m, [4, 4], 15, 1.5, top_k=1, seed=0) == generate(m, [4, 4], 15, 0.0)


def test_prompt_and_length_are_fitted_with_a_note():
    prompt, n, note = fit_prompt(list(range(10)), 5, 48)
    assert (prompt, n, note) == (list(range(10)), 5, "")
    prompt, n, note = fit_prompt(list(range(10)), 50, 48)
    assert n == 38 and "generating 38 tokens, not 50" in note
    prompt, n, note = fit_prompt(list(range(60)), 5, 48)
    assert prompt == [0, *range(14, 60)] and len(prompt) == 47 and n == 1
    assert "does not fit the 48-token context" in note
    with pytest.warns(UserWarning, match="does not fit"):
        assert len(generate(model(), list(range(60)), 5, 0.0)) == 1


@pytest.mark.parametrize(
    "args, expected",
    [
        ((0, 1.0, None), "--max-tokens"),
        ((5, -1.0, None), "--temperature"),
        ((5, 1.0, 0), "--top-k"),
    ],
)
def test_bad_sampling_settings_are_user_errors(args, expected):
    with pytest.raises(LittleLMError, match=expected):
        check_sampling(*args)


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-45, 1e-30])
@pytest.mark.parametrize("top_p", [None, 1e-300, 0.5])
def test_a_tiny_temperature_or_top_p_samples_the_greedy_token(temperature, top_p):
    """Any temperature > 0 and top_p in (0, 1] is a distribution: 1e-300 is 0 in fp32, where
    dividing by it (or keeping a mass of it) gave nan probabilities and a traceback."""
    m = model()
    greedy = generate(m, [1, 2, 3], 12, temperature=0)
    assert generate(m, [1, 2, 3], 12, temperature, seed=0, top_p=top_p) == greedy
    logits = torch.tensor([[0.5, 2.0, 2.0, -1.0]])  # a tie: either of the two, never another
    gen = torch.Generator().manual_seed(0)
    assert {pick(logits, temperature, None, gen, top_p) for _ in range(20)} <= {1, 2}


def test_a_tiny_temperature_samples_groups_and_scores_them_finitely():
    from littlelm.model.generate import sample_group, tempered

    m = model()
    greedy = generate(m, [1, 2, 3], 6, temperature=0)
    rows, _ = sample_group(m, [1, 2, 3], 3, 6, 1e-300, torch.Generator().manual_seed(0), 96)
    assert all(row == greedy for row in rows.tolist())
    logp = torch.log_softmax(tempered(torch.tensor([[1.0, 3.0, 2.0]]), 1e-300), dim=-1)
    assert logp[0, 1] == 0 and not logp.isnan().any()  # what RL's loss reads at that temperature
