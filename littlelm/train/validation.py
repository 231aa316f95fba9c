"""The validation loss of a run: over all held-out data, and over each named set (`eval.sets`).

Each source's held-out windows are evaluated once; the whole (`val_loss`, `val_bpb`, as in a
run without sets) and every named set are sums over those, so naming sets costs nothing extra
and a set's loss is exactly what evaluating its sources alone would give. A record with sets:

    {"val_loss": 1.52, "val_bpb": 2.19, "val_tokens": 24576,
     "val_sets": {"code": {"loss": 1.31, "bpb": 1.89, "tokens": 7296}, "prose": {...}}}
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from littlelm.model.bpb import LossSums, loss_sums
from littlelm.train import dpo

if TYPE_CHECKING:
    import torch

    from littlelm.data.build import RunData
    from littlelm.schema import RunConfig


def validation_metrics(
    model, data: RunData, cfg: RunConfig, token_bytes: torch.Tensor, device, autocast
) -> dict:
    """val_loss / val_bpb / val_tokens over every source's held-out split, plus `val_sets`
    (name -> loss / bpb / tokens) when eval.sets names any."""
    e, t = cfg.eval, cfg.train
    batch = e.batch_size or t.micro_batch_size
    assert t.seq_len is not None, "load_run derives it"
    sums = {
        label: loss_sums(
            model,
            data.source_val_batches(label, batch, t.seq_len, e.max_tokens),
            token_bytes,
            device,
            autocast,
            bos=data.tokenizer.bos_id,  # an end-of-turn token's loss counts in val_bpb
        )
        for label in data.sources
    }
    m = sum(sums.values(), LossSums()).metrics()
    if e.sets:
        m["val_sets"] = {
            name: {
                k.removeprefix("val_"): v
                for k, v in sum((sums[s] for s in labels), LossSums()).metrics().items()
            }
            for name, labels in e.sets.items()
        }
    return m


def validation_line(m: dict) -> str:
    """'val loss 1.5200 | val bpb 2.1900 | 24,576 tokens', then ' | code 1.3100 (1.8900 bpb)'
    for each named set; a DPO run's figures in its own line (train/dpo.py)."""
    if "val_pairs" in m:
        return dpo.validation_line(m)
    line = f"val loss {m['val_loss']:.4f} | val bpb {m['val_bpb']:.4f} | {m['val_tokens']:,} tokens"
    for name, s in m.get("val_sets", {}).items():
        line += f" | {name} {s['loss']:.4f} ({s['bpb']:.4f} bpb)"
    return line
