"""The loader's promise when a run resumes with another number of processes (data/reshard.py):
no document of the epoch is skipped, few are seen twice, and the same world size is exact."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from conftest import make_corpus
from littlelm.config import validate
from littlelm.data.build import DataConfig, build_data
from littlelm.data.loader import DataExhausted, MixtureLoader
from littlelm.data.reshard import loader_state_for, reshard, slice_count
from littlelm.schema import RunConfig


@pytest.fixture
def data(tmp_path):
    """Two sources of uneven documents, the first split into several shards; stop at the end
    of the first epoch so that 'every document once' can be checked (cropped: a split
    document's rest would be taken from the buffer again, which `Logged` would count twice)."""
    tree = {
        "tokenizer": {"name": "byte"},
        "sources": {
            "a": {"name": "text", "path": str(make_corpus(tmp_path / "a.txt", 90, seed=1)),
                  "split": "paragraph", "weight": 2.0, "long_docs": "crop"},
            "b": {"name": "text", "path": str(make_corpus(tmp_path / "b.txt", 40, seed=2)),
                  "split": "paragraph", "long_docs": "crop"},
        },
        "buffer_docs": 6,
        "shard_tokens": 1500,
        "on_exhausted": "stop",
        "val_fraction": 0.0,
    }  # fmt: skip
    cfg = validate(RunConfig, {"data": tree}).data
    assert isinstance(cfg, DataConfig)
    return cfg, build_data(cfg, log=lambda _: None)


def make(cfg, data):
    return lambda rank, world: data.loader(cfg, 2, 24, seed=5, rank=rank, world=world)


class Logged(dict):
    """A packer's `where` map (arrival -> shard, doc, start) that logs each document taken out
    of the buffer to be packed into a row."""

    def __init__(self, where: dict, label: str, seen: list):
        super().__init__(where)
        self.label, self.seen = label, seen

    def pop(self, key):
        s, d, start = super().pop(key)
        self.seen.append((self.label, s, d))
        return s, d, start


def record(loader: MixtureLoader, seen: list) -> MixtureLoader:
    """Log every document the packers place in a row (label, shard, doc)."""
    for label, packer in loader.packers.items():
        packer.where = Logged(packer.where, label, seen)
    return loader


def buffered(loaders: list[MixtureLoader]) -> set:
    """(label, shard, doc) of every document waiting in the loaders' packing buffers."""
    return {
        (label, s, d)
        for loader in loaders
        for label, p in loader.packers.items()
        for s, d, _ in p.where.values()
    }


def drain(loaders: list[MixtureLoader]) -> None:
    """Pack rows from every source of every loader until the source runs dry (the end of its
    epoch); the documents still buffered then are left in the packers."""
    for loader in loaders:
        for packer in loader.packers.values():
            row = np.empty(packer.row_len, dtype=np.int64)
            with contextlib.suppress(DataExhausted):
                while True:
                    packer.fill(row)


def all_docs(data) -> set:
    return {
        (label, s, d)
        for label, src in data.sources.items()
        for s, shard in enumerate(src.train)
        for d in range(len(shard))
    }


@pytest.mark.parametrize(
    "old_world, new_world, steps", [(2, 1, 5), (1, 2, 4), (2, 3, 6), (3, 2, 3)]
)
def test_resharding_skips_no_document(data, old_world, new_world, steps):
    cfg, run = data
    seen_before, seen_after = [], []
    old = [record(make(cfg, run)(r, old_world), seen_before) for r in range(old_world)]
    for _ in range(steps):
        for loader in old:
            loader.next_batch()
    states = reshard([o.state_dict() for o in old], new_world, make(cfg, run))
    new = []
    for r, s in enumerate(states):
        loader = make(cfg, run)(r, new_world)
        loader.load_state_dict(s)
        new.append(record(loader, seen_after))
    waiting = buffered(new)
    drain(new)
    left = buffered(new)
    everything = all_docs(run)
    assert everything <= set(seen_before) | set(seen_after) | left | waiting
    assert len(seen_after) == len(set(seen_after))  # the new ranks never read a document twice
    twice = set(seen_before) & set(seen_after)
    assert len(twice) <= 0.1 * len(everything), sorted(twice)


def test_row_counts_are_kept(data):
    cfg, run = data
    old = [make(cfg, run)(r, 2) for r in range(2)]
    for _ in range(3):
        for loader in old:
            loader.next_batch()
    before = sum(sum(o.state_dict()["rows"]) for o in old)
    states = reshard([o.state_dict() for o in old], 3, make(cfg, run))
    assert sum(sum(s["rows"]) for s in states) == before


def test_same_world_size_returns_each_rank_its_own_state(data):
    cfg, run = data
    old = [make(cfg, run)(r, 2) for r in range(2)]
    old[0].next_batch()
    states = [o.state_dict() for o in old]
    saved = {"loader": states[0], "loader_ranks": states, "loader_world_size": 2}
    assert loader_state_for(saved, 1, 2, make(cfg, run)) == states[1]
    single = {"loader": states[0]}
    assert loader_state_for(single, 0, 1, make(cfg, run)) == states[0]


def test_slice_count():
    # positions in [3, 10) that are 1 mod 3: 4 and 7
    assert slice_count(3, 10, 1, 3) == 2
    assert slice_count(0, 0, 0, 2) == 0
    assert slice_count(0, 5, 4, 8) == 1 and slice_count(5, 5, 0, 1) == 0
