from __future__ import annotations

import itertools

import pytest
import torch

from littlelm.model.gpt import GPT, GPTConfig, flops_per_token


def tiny(**kw) -> GPTConfig:
    base = dict(name="gpt", vocab_size=100, n_layer=3, d_model=32, n_head=4, max_seq_len=16)
    base.update(kw)
    return GPTConfig(**base)


def randomize(model: GPT, std: float = 0.2) -> GPT:
    """Break the identity init so that every path carries signal."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * std)
    return model


FEATURES = ["qk_norm", "residual_scalars", "value_embeds", "tie_embeddings", "norm_affine"]


@pytest.mark.parametrize("mlp", ["relu2", "swiglu"])
@pytest.mark.parametrize("flags", list(itertools.product([False, True], repeat=2)))
def test_feature_switches_train(mlp, flags):
    on = dict(zip(["qk_norm", "value_embeds"], flags))
    cfg = tiny(mlp=mlp, n_kv_head=2, softcap=None if flags[0] else 15.0, **on)
    model = randomize(GPT(cfg))
    idx = torch.randint(0, 100, (2, 16))
    loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_every_switch_changes_the_parameters_or_function():
    base = tiny()
    n = GPT(base).param_counts()["total"]
    assert GPT(tiny(value_embeds=False)).param_counts()["total"] < n
    assert GPT(tiny(residual_scalars=False)).param_counts()["total"] == n - 2 * 3
    assert GPT(tiny(tie_embeddings=True)).param_counts()["total"] < n
    assert GPT(tiny(n_kv_head=1)).param_counts()["total"] < n
    assert GPT(tiny(mlp="swiglu")).cfg.hidden == 64  # 2/3 of 4·32, rounded to 64


def test_vocab_padding_rows_never_predicted_nor_in_loss():
    cfg = tiny(vocab_size=70)  # padded to 128
    model = randomize(GPT(cfg))
    assert model.lm_head.weight.shape[0] == 128
    idx = torch.randint(0, 70, (2, 16))
    logits = model(idx)
    assert logits.shape == (2, 16, 70)
    loss = model(idx, idx)
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, 70), idx.reshape(-1))
    torch.testing.assert_close(loss, ref)
    loss.backward()
    assert model.lm_head.weight.grad[70:].abs().max() == 0


def test_blocks_start_as_identity():
    model = GPT(tiny())
    x = torch.randn(2, 16, 32)
    cos, sin = model.rope_cos[:, :16], model.rope_sin[:, :16]
    for block in model.blocks:
        torch.testing.assert_close(block(x, cos, sin, model.kernels), x)


def test_initial_loss_is_near_uniform():
    model = GPT(tiny(vocab_size=1000, n_layer=2))
    idx = torch.randint(0, 1000, (4, 16))
    assert abs(model(idx, idx).item() - torch.log(torch.tensor(1000.0)).item()) < 0.05


def test_ignore_index_targets_do_not_count():
    model = randomize(GPT(tiny()))
    idx = torch.randint(0, 100, (1, 16))
    tgt = idx.clone()
    tgt[0, 8:] = -1
    per_token = model(idx, idx, reduction="none")
    torch.testing.assert_close(model(idx, tgt), per_token[0, :8].mean())


def test_causality():
    model = randomize(GPT(tiny()))
    a = torch.randint(0, 100, (1, 16))
    b = a.clone()
    b[0, 10:] = (b[0, 10:] + 1) % 100
    torch.testing.assert_close(model(a)[0, :10], model(b)[0, :10])


@pytest.mark.parametrize("kv", [4, 2, 1])
def test_kv_cache_equals_full_recomputation(kv):
    model = randomize(GPT(tiny(n_kv_head=kv))).eval()
    idx = torch.randint(0, 100, (2, 16))
    with torch.no_grad():
        full = model(idx)
        caches = model.new_caches(2)
        parts = [model(idx[:, :7], caches=caches)]
        parts += [model(idx[:, i : i + 1], caches=caches) for i in range(7, 12)]
        parts.append(model(idx[:, 12:], caches=caches))  # multi-token chunk after a prefix
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)


def test_too_long_sequence_is_an_error():
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        GPT(tiny())(torch.zeros(1, 17, dtype=torch.long))


def test_flops_per_token_counts_matmul_weights():
    cfg = tiny(vocab_size=64, value_embeds=False, residual_scalars=False)
    model = GPT(cfg)
    matmul = sum(
        p.numel() for n, p in model.named_parameters() if model.role(n) in ("matrix", "lm_head")
    )
    attn = 12 * cfg.n_layer * cfg.d_model * 16
    assert flops_per_token(cfg, 16) == 6 * matmul + attn


def test_param_counts_split():
    model = GPT(tiny())
    c = model.param_counts()
    assert c["total"] == sum(p.numel() for p in model.parameters())
    assert c["embedding"] == model.wte.weight.numel() + sum(
        e.weight.numel() for e in model.value_embeds.values()
    )


def test_value_embeds_on_alternating_layers_including_last():
    assert sorted(GPT(tiny(n_layer=4)).value_embeds) == ["1", "3"]
    assert sorted(GPT(tiny(n_layer=5)).value_embeds) == ["0", "2", "4"]


def test_tree_packed_row_equals_separate_sequences():
    """A shared prefix plus two branches in one row (positions + mask) gives each sequence's
    own logits: what the eval harness relies on."""
    model = randomize(GPT(tiny(n_kv_head=2))).eval()
    prefix, a, b = [5, 6, 7, 8], [9, 10, 11], [12, 13]
    row = torch.tensor([prefix + a + b])
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 4, 5]])
    branch = torch.tensor([-1] * 4 + [0] * 3 + [1] * 2)
    mask = torch.ones(9, 9, dtype=torch.bool).tril()
    mask &= (branch[:, None] == branch[None, :]) | (branch[None, :] == -1)
    with torch.no_grad():
        packed = model.head(model.hidden(row, positions=positions, attn_mask=mask[None, None]))[0]
        seq_a = model(torch.tensor([prefix + a]))[0]
        seq_b = model(torch.tensor([prefix + b]))[0]
    torch.testing.assert_close(packed[:7], seq_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[[0, 1, 2, 3, 7, 8]], seq_b, atol=1e-5, rtol=1e-5)


def test_explicit_position_beyond_context_is_an_error():
    model = GPT(tiny())
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        model.hidden(torch.zeros(1, 2, dtype=torch.long), positions=torch.tensor([[0, 16]]))


@pytest.mark.parametrize("loss", ["chunked", "plain"])
def test_activation_checkpointing_and_loss_impl_give_the_same_loss_and_gradients(loss):
    x = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    results = []
    for recompute in (False, True):
        torch.manual_seed(0)
        model = randomize(GPT(tiny(loss=loss)))
        model.activation_checkpointing = recompute
        value = model(x, x)
        value.backward()
        results.append((value.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.manual_seed(0)
    reference = randomize(GPT(tiny(loss="plain")))
    ref_loss = reference(x, x)
    torch.testing.assert_close(results[0][0], ref_loss.detach(), rtol=1e-5, atol=1e-6)
    (l0, g0), (l1, g1) = results
    assert torch.equal(l0, l1)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
