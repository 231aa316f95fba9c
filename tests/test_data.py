from __future__ import annotations

import json
import os

import numpy as np
import pytest

from littlelm.data.loader import BestFitPacker, DataExhausted, DocStream, MixtureLoader, val_batches
from littlelm.data.shards import HEADER_SIZE, Shard, write_shard
from littlelm.data.sources import split_long
from littlelm.data.split import ValSplit, content_hash
from littlelm.data.tokenizer import BPEConfig, BPETokenizer, ByteTokenizer
from littlelm.data.tokenizers import load_tokenizer
from littlelm.errors import DataError

FP = "ab" * 32
BOS = 0


def docs_of(lengths, start=1):
    out, t = [], start
    for n in lengths:
        out.append(np.array([BOS, *range(t, t + n - 1)]) % 60000)
        t += n
    return out


def shard(tmp_path, lengths, name="s.bin"):
    d = docs_of(lengths)
    d = [np.concatenate([[BOS], x[1:] % 999 + 1]) for x in d]
    write_shard(tmp_path / name, d, 1000, BOS, FP)
    return Shard(tmp_path / name)


# -- tokenizers --------------------------------------------------------------------------------


def test_byte_tokenizer_round_trip_and_bytes():
    tok = ByteTokenizer()
    text = "héllo\nworld ✓"
    assert tok.decode(tok.encode(text)) == text
    assert tok.token_bytes()[tok.bos_id] == 0 and tok.token_bytes()[65] == 1


def test_bpe_trains_saves_loads(tmp_path):
    texts = ["def function(argument):\n    return argument + 1\n"] * 50 + [
        "hello world, the quick brown fox"
    ] * 50
    tok = BPETokenizer.train(BPEConfig(name="bpe", vocab_size=300, train_chars=10_000), iter(texts))
    assert tok.vocab_size == 300 and tok.bos_id == 0
    ids = tok.encode(texts[0])
    assert len(ids) < len(texts[0]) and tok.decode(ids) == texts[0]
    tb = tok.token_bytes()
    assert tb[tok.bos_id] == 0 and tb[ids].sum() == len(texts[0].encode())
    tok.save(tmp_path / "tok")
    again = load_tokenizer(tmp_path / "tok")
    assert again.fingerprint == tok.fingerprint and again.encode(texts[1]) == tok.encode(texts[1])


def test_tampered_tokenizer_is_refused(tmp_path):
    ByteTokenizer().save(tmp_path / "tok")
    meta = tmp_path / "tok" / "tokenizer_meta.json"
    meta.write_text(meta.read_text().replace('"fingerprint": "', '"fingerprint": "00'))
    with pytest.raises(DataError, match="fingerprint"):
        load_tokenizer(tmp_path / "tok")


# -- shards ------------------------------------------------------------------------------------


def test_shard_round_trip(tmp_path):
    s = shard(tmp_path, [3, 5, 2])
    assert len(s) == 3 and s.header.n_tokens == 10 and s.header.fingerprint == FP
    assert list(s.lengths()) == [3, 5, 2] and s.doc(1)[0] == BOS


def test_truncated_shard_names_file_and_fix(tmp_path):
    s = shard(tmp_path, [3, 5, 2])
    path = s.path
    del s
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 8)
    with pytest.raises(DataError, match=r"s\.bin is truncated.*littlelm data prepare"):
        Shard(path)


def test_corrupt_shard_fails_checksum(tmp_path):
    path = shard(tmp_path, [3, 5, 2]).path
    data = bytearray(path.read_bytes())
    data[HEADER_SIZE + 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match="checksum mismatch"):
        Shard(path)
    Shard(path, verify=False)  # size is still right: only the checksum can tell


def test_not_a_shard_and_newer_version(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"hello" * 100)
    with pytest.raises(DataError, match="not a littlelm shard"):
        Shard(tmp_path / "x.bin")
    path = shard(tmp_path, [3]).path
    data = bytearray(path.read_bytes())
    data[8] = 99  # format version
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match="newer than this littlelm"):
        Shard(path)


def test_writer_never_leaves_a_complete_looking_partial_file(tmp_path):
    from littlelm.data.shards import ShardWriter

    w = ShardWriter(tmp_path / "p.bin", 1000, BOS, FP)
    w.add(np.array([BOS, 1, 2]))
    assert not (tmp_path / "p.bin").exists()  # only p.bin.tmp until close()
    w.abort()
    assert not list(tmp_path.iterdir())


# -- packing -----------------------------------------------------------------------------------


def test_rows_start_with_bos_and_best_fit_has_no_padding(tmp_path):
    rng = np.random.default_rng(0)
    s = shard(tmp_path, rng.integers(2, 40, size=300).tolist())
    packer = BestFitPacker(DocStream([s], seed=0), row_len=65, buffer_docs=50)
    row = np.empty(65, dtype=np.int64)
    for _ in range(100):
        row[:] = -1
        packer.fill(row)
        assert row[0] == BOS and (row >= 0).all()
    assert packer.stats.crop_rate < 0.05  # short documents: almost nothing is cropped


def test_best_fit_picks_largest_that_fits(tmp_path):
    s = shard(tmp_path, [10, 6, 4, 3])
    packer = BestFitPacker(DocStream([s], seed=0), row_len=13, buffer_docs=4)
    row = np.empty(13, dtype=np.int64)
    packer.fill(row)
    starts = np.flatnonzero(row == BOS)
    lengths = np.diff([*starts, 13]).tolist()
    assert lengths == [10, 3]  # 10 fits first, then the largest that fits the 3 left
    assert packer.stats.cropped == 0


def test_crop_when_nothing_fits(tmp_path):
    s = shard(tmp_path, [20, 20])
    packer = BestFitPacker(DocStream([s], seed=0), row_len=8, buffer_docs=2)
    row = np.empty(8, dtype=np.int64)
    packer.fill(row)
    assert packer.stats.cropped == 12 and row[0] == BOS


def test_loader_state_restores_exact_sequence(tmp_path):
    rng = np.random.default_rng(1)
    a = shard(tmp_path, rng.integers(2, 30, size=200).tolist(), "a.bin")
    b = shard(tmp_path, rng.integers(2, 30, size=150).tolist(), "b.bin")

    def make():
        pa = BestFitPacker(DocStream([a], seed=1, label="a"), 33, 20)
        pb = BestFitPacker(DocStream([b], seed=2, label="b"), 33, 20)
        return MixtureLoader({"a": pa, "b": pb}, {"a": 0.7, "b": 0.3}, batch=4, seq_len=32)

    first = make()
    for _ in range(30):  # past an epoch boundary of both sources
        first.next_batch()
    state = first.state_dict()
    expected = [first.next_batch()[0] for _ in range(10)]
    second = make()
    second.load_state_dict(state)
    for want in expected:
        assert np.array_equal(second.next_batch()[0].numpy(), want.numpy())


def test_mixture_proportions_follow_weights(tmp_path):
    a = shard(tmp_path, [8] * 50, "a.bin")
    b = shard(tmp_path, [8] * 50, "b.bin")
    c = shard(tmp_path, [8] * 50, "c.bin")
    packers = {
        k: BestFitPacker(DocStream([s], seed=i, label=k), 17, 8)
        for i, (k, s) in enumerate(zip("abc", (a, b, c)))
    }
    mix = MixtureLoader(packers, {"a": 0.6, "b": 0.3, "c": 0.1}, batch=10, seq_len=16)
    for _ in range(100):
        mix.next_batch()
    p = mix.proportions()
    assert abs(p["a"] - 0.6) < 0.01 and abs(p["b"] - 0.3) < 0.01 and abs(p["c"] - 0.1) < 0.01


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_read_disjoint_slices_covering_everything(tmp_path, world):
    shards = [shard(tmp_path, [3] * n, f"{i}.bin") for i, n in enumerate([13, 7, 10])]
    seen = []
    for rank in range(world):
        stream = DocStream(shards, seed=5, rank=rank, world=world, repeat=False)
        while True:
            try:
                seen.append(stream.next())
            except DataExhausted:
                break
    assert len(seen) == len(set(seen)) == 30


def test_exhausted_source_stops_with_message(tmp_path):
    stream = DocStream([shard(tmp_path, [3, 3])], seed=0, repeat=False, label="web")
    stream.next(), stream.next()
    with pytest.raises(DataExhausted, match="'web' is exhausted.*on_exhausted=repeat"):
        stream.next()


def test_val_batches_cover_every_token_once(tmp_path):
    s = shard(tmp_path, [5, 7, 9])  # 21 tokens
    batches = list(val_batches([s], batch=2, seq_len=4))
    ys = np.concatenate([y.numpy().ravel() for _, y in batches])
    assert len(ys) == 20 and np.array_equal(ys, np.asarray(s.tokens[1:21], dtype=np.int64))


# -- splits and sources ------------------------------------------------------------------------


def test_val_split_modes():
    h = ValSplit(0.1, "hash", seed=0)
    share = sum(h.is_val(0, f"doc {i}".encode()) for i in range(20000)) / 20000
    assert abs(share - 0.1) < 0.01
    assert h.is_val(0, b"same text") == h.is_val(999, b"same text")  # by content, not position
    t = ValSplit(0.1, "tail", seed=0, n_pieces=100)
    assert [i for i in range(100) if t.is_val(i, b"x")] == list(range(90, 100))
    assert content_hash(b"a", 0) == content_hash(b"a", 0) != content_hash(b"a", 1)
    assert not any(ValSplit(0.0, "hash", 0).is_val(i, bytes([i])) for i in range(100))


def test_split_long_keeps_text_and_limit():
    text = "\n\n".join(f"line {i} " * (i % 7 + 1) for i in range(200))
    pieces = list(split_long(text, 100))
    assert all(len(p) <= 100 for p in pieces)
    assert "".join(pieces).replace("\n", "") == (text + "\n\n").replace("\n", "")


# -- mixtures at scale -------------------------------------------------------------------------

WEIGHTS = {"web": 0.6, "math": 0.15, "pubmed": 0.15, "code": 0.1}


def four_sources(tmp_path, seed=0, repeat=True, buffer_docs=16, row_len=33):
    rng = np.random.default_rng(seed)
    packers = {}
    for i, label in enumerate(WEIGHTS):
        lengths = rng.integers(2, 3 * row_len, size=40 + 30 * i).tolist()
        s = shard(tmp_path, lengths, f"{label}.bin")
        stream = DocStream([s], seed=i, repeat=repeat, label=label)
        packers[label] = BestFitPacker(stream, row_len, buffer_docs)
    return packers


def test_realised_proportions_within_one_percent_over_10000_rows(tmp_path):
    mix = MixtureLoader(four_sources(tmp_path), WEIGHTS, batch=100, seq_len=32)
    for n in range(100):
        mix.next_batch()
        rows = (n + 1) * 100
        for k, p in mix.proportions().items():
            assert abs(p - WEIGHTS[k]) <= 1 / rows + 1e-12  # within one row, at every batch
    assert sum(mix.rows) == 10_000
    assert all(abs(p - WEIGHTS[k]) < 0.01 for k, p in mix.proportions().items())
    assert 0 < mix.crop_rate() < 1


def test_resume_is_exact_across_a_four_source_mixture(tmp_path):
    first = MixtureLoader(four_sources(tmp_path), WEIGHTS, batch=8, seq_len=32)
    for _ in range(200):  # every source past at least one epoch boundary
        first.next_batch()
    epochs = [p.stream.epoch for p in first.packers.values()]
    assert min(epochs) >= 1
    snap = first.snapshot()
    state = json.loads(json.dumps(snap.state_dict()))  # what a checkpoint stores
    expected = [first.next_batch()[0].numpy() for _ in range(20)]
    second = MixtureLoader(four_sources(tmp_path), WEIGHTS, batch=8, seq_len=32)
    second.load_state_dict(state)
    assert second.snapshot().proportions() == snap.proportions()
    for want in expected:
        assert np.array_equal(second.next_batch()[0].numpy(), want)


def test_mixture_stop_policy_names_the_exhausted_source(tmp_path):
    mix = MixtureLoader(four_sources(tmp_path, repeat=False), WEIGHTS, batch=8, seq_len=32)
    with pytest.raises(DataExhausted, match=r"source 'web' is exhausted after 1 epoch"):
        for _ in range(1000):
            mix.next_batch()


@pytest.mark.parametrize("world", [2, 4])
def test_run_loader_ranks_split_every_source(tmp_path, world):
    from littlelm.data.build import DataConfig, PreparedSource, RunData

    sources = {}
    for i, label in enumerate(("a", "b")):
        shards = [shard(tmp_path, [3] * n, f"{label}{j}.bin") for j, n in enumerate([11, 6 + i])]
        sources[label] = PreparedSource(label, 1.0, tmp_path, shards, [])
    data = RunData(ByteTokenizer(), sources)
    cfg = DataConfig(on_exhausted="stop")
    seen = {label: [] for label in sources}
    for rank in range(world):
        loader = data.loader(cfg, batch=2, seq_len=8, seed=3, rank=rank, world=world)
        for label, packer in loader.packers.items():
            while True:
                try:
                    s, d, _, _ = packer.stream.next()
                except DataExhausted:
                    break
                seen[label].append((s, d))
    for label, src in sources.items():
        total = sum(len(s) for s in src.train)
        assert len(seen[label]) == len(set(seen[label])) == total  # disjoint, nothing lost


def test_snapshot_state_equals_state_dict(tmp_path):
    mix = MixtureLoader(four_sources(tmp_path), WEIGHTS, batch=4, seq_len=32)
    mix.next_batch()
    snap = mix.snapshot()
    assert snap.state_dict() == mix.state_dict()
    mix.next_batch()  # the snapshot is a copy: later batches do not change it
    assert snap.state_dict() != mix.state_dict()
