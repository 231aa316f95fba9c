"""Long documents: crop (drop what does not fit) vs split (every token trained on), and the
loader state of split mode (data/loader.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from littlelm.data.loader import BestFitPacker, DataExhausted, DocStream, MixtureLoader
from littlelm.data.shards import Shard, write_shard
from littlelm.errors import DataError

BOS = 0
FP = "ab" * 32


def numbered_shard(tmp_path, lengths, name="s.bin") -> Shard:
    """Documents whose tokens after the BOS are distinct numbers 1, 2, ... (so a token says
    which document position it is)."""
    docs, t = [], 1
    for n in lengths:
        docs.append(np.array([BOS, *range(t, t + n - 1)]))
        t += n - 1
    write_shard(tmp_path / name, docs, t + 1, BOS, FP)
    return Shard(tmp_path / name)


def epoch_targets(packer: BestFitPacker) -> list[int]:
    """The target tokens (row[1:]) of every row packed from one epoch of the source, including
    what is left in the buffer when the source runs dry."""
    row_len, targets = packer.row_len, []
    while True:
        row = np.full(row_len, -1, dtype=np.int64)
        try:
            packer.fill(row)
        except DataExhausted:
            packer.buffer_docs = 0  # read nothing more: place what is buffered
        except IndexError:  # buffer empty: the epoch is done
            targets += [t for t in row[1:] if t >= 0]
            return targets
        targets += [t for t in row[1:] if t >= 0]


LENGTHS = [3, 70, 9, 200, 17, 33, 5, 64, 65, 66, 130, 2, 41, 11, 300, 8]


@pytest.mark.parametrize("buffer_docs", [1, 4, 50])
def test_split_trains_on_every_document_token(tmp_path, buffer_docs):
    s = numbered_shard(tmp_path, LENGTHS)
    packer = BestFitPacker(DocStream([s], seed=3, repeat=False), 33, buffer_docs, "split")
    targets = epoch_targets(packer)
    tokens_in = sum(n - 1 for n in LENGTHS)  # every token after a document's BOS
    trained = {t for t in targets if t != BOS}
    assert len(trained) == tokens_in and trained == set(range(1, tokens_in + 1))
    assert packer.stats.cropped == 0 and packer.stats.split > 0
    # one token per piece boundary may be a target twice (a rest placed mid-row), no more
    assert sum(t != BOS for t in targets) - tokens_in <= sum(n // 32 + 1 for n in LENGTHS)


def test_crop_loses_tokens_that_split_keeps(tmp_path):
    s = numbered_shard(tmp_path, LENGTHS)
    packer = BestFitPacker(DocStream([s], seed=3, repeat=False), 33, 4, "crop")
    trained = {t for t in epoch_targets(packer) if t != BOS}
    assert len(trained) < sum(n - 1 for n in LENGTHS) and packer.stats.cropped > 0


def test_split_pieces_are_whole_rows_in_order(tmp_path):
    s = numbered_shard(tmp_path, [100])  # one document of 100 tokens, rows of 33
    packer = BestFitPacker(DocStream([s], seed=0), 33, 1, "split")
    rows = []
    for _ in range(3):
        row = np.empty(33, dtype=np.int64)
        packer.fill(row)
        rows.append(row)
    assert rows[0][0] == BOS and list(rows[0][1:]) == list(range(1, 33))
    assert list(rows[1]) == list(range(32, 65))  # starts on the last token of the piece before
    assert list(rows[2]) == list(range(64, 97))  # no BOS: a continuation
    assert packer.stats.split == 66 and packer.stats.split_rate == pytest.approx(66 / 99)


def mixture(a: Shard, b: Shard, long_docs: str) -> MixtureLoader:
    pa = BestFitPacker(DocStream([a], seed=1, label="a"), 33, 6, long_docs)
    pb = BestFitPacker(DocStream([b], seed=2, label="b"), 33, 6, long_docs)
    return MixtureLoader({"a": pa, "b": pb}, {"a": 0.7, "b": 0.3}, batch=4, seq_len=32)


def test_split_loader_state_restores_exact_sequence(tmp_path):
    rng = np.random.default_rng(1)
    a = numbered_shard(tmp_path, rng.integers(2, 120, size=60).tolist(), "a.bin")
    b = numbered_shard(tmp_path, rng.integers(2, 90, size=40).tolist(), "b.bin")
    first = mixture(a, b, "split")
    for _ in range(40):  # past an epoch boundary of both sources
        first.next_batch()
    state = json.loads(json.dumps(first.snapshot().state_dict()))  # what a checkpoint stores
    assert state["packers"]["a"]["pieces"] or any(
        len(e) > 4 for e in state["packers"]["a"]["buffer"]
    )
    expected = [first.next_batch()[0] for _ in range(15)]
    second = mixture(a, b, "split")
    second.load_state_dict(state)
    for want in expected:
        assert np.array_equal(second.next_batch()[0].numpy(), want.numpy())
    assert 0 < second.split_rate() < 1 and second.crop_rate() == 0
    assert "continue a split document" in second.snapshot().report()


def test_split_state_refused_by_crop_mode(tmp_path):
    a = numbered_shard(tmp_path, [100] * 10, "a.bin")
    b = numbered_shard(tmp_path, [100] * 10, "b.bin")
    first = mixture(a, b, "split")
    first.next_batch()
    with pytest.raises(DataError, match="long_docs=split"):
        mixture(a, b, "crop").load_state_dict(first.state_dict())


def test_long_docs_is_a_per_source_option(tmp_path):
    from conftest import make_corpus
    from littlelm.config import validate
    from littlelm.data.build import build_data
    from littlelm.schema import RunConfig

    text = str(make_corpus(tmp_path / "a.txt", 60))
    tree = {
        "tokenizer": {"name": "byte"},
        "sources": {
            "a": {"name": "text", "path": text, "split": "paragraph"},  # split, the default
            "b": {"name": "text", "path": text, "split": "paragraph", "long_docs": "crop"},
        },
        "buffer_docs": 8,
    }
    cfg = validate(RunConfig, {"data": tree}).data
    data = build_data(cfg, log=lambda _: None)
    key = [data.sources[k].directory.name.split("-", 1)[1] for k in "ab"]
    assert key[0] == key[1]  # the same cache key: long_docs is a loader option
    loader = data.loader(cfg, batch=4, seq_len=24, seed=0)
    for _ in range(20):
        loader.next_batch()
    a, b = loader.packers["a"].stats, loader.packers["b"].stats
    assert a.cropped == 0 and a.split > 0 and b.cropped > 0 and b.split == 0


def split_loader(shard: Shard, seed: int, buffer_docs: int, rank: int, world: int):
    """One source's split-mode loader for rank `rank` of `world` (rows of 33, batches of 2)."""
    stream = DocStream([shard], seed=seed, rank=rank, world=world, label="a")
    packer = BestFitPacker(stream, 33, buffer_docs, "split")
    return MixtureLoader({"a": packer}, {"a": 1.0}, batch=2, seq_len=32)


def test_split_state_survives_a_change_of_world_size(tmp_path):
    from littlelm.data.reshard import reshard

    a = numbered_shard(tmp_path, [100, 5, 70, 9, 40] * 8, "a.bin")

    def make(rank: int, world: int) -> MixtureLoader:
        return split_loader(a, 1, 4, rank, world)

    old = [make(r, 2) for r in range(2)]
    for loader in old:
        for _ in range(3):
            loader.next_batch()
    states = [json.loads(json.dumps(o.state_dict())) for o in old]
    assert any(s["packers"]["a"]["pieces"] for s in states)  # split pieces were waiting
    [new] = reshard(states, 1, make)
    waiting = {(e[2], e[3]) for s in states for e in s["packers"]["a"]["buffer"]}
    waiting |= {(q[1], q[2]) for s in states for q in s["packers"]["a"]["pieces"]}
    kept = {(e[2], e[3]) for e in new["packers"]["a"]["buffer"]}
    kept |= {(q[1], q[2]) for q in new["packers"]["a"]["pieces"]}
    assert kept and kept <= waiting  # documents read before the restart point stay, with offsets
    pieces = {(q[1], q[2], q[3]) for s in states for q in s["packers"]["a"]["pieces"]}
    assert {(q[1], q[2], q[3]) for q in new["packers"]["a"]["pieces"]} <= pieces
    loader = make(0, 1)
    loader.load_state_dict(new)
    for _ in range(5):
        loader.next_batch()


# -- the default became split: runs checkpointed before resume with their own packing ------------


def old_crop_state(loader: MixtureLoader) -> dict:
    """A loader state as littlelm wrote it before it recorded `long_docs` (crop: no pieces)."""
    state = json.loads(json.dumps(loader.state_dict()))
    for p in state["packers"].values():
        del p["long_docs"]
    return state


def test_an_old_crop_state_resumes_cropping_unless_the_config_says_otherwise(tmp_path):
    a = numbered_shard(tmp_path, [100] * 10, "a.bin")
    b = numbered_shard(tmp_path, [100] * 10, "b.bin")
    first = mixture(a, b, "crop")
    for _ in range(3):
        first.next_batch()
    state = old_crop_state(first)
    expected = [first.next_batch()[0].numpy() for _ in range(10)]
    # a config that does not name long_docs (the new default, split): the checkpoint's crop
    pa = BestFitPacker(DocStream([a], seed=1, label="a"), 33, 6, "split", explicit=False)
    pb = BestFitPacker(DocStream([b], seed=2, label="b"), 33, 6, "split", explicit=False)
    resumed = MixtureLoader({"a": pa, "b": pb}, {"a": 0.7, "b": 0.3}, 4, 32)
    with pytest.warns(UserWarning, match="resuming with long_docs=crop"):
        resumed.load_state_dict(state)
    for want in expected:
        assert np.array_equal(resumed.next_batch()[0].numpy(), want)
    assert resumed.state_dict()["packers"]["a"]["long_docs"] == "crop"  # and said so from now on
    # a config that names split: refused, naming the key
    with pytest.raises(DataError, match=r"data.sources.a.long_docs=crop"):
        mixture(a, b, "split").load_state_dict(state)


@pytest.mark.slow
@pytest.mark.parametrize("saved_config", ["crop", "absent"])
def test_a_run_checkpointed_with_crop_resumes_cropping(tiny_config, saved_config):
    """A run trained with crop before split became the default (its state.json without the
    loader's long_docs; its resolved config saying crop, or older still, not knowing the key)
    resumes under the same config, which does not name long_docs, cropping."""
    from littlelm.schema import load_run
    from littlelm.train.checkpoint import files as ckpt
    from littlelm.train.trainer import Trainer

    Trainer(load_run(tiny_config, ["data.sources.text.long_docs=crop"]), "never").fit(stop_after=3)
    path = ckpt.latest_checkpoint(load_run(tiny_config).run_dir() / "checkpoints")
    state = json.loads((path / "state.json").read_text())
    for p in state["loader"]["packers"].values():
        del p["long_docs"]
    if saved_config == "absent":
        del state["config"]["data"]["sources"]["text"]["long_docs"]
    (path / "state.json").write_text(json.dumps(state))
    cfg = load_run(tiny_config)
    assert cfg.data.sources["text"].long_docs == "split"  # the new default
    with pytest.warns(UserWarning, match="resuming with long_docs=crop"):
        trainer = Trainer(cfg)
    assert trainer.step == 3 and not trainer.loader.packers["text"].split
    assert trainer.fit()["step"] == 6


def test_a_long_document_waits_as_one_entry_not_one_per_row(tmp_path):
    """A document of 100,000 tokens in rows of 33: its whole-row pieces wait as one entry (the
    state, its snapshot and each checkpoint stay the buffer's size), and come out as before:
    each row starts on the last token of the one before."""
    s = numbered_shard(tmp_path, [100_000])
    packer = BestFitPacker(DocStream([s], seed=0), 33, 1, "split")
    rows = []
    for _ in range(5):
        row = np.empty(33, dtype=np.int64)
        packer.fill(row)
        rows.append(row)
    assert rows[0][0] == BOS and list(rows[0][1:]) == list(range(1, 33))
    for k in range(1, 5):
        assert list(rows[k]) == list(range(32 * k, 32 * k + 33))
    state = packer.state_dict()
    left = (100_000 - 2) // 32 - 5  # whole-row pieces not placed yet
    assert state["pieces"] == [[0, 0, 0, 5 * 32, left]]
    assert len(json.dumps(state)) < 500


def test_a_state_with_one_entry_per_piece_resumes_the_same(tmp_path):
    """A checkpoint written before pieces were counted ([arrival, shard, doc, offset] per
    piece) resumes with the same rows as one written now."""
    s = numbered_shard(tmp_path, [3000, 40, 2500, 7, 900, 12], "a.bin")

    def packer() -> BestFitPacker:
        return BestFitPacker(DocStream([s], seed=4), 33, 3, "split")

    first = packer()
    for _ in range(30):
        first.fill(np.empty(33, dtype=np.int64))
    state = json.loads(json.dumps(first.state_dict()))
    assert any(p[4] > 1 for p in state["pieces"])
    old = dict(state)
    old["pieces"] = [
        [q, sh, d, off + i * 32] for q, sh, d, off, count in state["pieces"] for i in range(count)
    ]
    resumed, before = packer(), packer()
    resumed.load_state_dict(old)
    before.load_state_dict(state)
    for _ in range(200):
        want, got, also = (np.empty(33, dtype=np.int64) for _ in range(3))
        first.fill(want)
        resumed.fill(got)
        before.fill(also)
        assert np.array_equal(want, got) and np.array_equal(want, also)


def test_a_long_document_reshards_mid_way_as_one_entry(tmp_path):
    """Changing the process count in the middle of long documents keeps each one's pieces as
    one counted entry, and resumes with the same rows as a state written one entry per piece."""
    from littlelm.data.reshard import reshard

    a = numbered_shard(tmp_path, [5000, 7, 3000, 12, 4000, 9, 60, 2500] * 2, "a.bin")

    def make(rank: int, world: int) -> MixtureLoader:
        return split_loader(a, 3, 3, rank, world)

    old = [make(r, 2) for r in range(2)]
    for loader in old:
        for _ in range(4):
            loader.next_batch()
    states = [json.loads(json.dumps(o.state_dict())) for o in old]
    counted = {tuple(q[1:]) for s in states for q in s["packers"]["a"]["pieces"]}
    assert any(q[3] > 10 for q in counted)  # documents stopped mid-way, many rows still to come
    per_piece = json.loads(json.dumps(states))  # the same states as older code wrote them
    for s in per_piece:
        p = s["packers"]["a"]
        p["pieces"] = [
            [q, sh, d, off + i * 32] for q, sh, d, off, n in p["pieces"] for i in range(n)
        ]
    for world in (1, 3):
        new = reshard(states, world, make)
        kept = {tuple(q[1:]) for s in new for q in s["packers"]["a"]["pieces"]}
        assert kept and kept <= counted  # whole entries, offsets and counts as they were
        assert all(len(s["packers"]["a"]["pieces"]) <= 3 for s in new)  # one per document
        older = reshard(per_piece, world, make)
        for rank in range(world):
            got, want = make(rank, world), make(rank, world)
            got.load_state_dict(new[rank])
            want.load_state_dict(older[rank])
            for _ in range(40):
                g, w = got.next_batch(), want.next_batch()
                assert all(torch.equal(x, y) for x, y in zip(g, w))
