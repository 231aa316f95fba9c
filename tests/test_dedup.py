"""Exact deduplication when preparing (data/prepare.py): the first copy of a text is kept."""

from __future__ import annotations

import json

import numpy as np

from conftest import WORDS
from littlelm.config import validate
from littlelm.data.build import prepare_data
from littlelm.data.inspect import inspect_dataset
from littlelm.schema import RunConfig


def corpus(path, unique: int = 90, copies: int = 10, files: int = 3):
    """`unique` distinct documents plus `copies` exact repeats of some of them, spread over
    several JSONL files (as when one source is mixed from several downloads)."""
    rng = np.random.default_rng(0)
    docs = [
        f"{i}: " + " ".join(rng.choice(WORDS, size=int(rng.integers(5, 60)))) for i in range(unique)
    ]
    docs += [docs[int(i)] for i in rng.choice(unique, size=copies, replace=False)]
    order = rng.permutation(len(docs))
    path.mkdir()
    for k in range(files):
        part = [docs[i] for i in order[k::files]]
        (path / f"part{k}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in part))
    return path


def prepare(tmp_path, dedup: bool | None = None, val_split: str = "hash"):
    source = {"name": "jsonl", "path": str(tmp_path / "raw")}
    if dedup is not None:
        source["dedup"] = dedup
    tree = {
        "tokenizer": {"name": "byte"},
        "sources": {"web": source},
        "val_fraction": 0.2,
        "val_split": val_split,
        "shard_tokens": 800,  # several units: duplicates across units and files
        "workers": 1,
    }
    cfg = validate(RunConfig, {"data": tree}).data
    out = tmp_path / f"out-{dedup}-{val_split}"
    _, result = prepare_data(cfg, out=out, log=lambda _: None)
    return out / "web", result["web"][2]


def test_dedup_prepares_to_the_unique_count(tmp_path):
    corpus(tmp_path / "raw")
    directory, m = prepare(tmp_path)  # on by default
    assert len(m["splits"]["train"]["shards"]) > 2  # several units: duplicates across them
    assert m["documents"] == 90 and m["duplicates"] == 10
    assert m["splits"]["train"]["docs"] + m["splits"]["val"]["docs"] == 90
    lines = []
    inspect_dataset(directory, samples=0, out=lines.append)
    assert "exact duplicates dropped: 10" in lines


def test_dedup_off_keeps_every_copy_and_tail_split_dedups(tmp_path):
    corpus(tmp_path / "raw")
    _, m = prepare(tmp_path, dedup=False)
    assert m["documents"] == 100 and m["duplicates"] == 0
    _, m = prepare(tmp_path, val_split="tail")
    assert m["documents"] == 90 and m["duplicates"] == 10


def test_the_duplicates_dropped_are_said_at_start_and_by_prepare_with_the_fix(tmp_path, capsys):
    import yaml

    from conftest import tiny_tree
    from littlelm.cli import main

    corpus(tmp_path / "raw")
    tree = tiny_tree(tmp_path / "unused.txt", tmp_path / "runs", train={"max_steps": 1})
    tree["data"]["sources"] = {"web": {"name": "jsonl", "path": str(tmp_path / "raw")}}
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(tree))
    said = "data.sources.web: 10 exact duplicate document(s) were dropped when it was prepared"
    for _ in range(2):  # preparing, then a dataset prepared before: said both times
        assert main(["data", "prepare", str(cfg), "--out", str(tmp_path / "ds")]) == 0
        out = capsys.readouterr().out
        assert said in out and "data.sources.web.dedup=false keeps every copy" in out, out
    assert main(["train", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert said in out and "90 kept" in out and "weight" in out, out
