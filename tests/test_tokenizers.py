"""Tokenizers: tiktoken (local file, cache), Hugging Face tokenizer.json, saved, encode_docs."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from conftest import SHARED, write_config
from littlelm.cli import main
from littlelm.data.chat import CHAT_TOKENS
from littlelm.data.tiktoken_tokenizer import TiktokenConfig, TiktokenTokenizer
from littlelm.data.tokenizer import (
    MAX_RUN,
    BPEConfig,
    BPETokenizer,
    ByteTokenizer,
    HuggingFaceConfig,
    HuggingFaceJSON,
    Sample,
)
from littlelm.data.tokenizers import SavedConfig, SavedTokenizer, load_tokenizer, vocab_size_of
from littlelm.errors import DataError

GPT2 = SHARED / "data" / "tokenizers" / "gpt2.tiktoken"
needs_gpt2 = pytest.mark.skipif(not GPT2.is_file(), reason="shared gpt2.tiktoken not present")
TEXT = "héllo wörld ✓ — naïve café 日本語 def f(x):\n    return x\n"


@pytest.fixture(scope="module")
def bpe():
    texts = [TEXT * 3, "the quick brown fox jumps over the lazy dog " * 20] * 20
    return BPETokenizer.train(
        BPEConfig(name="bpe", vocab_size=320, train_chars=20_000), iter(texts)
    )


def gpt2_config(**kw) -> TiktokenConfig:
    return TiktokenConfig(name="tiktoken", encoding="gpt2", file=str(GPT2), **kw)


@needs_gpt2
def test_tiktoken_from_local_file(tmp_path):
    tok = TiktokenTokenizer.from_config(gpt2_config())
    assert tok.vocab_size == 50257 and tok.bos_id == 50256
    assert tok.encode("hello world") == [31373, 995]  # GPT-2's ids
    assert tok.decode(tok.encode(TEXT)) == TEXT
    ids = tok.encode(TEXT)
    assert tok.token_bytes()[ids].sum() == len(TEXT.encode())  # partial-character tokens too
    tok.save(tmp_path / "tok")
    again = load_tokenizer(tmp_path / "tok")
    assert again.fingerprint == tok.fingerprint and again.encode(TEXT) == ids
    assert vocab_size_of(gpt2_config()) == 50257


@needs_gpt2
def test_tiktoken_from_its_cache_matches_the_file(tmp_path, monkeypatch):
    shutil.copy(GPT2, tmp_path / "0ea1e91bbb3a60f729a8dc8f777fd2fc07cd8df4")  # sha1 of its URL
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    cached = TiktokenTokenizer.from_config(TiktokenConfig(name="tiktoken", encoding="r50k_base"))
    assert cached.fingerprint == TiktokenTokenizer.from_config(gpt2_config()).fingerprint


@needs_gpt2
@pytest.mark.parametrize(
    "kw, message",
    [
        ({"encoding": "cl100k_base"}, "is not the cl100k_base ranks file"),
        ({"encoding": "gpt5"}, "unknown tiktoken encoding 'gpt5'"),
        ({"file": "/nonexistent.tiktoken"}, "no such file"),
        ({"bos_token": "<|bos|>"}, r"no special token '<\|bos\|>'.*<\|endoftext\|>"),
    ],
)
def test_tiktoken_errors_are_clear(kw, message):
    cfg = gpt2_config().model_copy(update=kw)
    with pytest.raises(DataError, match=message):
        TiktokenTokenizer.from_config(cfg)


def test_tiktoken_encoding_made_here_round_trips(tmp_path):
    """Without the shared file: a small tiktoken encoding saved and loaded by littlelm."""
    import tiktoken

    ranks = {bytes([i]): i for i in range(256)} | {b"ab": 256, b"abc": 257}
    enc = tiktoken.Encoding(
        name="tiny", pat_str=r"\S+|\s+", mergeable_ranks=ranks, special_tokens={"<|s|>": 258}
    )
    tok = TiktokenTokenizer(enc, "<|s|>", threads=2)
    assert tok.encode("abc ab") == [257, 32, 256] and tok.bos_id == 258
    assert tok.encode_batch(["abc", "ab"]) == [[257], [256]]
    tok.save(tmp_path / "tok")
    again = load_tokenizer(tmp_path / "tok")
    assert again.fingerprint == tok.fingerprint and again.encode("xabc") == tok.encode("xabc")
    assert again.token_bytes().tolist()[255:] == [1, 2, 3, 0]


def test_bpe_token_bytes_count_bytes_of_partial_characters(bpe):
    ids = bpe.encode(TEXT)
    assert bpe.token_bytes()[ids].sum() == len(TEXT.encode())


def test_huggingface_tokenizer_json(tmp_path, bpe):
    bpe.tok.save(str(tmp_path / "tokenizer.json"))
    tok = HuggingFaceJSON.from_config(HuggingFaceConfig(name="huggingface", path=str(tmp_path)))
    assert tok.bos_token == "<|bos|>" and tok.bos_id == bpe.bos_id
    assert tok.encode(TEXT) == bpe.encode(TEXT) and tok.decode(tok.encode(TEXT)) == TEXT
    tok.save(tmp_path / "saved")
    assert load_tokenizer(tmp_path / "saved").fingerprint == tok.fingerprint
    cfg = HuggingFaceConfig(
        name="huggingface", path=str(tmp_path / "tokenizer.json"), bos_token="<s>"
    )
    with pytest.raises(DataError, match=r"no '<s>' token.*<\|bos\|>"):
        HuggingFaceJSON.from_config(cfg)
    (tmp_path / "bad.json").write_text("{not a tokenizer")
    with pytest.raises(DataError, match="not a tokenizer.json"):
        HuggingFaceJSON.from_config(
            HuggingFaceConfig(name="huggingface", path=str(tmp_path / "bad.json"))
        )


def test_saved_tokenizer_from_dataset_or_tokenizer_dir(tmp_path, bpe):
    bpe.save(tmp_path / "dataset" / "tokenizer")
    for path in (tmp_path / "dataset", tmp_path / "dataset" / "tokenizer"):
        cfg = SavedConfig(name="saved", path=str(path))
        assert SavedTokenizer.from_config(cfg).fingerprint == bpe.fingerprint
        assert SavedTokenizer.vocab_size_for(cfg) == 320
    with pytest.raises(DataError, match="no tokenizer in"):
        SavedTokenizer.from_config(SavedConfig(name="saved", path=str(tmp_path)))


def test_encode_docs_prefixes_bos(bpe):
    texts = ["abc", TEXT, "x"]
    for tok in (ByteTokenizer(), bpe):
        flat, lengths = tok.encode_docs(texts)
        want = np.concatenate([[tok.bos_id, *tok.encode(t)] for t in texts])
        assert np.array_equal(flat, want) and lengths.tolist() == [
            len(tok.encode(t)) + 1 for t in texts
        ]


def test_bpe_training_sample_is_bounded_and_says_so(tmp_path, capsys):
    """Issue 36.14: one 50 MB row without whitespace made BPE training run past 400 s at 3.3 GB.
    A document now gives at most 1/10 of train_chars, and runs without whitespace are cut into
    MAX_RUN-character pieces; the log says both. (A 2 MB row here, with train_chars 1M.)"""
    rng = np.random.default_rng(0)
    row = "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz0123456789"), 2_000_000))
    normal = "the quick brown fox jumps over the lazy dog\n" * 50
    sample = Sample(1_000_000)
    pieces = list(sample.take(iter([row, normal])))
    assert "".join(pieces) == row[:100_000] + normal  # the first 1/10 of train_chars, then on
    assert max(len(p) for p in pieces[:-1]) == MAX_RUN and pieces[-1] == normal
    assert sample.capped == 1 and sample.split == 1
    assert list(Sample(1_000_000).take(iter([normal]))) == [normal]  # ordinary text untouched

    corpus = tmp_path / "one_row.txt"
    corpus.write_text(row)
    data = {
        "tokenizer": {"name": "bpe", "vocab_size": 512, "train_chars": 1_000_000},
        "sources": {"row": {"name": "text", "path": str(corpus), "split": "file"}},
        "val_fraction": 0.0,
    }
    config = write_config(tmp_path / "data.yaml", {"data": data})
    assert main(["data", "prepare", str(config), "--out", str(tmp_path / "ds")]) == 0
    out = capsys.readouterr().out
    assert "1 document(s) longer than 100,000 characters gave only their first 100,000" in out
    assert f"cut into {MAX_RUN}-character pieces for tokenizer training" in out
    tok = load_tokenizer(tmp_path / "ds" / "row" / "tokenizer")
    assert tok.decode(tok.encode(row[:5000])) == row[:5000]


def test_long_documents_are_encoded_in_pieces_with_the_same_tokens(bpe, monkeypatch):
    """Issue 36.14: a document longer than ENCODE_CHARS is encoded in pieces cut where the
    GPT-2 split cuts anyway (a space starting a word): the tokens are the whole text's. A run
    without whitespace is cut at ENCODE_CHARS; it still decodes to itself."""
    import random

    import littlelm.data.tokenizer as tk

    rng = random.Random(0)
    words = ["the", "fox", "  ", "\n", "x.", "(a)", "123", "it's", "\t", "naïve", "日本語"]
    text = "".join(rng.choice(words) + rng.choice([" ", "", "  ", "\n"]) for _ in range(20_000))
    whole = bpe.encode(text)
    monkeypatch.setattr(tk, "ENCODE_CHARS", 2000)
    monkeypatch.setattr(tk, "BATCH_CHARS", 9000)
    assert bpe._cuts_safely() and len(tk.encode_pieces(text, 2000)) > 30
    flat, lengths = bpe.encode_docs(["a short one", text, text[:5000]])
    want = [bpe.bos_id, *bpe.encode("a short one"), bpe.bos_id, *whole]
    want += [bpe.bos_id, *bpe.encode(text[:5000])]
    assert flat.tolist() == want and lengths.tolist() == [
        12,
        len(whole) + 1,
        len(want) - 13 - len(whole),
    ]
    run = "".join(rng.choice("abcdefghij") for _ in range(9_000))
    flat, lengths = bpe.encode_docs([run])
    assert bpe.decode(flat[1:].tolist()) == run and lengths.tolist() == [len(flat)]


MEASURE = """
import resource, sys, numpy as np
from littlelm.data.tokenizers import load_tokenizer
tok = load_tokenizer(sys.argv[1])
row = np.random.default_rng(0).choice(np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8), 4_000_000).tobytes().decode()
tok.encode_docs([row[:100_000]])  # the library's pools and caches, before the baseline
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
flat, lengths = tok.encode_docs([row])
assert tok.decode(flat[1:20_001].tolist()) == tok.decode(tok.encode(row[:30_000])[:20_000])
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""


def test_encoding_one_huge_row_is_bounded_in_memory(bpe, tmp_path):
    """Issue 36.14: one 50 MB row without whitespace took 7.4 GB of peak memory to encode in
    `data prepare` (the library keeps about 100 bytes per token of an encoding): a 4 MB row here
    grew the peak by about 700 MB before, and must now stay under 120 MB."""
    import subprocess
    import sys

    bpe.save(tmp_path / "tok")
    r = subprocess.run(
        [sys.executable, "-c", MEASURE, str(tmp_path / "tok")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert float(r.stdout) < 120, f"peak memory grew by {float(r.stdout):.0f} MB"


SPECIAL_TEXT = "quoted: <|bos|> then <|user|>hi<|end|><|assistant|> and <|system|>"


def special_ids(tok) -> set[int]:
    return {i for t in ("<|bos|>", *CHAT_TOKENS) if (i := tok.special_id(t)) is not None}


def test_special_token_text_in_plain_text_is_ordinary_text(bpe, tmp_path):
    """Text that quotes special tokens (data, prompts, completions) never makes control tokens;
    only text a chat format rendered (`special=True`) does."""
    bpe.save(tmp_path / "tok")
    hf = HuggingFaceJSON.from_config(
        HuggingFaceConfig(name="huggingface", path=str(tmp_path / "tok" / "tokenizer.json"))
    )
    for tok in (bpe, hf):
        specials = special_ids(tok)
        assert len(specials) == 5  # <|bos|> and the four chat tokens
        for text in ("<|bos|>", "<|end|>", "<|assistant|>", SPECIAL_TEXT):
            ids = tok.encode(text)
            assert not specials & set(ids), (tok.kind, text, ids)
            assert tok.decode(ids) == text
        assert not specials & set(tok.encode_batch([SPECIAL_TEXT])[0])
        tokens, _ = tok.encode_docs([SPECIAL_TEXT, "x" + SPECIAL_TEXT])
        assert [i for i in tokens.tolist() if i in specials] == [tok.bos_id, tok.bos_id]
        # where a chat format put them (special=True), they are the tokens
        for t in ("<|bos|>", *CHAT_TOKENS):
            assert tok.encode(t, special=True) == [tok.special_id(t)]
    assert load_tokenizer(tmp_path / "tok").fingerprint == bpe.fingerprint  # the same tokenizer


def test_long_documents_quoting_special_tokens_stay_ordinary_text(bpe, monkeypatch):
    from littlelm.data import tokenizer as module

    monkeypatch.setattr(module, "ENCODE_CHARS", 64)  # the piecewise path of encode_docs
    text = " ".join([SPECIAL_TEXT] * 20)
    tokens, _ = bpe.encode_docs([text])
    assert tokens.tolist() == [bpe.bos_id, *bpe.encode(text)]
    assert tokens.tolist().count(bpe.bos_id) == 1


@needs_gpt2
def test_tiktoken_special_token_text_is_ordinary_text():
    tok = TiktokenTokenizer.from_config(gpt2_config(threads=2))
    text = "a<|endoftext|>b"
    assert tok.bos_id not in tok.encode(text) + tok.encode_batch([text, text])[1]
    assert tok.encode_docs([text, text])[0].tolist().count(tok.bos_id) == 2  # the documents'

    assert tok.encode("<|endoftext|>", special=True) == [tok.bos_id]
