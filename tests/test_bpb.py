"""Validation loss and bits per byte of masked rows (SFT): means over the trained targets only."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

from littlelm.model.bpb import loss_sums
from littlelm.model.gpt import GPT, GPTConfig
from littlelm.model.kernels import IGNORE


@pytest.mark.parametrize("loss", ["chunked", "plain"])
def test_masked_targets_count_neither_in_the_loss_nor_in_its_mean(loss):
    torch.manual_seed(0)
    V = 50
    cfg = GPTConfig(n_layer=1, d_model=32, n_head=2, max_seq_len=16, vocab_size=V, loss=loss)
    model = GPT(cfg)
    x = torch.randint(0, V, (3, 16))
    y = torch.randint(0, V, (3, 16))
    y[:, :10] = IGNORE  # a prompt the SFT row does not train on
    y[2, :] = IGNORE  # and a row with nothing trained
    token_bytes = torch.randint(0, 4, (cfg.padded_vocab,))
    token_bytes[V - 1 :] = 0  # the last ids stand for no bytes (as a special token does)

    m = loss_sums(model, [(x, y)], token_bytes, "cpu", contextlib.nullcontext()).metrics()

    # independently: the logits' cross-entropy over the trained targets alone
    with torch.no_grad():
        logits = model(x).double()
    keep = y != IGNORE
    per = F.cross_entropy(logits[keep], y[keep], reduction="none")
    assert m["val_tokens"] == int(keep.sum()) == 12
    assert m["val_loss"] == pytest.approx(per.mean().item(), abs=1e-4)
    b = token_bytes[y[keep]]
    bpb = (per * (b > 0)).sum().item() / (math.log(2) * b.sum().item())
    assert m["val_bpb"] == pytest.approx(bpb, abs=1e-4)


def test_bpb_counts_a_trained_end_of_turn_token_and_leaves_out_bos():
    """An SFT reply's end token stands for no bytes but is trained: its loss counts in val_bpb
    (so bpb and loss rank runs alike); a predicted BOS (the next packed document) does not."""
    torch.manual_seed(0)
    V, BOS, END = 50, 0, 4
    model = GPT(GPTConfig(n_layer=1, d_model=32, n_head=2, max_seq_len=16, vocab_size=V))
    x = torch.randint(5, V, (2, 16))
    y = torch.randint(5, V, (2, 16))
    y[:, :6] = IGNORE  # the prompt
    y[0, 10], y[0, 15], y[1, 12] = END, BOS, END
    token_bytes = torch.full((model.cfg.padded_vocab,), 2)
    token_bytes[:5] = 0  # BOS and the chat tokens stand for no bytes
    m = loss_sums(model, [(x, y)], token_bytes, "cpu", contextlib.nullcontext(), bos=BOS)
    with torch.no_grad():
        logits = model(x).double()
    keep = (y != IGNORE) & (y != BOS)
    per = F.cross_entropy(logits[keep], y[keep], reduction="none")
    assert m.nats_bytes == pytest.approx(per.sum().item(), rel=1e-6)
    assert m.n_bytes == 2 * int((keep & (y != END)).sum())
