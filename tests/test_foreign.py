"""Token files other tools wrote (data/foreign.py): nanoGPT / llm.c .bin, plain arrays, Megatron
indexed datasets and parquet token lists, trained on like littlelm's own shards."""

from __future__ import annotations

import json
import shlex
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import SHARED, tiny_tree, write_config
from littlelm.cli import main
from littlelm.data.foreign import TokenFiles, TokensConfig
from littlelm.data.loader import BestFitPacker, DocStream, MixtureLoader
from littlelm.data.shards import Shard, write_shard
from littlelm.data.tokenizer import ByteTokenizer
from littlelm.errors import DataError

TOK = ByteTokenizer()  # vocabulary 257, BOS 256
BOS = TOK.bos_id
GPT2 = SHARED / "data" / "tokenizers" / "gpt2.tiktoken"


def documents(n: int = 300, seed: int = 0, longest: int = 90) -> list[np.ndarray]:
    """Documents' tokens (no BOS), lengths 1..longest, ids below BOS."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, BOS, rng.integers(1, longest)) for _ in range(n)]


def with_bos(docs: list[np.ndarray]) -> list[np.ndarray]:
    return [np.concatenate([[BOS], d]) for d in docs]


# -- writers of each format (what the other tools write) -----------------------------------------


# llm.c's dev/data/data_common.py header values: model_desc -> (magic, version, token dtype)
LLMC_HEADERS = {"gpt-2": (20240520, 1, "<u2"), "llama-3": (20240801, 7, "<u4")}


def write_nanogpt(path: Path, tokens: np.ndarray, model_desc: str = "gpt-2") -> Path:
    """The layout of llm.c's write_datafile: 256 int32 (magic, version, count, zeros), then the
    tokens as uint16 ("gpt-2") or uint32 ("llama-3")."""
    magic, version, dtype = LLMC_HEADERS[model_desc]
    header = np.zeros(256, "<i4")
    header[:3] = [magic, version, len(tokens)]
    path.write_bytes(header.tobytes() + np.asarray(tokens).astype(dtype).tobytes())
    return path


def write_megatron(prefix: Path, docs: list[np.ndarray], code: int = 8) -> Path:
    """Megatron's _IndexWriter layout: .bin the tokens back to back, .idx the index."""
    dtype = {8: "<u2", 4: "<i4"}[code]
    lengths = np.array([len(d) for d in docs], "<i4")
    pointers = (np.concatenate([[0], np.cumsum(lengths)[:-1]]) * np.dtype(dtype).itemsize).astype(
        "<i8"
    )
    doc_idx = np.arange(len(docs) + 1, dtype="<i8")  # one sequence a document
    Path(str(prefix) + ".bin").write_bytes(np.concatenate(docs).astype(dtype).tobytes())
    head = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(docs), len(doc_idx))
    Path(str(prefix) + ".idx").write_bytes(
        head + lengths.tobytes() + pointers.tobytes() + doc_idx.tobytes()
    )
    return prefix


def write_parquet(path: Path, docs: list[np.ndarray], row_group: int = 50) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"input_ids": [d.tolist() for d in docs], "text": ["x"] * len(docs)})
    pq.write_table(table, path, row_group_size=row_group)
    return path


def foreign_files(tmp_path: Path, fmt: str, docs: list[np.ndarray]) -> dict:
    """The documents written in `fmt` as its tool would; the source's config."""
    d = tmp_path / fmt
    d.mkdir()
    if fmt == "nanogpt":  # llm.c's fineweb.py: <|endoftext|> before every document
        write_nanogpt(d / "shard_000000.bin", np.concatenate(with_bos(docs)))
        return {"format": "nanogpt", "path": str(d)}
    if fmt == "array-bin":  # nanoGPT's openwebtext prepare.py: the separator after each one
        tokens = np.concatenate([np.concatenate([x, [BOS]]) for x in docs]).astype("<u2")
        (d / "train.bin").write_bytes(tokens.tobytes())
        return {"format": "array", "path": str(d / "train.bin"), "dtype": "uint16"}
    if fmt == "array-npy":  # uint32, another separator id (it becomes BOS)
        sep = 7
        kept = [np.where(x == sep, 8, x) for x in docs]  # the separator occurs only between
        docs[:] = kept
        tokens = np.concatenate([np.concatenate([[sep], x]) for x in kept]).astype("<u4")
        np.save(d / "tokens.npy", tokens)
        return {"format": "array", "path": str(d), "separator": sep}
    if fmt == "megatron":
        write_megatron(d / "corpus_text_document", docs)
        return {"format": "megatron", "path": str(d / "corpus_text_document")}
    if fmt == "parquet":
        write_parquet(d / "part-0.parquet", docs)
        return {"format": "parquet", "path": str(d)}
    raise AssertionError(fmt)


FORMATS = ["nanogpt", "array-bin", "array-npy", "megatron", "parquet"]


def open_source(cfg: dict, tmp_path: Path, val_fraction: float = 0.0, log=print):
    src = TokenFiles(TokensConfig(name="tokens", **cfg), "x")
    return src.open(TOK, val_fraction, tmp_path / "cache", log)


def loader(shards: list, long_docs: str, seed: int = 5) -> MixtureLoader:
    packer = BestFitPacker(DocStream(shards, seed, label="x"), 65, 24, long_docs)
    return MixtureLoader({"x": packer}, {"x": 1.0}, 4, 64)


@pytest.mark.parametrize("long_docs", ["crop", "split"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_gives_the_rows_of_littlelm_shards(tmp_path, fmt, long_docs):
    docs = documents(longest=150)
    cfg = foreign_files(tmp_path, fmt, docs)  # may remap ids (array-npy's separator)
    write_shard(tmp_path / "ours.bin", with_bos(docs), TOK.vocab_size, BOS, TOK.fingerprint)
    train, val, summary = open_source(cfg, tmp_path)
    assert summary["documents"] == len(docs) and not val
    ours, theirs = loader([Shard(tmp_path / "ours.bin")], long_docs), loader(train, long_docs)
    for _ in range(40):  # past an epoch: the same order, packing, and BOS at each document
        assert np.array_equal(ours.next_batch()[0].numpy(), theirs.next_batch()[0].numpy())
    # and resumable mid-shard exactly as littlelm's: a fresh loader from the state goes on alike
    state = json.loads(json.dumps(theirs.state_dict()))
    again = loader(open_source(cfg, tmp_path)[0], long_docs)
    again.load_state_dict(state)
    for _ in range(10):
        assert np.array_equal(ours.next_batch()[0].numpy(), again.next_batch()[0].numpy())


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_mixture_with_littlelm_shards_realises_its_weights(tmp_path, fmt):
    """Over 1M tokens, the foreign source's and the littlelm source's token shares are within
    2% of the weights (0.7 / 0.3)."""
    docs = documents(2000, seed=1)
    cfg = foreign_files(tmp_path, fmt, docs)
    write_shard(tmp_path / "ours.bin", with_bos(documents(500, 2)), 257, BOS, TOK.fingerprint)
    train, _, _ = open_source(cfg, tmp_path)
    packers = {
        "theirs": BestFitPacker(DocStream(train, 1, label="theirs"), 257, 64),
        "ours": BestFitPacker(DocStream([Shard(tmp_path / "ours.bin")], 2, label="ours"), 257, 64),
    }
    mix = MixtureLoader(packers, {"theirs": 0.7, "ours": 0.3}, 16, 256)
    tokens = 0
    while tokens < 1_000_000:
        x, _ = mix.next_batch()
        tokens += x.numel()
    shares = mix.proportions()
    assert abs(shares["theirs"] - 0.7) < 0.02 * 0.7 and abs(shares["ours"] - 0.3) < 0.02 * 0.3


def test_llmc_uint32_shards_read_as_their_uint16_twins(tmp_path):
    """llm.c's llama-3 files (magic 20240801, version 7, uint32 tokens) give the documents and
    batches of the same tokens in its gpt-2 files (20240520, version 1, uint16)."""
    docs = documents(200, longest=150)
    (tmp_path / "u16").mkdir()
    (tmp_path / "u32").mkdir()
    write_nanogpt(tmp_path / "u16" / "a.bin", np.concatenate(with_bos(docs)), "gpt-2")
    write_nanogpt(tmp_path / "u32" / "a.bin", np.concatenate(with_bos(docs)), "llama-3")
    (narrow, *_), (wide, *_) = (
        open_source({"format": "nanogpt", "path": str(tmp_path / d)}, tmp_path / d)
        for d in ("u16", "u32")
    )
    assert wide[0].tokens.dtype == np.uint32 and narrow[0].tokens.dtype == np.uint16
    assert [wide[0].doc(i).tolist() for i in range(len(wide[0]))] == [
        narrow[0].doc(i).tolist() for i in range(len(narrow[0]))
    ]
    a, b = loader(narrow, "split"), loader(wide, "split")
    for _ in range(20):
        assert np.array_equal(a.next_batch()[0].numpy(), b.next_batch()[0].numpy())


def test_an_unknown_header_names_its_values_and_a_fix_that_works(tmp_path, capsys):
    tokens = np.concatenate(with_bos(documents(30)))
    p = write_nanogpt(tmp_path / "a.bin", tokens)
    p.write_bytes(np.array([20240999, 3], "<i4").tobytes() + p.read_bytes()[8:])
    with pytest.raises(DataError) as e:
        open_source({"format": "nanogpt", "path": str(p)}, tmp_path)
    message = str(e.value)
    assert "magic 20240999, version 3" in message and "20240801 version 7" in message
    fix = shlex.split(message[message.index("`python -c") + 1 : message.rindex("`")])
    subprocess.run([sys.executable, *fix[1:]], check=True)  # the advice, followed as given
    train, _, _ = open_source({"format": "nanogpt", "path": str(p)}, tmp_path)
    assert [train[0].doc(i).tolist() for i in range(len(train[0]))] == [
        d.tolist() for d in with_bos(documents(30))
    ]
    # data inspect, which guesses the format, says the same of an unknown header
    p.write_bytes(np.array([20240999, 3], "<i4").tobytes() + p.read_bytes()[8:])
    assert main(["data", "inspect", str(p)]) == 2
    assert "magic 20240999, version 3" in capsys.readouterr().err
    # a file with no header at all: the advice is format: array, not a header rewrite
    q = tmp_path / "plain.bin"
    q.write_bytes(tokens.astype("<u2").tobytes()[:-2])
    with pytest.raises(DataError, match="format: array"):
        open_source({"format": "nanogpt", "path": str(q)}, tmp_path)


def test_documents_are_bos_plus_tokens_and_val_is_the_tail(tmp_path):
    docs = documents(100)
    write_nanogpt(tmp_path / "a.bin", np.concatenate([docs[0], *with_bos(docs[1:]), [BOS]]))
    train, val, summary = open_source(
        {"format": "nanogpt", "path": str(tmp_path / "a.bin")}, tmp_path, 0.1
    )
    got = [train[0].doc(i) for i in range(len(train[0]))] + [
        val[0].doc(i) for i in range(len(val[0]))
    ]
    # the tokens before the first separator are a document; the trailing separator is dropped
    assert [d.tolist() for d in got] == [d.tolist() for d in with_bos(docs)]
    assert 5 <= len(val[0]) <= 15  # about the last 10% of the tokens
    assert np.array_equal(val[0].head(None), np.concatenate(with_bos(docs[len(train[0]) :])))
    assert summary["max_id"] == BOS and summary["separator_in"] == 1


def test_the_index_is_cached_and_the_tokens_memory_mapped(tmp_path):
    docs = documents(50)
    cfg = foreign_files(tmp_path, "nanogpt", docs)
    open_source(cfg, tmp_path)
    cached = sorted((tmp_path / "cache" / "token-index").iterdir())
    assert [p.suffix for p in cached] == [".index"]  # the figures and the index, one file
    train, _, _ = open_source(cfg, tmp_path)  # from the index
    assert (
        isinstance(train[0].tokens.base, (np.memmap, memoryview))
        or train[0].tokens.base is not None
    )
    assert not train[0].tokens.flags.owndata and not train[0].tokens.flags.writeable


def test_a_separator_that_never_occurs_is_a_warning_naming_the_file(tmp_path):
    write_nanogpt(tmp_path / "a.bin", np.arange(100) % 200)
    said = []
    train, _, _ = open_source(
        {"format": "nanogpt", "path": str(tmp_path)}, tmp_path, log=said.append
    )
    assert len(said) == 1 and "a.bin" in said[0] and "separator 256 never occurs" in said[0]
    assert len(train[0]) == 1  # one document


def test_a_token_beyond_the_vocabulary_names_the_file_and_offset(tmp_path):
    tokens = np.concatenate(with_bos(documents(20)))
    tokens[37] = 300
    write_nanogpt(tmp_path / "a.bin", tokens)
    with pytest.raises(DataError, match=r"a\.bin: token id 300 at token offset 37 \(byte 1,098\)"):
        open_source({"format": "nanogpt", "path": str(tmp_path)}, tmp_path)


# -- bad input through the CLI: rc 2, the file named, nothing trained ---------------------------


def bad_nanogpt_truncated(d: Path) -> Path:
    p = write_nanogpt(d / "a.bin", np.concatenate(with_bos(documents(20))))
    p.write_bytes(p.read_bytes()[:-10])
    return p


def bad_wrong_magic(d: Path) -> Path:
    p = write_nanogpt(d / "a.bin", np.concatenate(with_bos(documents(20))))
    p.write_bytes(b"\x01\x02\x03\x04" + p.read_bytes()[4:])
    return p


def bad_odd_bytes(d: Path) -> Path:
    p = d / "a.bin"
    p.write_bytes(np.concatenate(with_bos(documents(20))).astype("<u2").tobytes() + b"\x00")
    return p


def bad_beyond_vocab(d: Path) -> Path:
    tokens = np.concatenate(with_bos(documents(20)))
    tokens[5] = 9999
    return write_nanogpt(d / "a.bin", tokens)


def bad_empty(d: Path) -> Path:
    p = d / "a.bin"
    p.write_bytes(b"")
    return p


def bad_mixed(d: Path) -> Path:
    write_nanogpt(d / "a.bin", np.concatenate(with_bos(documents(20))))
    p = d / "b.npy"
    np.save(p, np.concatenate(with_bos(documents(20))).astype(np.uint16))
    return p


def bad_megatron_truncated(d: Path) -> Path:
    write_megatron(d / "c_text_document", documents(20))
    p = d / "c_text_document.bin"
    p.write_bytes(p.read_bytes()[:-4])
    return p


BAD = {
    "truncated": (bad_nanogpt_truncated, "nanogpt", "truncated"),
    "wrong-magic": (bad_wrong_magic, "nanogpt", "header magic 67305985, version 1"),
    "odd-byte-count": (bad_odd_bytes, "array", "not a whole number of uint16"),
    "beyond-vocab": (bad_beyond_vocab, "nanogpt", "token id 9999 at token offset 5"),
    "empty": (bad_empty, "nanogpt", "is empty"),
    "mixed-directory": (bad_mixed, "nanogpt", "mixed formats"),
    "megatron-truncated": (bad_megatron_truncated, "megatron", "truncated"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_token_files_stop_before_training(tmp_path, capsys, case):
    make, fmt, expected = BAD[case]
    d = tmp_path / "tokens"
    d.mkdir()
    named = make(d)
    source = {"name": "tokens", "format": fmt, "path": str(d), "dtype": "uint16"}
    tree = tiny_tree(tmp_path / "unused.txt", tmp_path / "runs", train={"max_steps": 2})
    tree["data"]["sources"] = {"theirs": source}
    code = main(["train", str(write_config(tmp_path / "run.yaml", tree))])
    err = capsys.readouterr().err
    assert code == 2, err
    assert expected in err and str(named) in err and "Traceback" not in err
    assert not (tmp_path / "runs" / "tiny" / "checkpoints").exists()  # nothing trained


def test_a_trained_tokenizer_is_refused_for_token_files(tmp_path, capsys):
    cfg = foreign_files(tmp_path, "nanogpt", documents(20))
    tree = tiny_tree(tmp_path / "unused.txt", tmp_path / "runs")
    tree["data"]["tokenizer"] = {"name": "bpe"}
    tree["data"]["sources"] = {"theirs": {"name": "tokens", **cfg}}
    assert main(["train", str(write_config(tmp_path / "run.yaml", tree))]) == 2
    assert "declare that tokenizer" in capsys.readouterr().err


# -- through `littlelm train` and `littlelm data inspect` -----------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [*FORMATS, "mixture"])
def test_three_steps_from_each_format(tmp_path, corpus, capsys, fmt):
    tree = tiny_tree(corpus, tmp_path / "runs", train={"max_steps": 3}, eval={"every": 3})
    docs = documents(400, longest=60)
    cfg = foreign_files(tmp_path, "nanogpt" if fmt == "mixture" else fmt, docs)
    sources = {"theirs": {"name": "tokens", **cfg, "weight": 0.75}}
    if fmt == "mixture":  # with a littlelm source (the corpus, prepared as usual)
        sources["text"] = {**tree["data"]["sources"]["text"], "weight": 0.25}
    tree["data"]["sources"] = sources
    tree["data"]["val_fraction"] = 0.2
    assert main(["train", str(write_config(tmp_path / "run.yaml", tree))]) == 0
    out = capsys.readouterr().out
    assert "done: 3 steps" in out, out
    if fmt == "mixture":  # 12 rows: 9 and 3
        assert "text 0.250 (target 0.250), theirs 0.750 (target 0.750)" in out, out
    lines = (tmp_path / "runs/tiny/metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(line) for line in lines]
    assert any("val_loss" in m and np.isfinite(m["val_loss"]) for m in metrics)


def test_crop_packing_of_token_files_warns_what_it_drops(tmp_path, corpus, capsys):
    """long_docs: crop on a `tokens` source: the start-up warning reads the token files' document
    lengths as it does a littlelm shard's (it once read shard offsets, which they lack)."""
    tree = tiny_tree(corpus, tmp_path / "runs", train={"max_steps": 1}, eval={"every": 0})
    tree["eval"]["at_end"] = False
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, BOS, 299) for _ in range(40)]  # each 300 with its BOS, rows are 33
    cfg = foreign_files(tmp_path, "nanogpt", docs)
    tree["data"]["sources"] = {"theirs": {"name": "tokens", **cfg, "long_docs": "crop"}}
    assert main(["train", str(write_config(tmp_path / "run.yaml", tree))]) == 0
    out = capsys.readouterr().out
    assert f"data.sources.theirs drops {(300 - 33) / 300:.1%}" in out, out
    assert "done: 1 steps" in out, out


def test_data_inspect_describes_token_files(tmp_path, capsys):
    docs = documents(30)
    (tmp_path / "n").mkdir()
    write_nanogpt(tmp_path / "n" / "a.bin", np.concatenate(with_bos(docs)))
    assert main(["data", "inspect", str(tmp_path / "n"), "--separator", str(BOS)]) == 0
    out = capsys.readouterr().out
    assert "nanogpt token files: 1 file(s)" in out and f"{len(docs)} documents" in out
    assert f"separator {BOS}: found in 1 of 1 file(s)" in out and "token ids: 0..256" in out
    write_megatron(tmp_path / "m", docs)
    assert main(["data", "inspect", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert "megatron token files" in out and "documents: from the index" in out
    (tmp_path / "raw.bin").write_bytes(np.zeros(10, "<u2").tobytes())
    assert main(["data", "inspect", str(tmp_path / "raw.bin")]) == 2
    assert "--format array --dtype" in capsys.readouterr().err


@pytest.mark.skipif(not GPT2.is_file(), reason="shared gpt2.tiktoken not present")
def test_gpt2_nanogpt_shards_train_like_prepared_text(tmp_path, corpus):
    """Text prepared into littlelm shards with tiktoken gpt2 and the same tokens written as
    llm.c does (<|endoftext|> 50256 before each document) give the same rows."""
    from littlelm.config import validate
    from littlelm.data.build import DataConfig, build_data

    tok = {"name": "tiktoken", "encoding": "gpt2", "file": str(GPT2)}
    text = {"name": "text", "path": str(corpus), "split": "paragraph"}
    ours = build_data(
        validate(DataConfig, {"tokenizer": tok, "sources": {"x": text}, "val_fraction": 0}),
        log=lambda *a: None,
    )
    shard = ours.sources["x"].train[0]
    assert shard.bos == 50256
    write_nanogpt(tmp_path / "fineweb_train_000000.bin", shard.tokens)
    theirs = build_data(
        validate(
            DataConfig,
            {
                "tokenizer": tok,
                "sources": {
                    "x": {
                        "name": "tokens",
                        "format": "nanogpt",
                        "path": str(tmp_path / "fineweb_train_000000.bin"),
                    }
                },
                "val_fraction": 0,
            },
        ),
        log=lambda *a: None,
    )
    cfg = validate(DataConfig, {"sources": {}})
    a, b = ours.loader(cfg, 4, 32, 3), theirs.loader(cfg, 4, 32, 3)
    for _ in range(20):
        assert np.array_equal(a.next_batch()[0].numpy(), b.next_batch()[0].numpy())


def test_yaml_example_in_docs_validates():
    """docs/data.md's token-shard examples are configs this littlelm accepts."""
    text = Path(__file__).resolve().parents[1].joinpath("docs/data.md").read_text()
    block = (
        text.split("## I already have token shards", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    )
    tree = yaml.safe_load(block)
    for src in tree["data"]["sources"].values():
        TokensConfig(**src)
