"""Token shards as other tools write them (llm.c's fixed-size fineweb shards whose documents
continue across files, its val shard, a Megatron index of one document), data that changes
under a checkpointed run, and a loader that cannot make a row."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from test_foreign import write_nanogpt

from conftest import tiny_tree, write_config
from littlelm.cli import main
from littlelm.data.foreign import TokenFiles, TokensConfig
from littlelm.data.loader import BestFitPacker, DocStream
from littlelm.data.shards import Shard, write_shard
from littlelm.data.tokenizer import ByteTokenizer
from littlelm.errors import DataError

TOK = ByteTokenizer()  # vocabulary 257, BOS 256
BOS = TOK.bos_id
REPO = Path(__file__).resolve().parents[1]


def stream_of(n_docs: int, seed: int = 0, longest: int = 120) -> tuple[np.ndarray, list]:
    """llm.c's fineweb.py: <|endoftext|> (here BOS) before every document, back to back."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, BOS, rng.integers(1, longest)) for _ in range(n_docs)]
    return np.concatenate([np.concatenate([[BOS], d]) for d in docs]), docs


def write_llmc_dir(d: Path, tokens: np.ndarray, shard: int, val: np.ndarray | None) -> list:
    """llm.c's fill loop: every shard exactly `shard` tokens (the last the rest), so documents
    continue from one into the next; shard 0 is fineweb_val_000000.bin when `val` is given."""
    d.mkdir(parents=True, exist_ok=True)
    if val is not None:
        write_nanogpt(d / "fineweb_val_000000.bin", val)
    paths = []
    for i, a in enumerate(range(0, len(tokens), shard)):
        paths.append(write_nanogpt(d / f"fineweb_train_{i + 1:06d}.bin", tokens[a : a + shard]))
    return paths


def open_source(cfg: dict, cache: Path, val_fraction: float = 0.0):
    said: list[str] = []
    src = TokenFiles(TokensConfig(name="tokens", **cfg), "web")
    train, val, summary = src.open(TOK, val_fraction, cache, said.append)
    return train, val, summary, said


def trained_docs(views: list) -> list[tuple]:
    """Every document as the loader trains on it (BOS, then its tokens), sorted."""
    return sorted(tuple(v.doc(i).tolist()) for v in views for i in range(len(v)))


def as_trained(docs: list) -> list[tuple]:
    return sorted(tuple([BOS, *d.tolist()]) for d in docs)


# -- a directory of shards is one stream -----------------------------------------------------------


@pytest.mark.parametrize("shard", [97, 250, 1000])  # 97: documents over three or more files
def test_llmc_shards_filled_to_a_fixed_size_are_one_stream(tmp_path, shard):
    tokens, docs = stream_of(300)
    val_tokens, val_docs = stream_of(40, seed=1)
    paths = write_llmc_dir(tmp_path / "fineweb", tokens, shard, val_tokens)
    assert any(p.read_bytes()[1024:1026] != np.uint16(BOS).tobytes() for p in paths[1:])
    cfg = {"format": "nanogpt", "path": str(tmp_path / "fineweb")}
    train, val, summary, said = open_source(cfg, tmp_path / "cache")
    # every document once, BOS exactly where a separator is; the val shard is val, not trained
    assert trained_docs(train) == as_trained(docs)
    assert trained_docs(val) == as_trained(val_docs)
    assert sum(v.n_tokens for v in train) == len(tokens)  # nothing lost, nothing added
    assert summary["continued"] > 0 and summary["documents"] == len(docs) + len(val_docs)
    # one line, and it is the val shard's: no per-file separator warnings
    assert len(said) == 1 and "fineweb_val_000000.bin" in said[0] and "val_path" in said[0]
    # a second open reads the joined documents from the cache as they are
    joined = list((tmp_path / "cache" / "token-index").glob("*.joined"))
    mtime = joined[0].stat().st_mtime_ns
    again, _, _, _ = open_source(cfg, tmp_path / "cache")
    assert trained_docs(again) == trained_docs(train)
    assert joined[0].stat().st_mtime_ns == mtime


def test_separator_after_each_document_and_files_without_one(tmp_path):
    """nanoGPT's openwebtext layout (the separator after each document), uint16 arrays cut at
    fixed sizes: a file that ends with the separator, and one document over four files."""
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, BOS, n) for n in (5, 7, 400, 3, 9)]
    tokens = np.concatenate([np.concatenate([d, [BOS]]) for d in docs]).astype("<u2")
    d = tmp_path / "owt"
    d.mkdir()
    cuts = [0, 6, 100, 200, 300, len(tokens)]  # file 1 ends with the separator after doc 0
    for i, (a, b) in enumerate(itertools.pairwise(cuts)):
        (d / f"train_{i:02d}.bin").write_bytes(tokens[a:b].tobytes())
    cfg = {"format": "array", "path": str(d), "dtype": "uint16"}
    train, _, _, said = open_source(cfg, tmp_path / "cache")
    # documents start at each separator (its BOS), the stream's first with a BOS put before it
    want = as_trained(docs)
    got = trained_docs(train)
    assert got == want and not said
    assert sum(v.n_tokens for v in train) == len(tokens)  # the first BOS added, the last dropped


def test_a_separator_that_never_occurs_is_one_line_for_all_files(tmp_path):
    d = tmp_path / "t"
    for i in range(5):
        write_nanogpt((d.mkdir(exist_ok=True), d / f"s{i}.bin")[1], np.arange(50) % 200)
    train, _, _, said = open_source({"format": "nanogpt", "path": str(d)}, tmp_path / "c")
    assert len(said) == 1 and "never occurs in its 5 file(s)" in said[0]
    assert "separator" in said[0] and sum(len(v) for v in train) == 5


def test_val_shards_are_not_trained_on_when_val_path_is_given(tmp_path):
    tokens, docs = stream_of(100)
    write_llmc_dir(tmp_path / "web", tokens, 500, stream_of(10, seed=1)[0])
    other, other_docs = stream_of(12, seed=2)
    write_nanogpt(tmp_path / "held.bin", other)
    cfg = {
        "format": "nanogpt",
        "path": str(tmp_path / "web"),
        "val_path": str(tmp_path / "held.bin"),
    }
    train, val, _, said = open_source(cfg, tmp_path / "cache")
    assert trained_docs(train) == as_trained(docs)
    assert trained_docs(val) == as_trained(other_docs)
    assert len(said) == 1 and "not trained on" in said[0] and "fineweb_val_000000" in said[0]


def test_a_directory_of_only_val_shards_names_the_fix(tmp_path):
    write_llmc_dir(tmp_path / "web", np.zeros(0, np.uint16), 10, stream_of(10)[0])
    with pytest.raises(DataError, match="every file in it is named as validation") as e:
        open_source({"format": "nanogpt", "path": str(tmp_path / "web")}, tmp_path / "c")
    assert "glob or a list" in str(e.value)
    # the fix: the file named in path (not a directory) trains
    cfg = {"format": "nanogpt", "path": str(tmp_path / "web" / "fineweb_val_000000.bin")}
    assert open_source(cfg, tmp_path / "c")[0]


# -- a Megatron index of one document ----------------------------------------------------------------


def megatron_with_builder(prefix: Path, docs: list, one_document: bool) -> None:
    """megatron-core's own IndexedDatasetBuilder: an item per sequence, end_document() after
    each (what preprocess_data.py does) or once at the end."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(str(prefix) + ".bin", dtype=np.uint16)
    for d in docs:
        builder.add_item(torch.tensor(d.astype(np.int64)))
        if not one_document:
            builder.end_document()
    if one_document:
        builder.end_document()
    builder.finalize(str(prefix) + ".idx")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_megatron_index_of_one_document_is_reported_with_its_figures(tmp_path):
    _, docs = stream_of(50)
    megatron_with_builder(tmp_path / "one_text_document", docs, one_document=True)
    megatron_with_builder(tmp_path / "many_text_document", docs, one_document=False)
    tokens = sum(len(d) for d in docs)
    cfg = {"format": "megatron", "path": str(tmp_path / "one_text_document")}
    train, _, _, said = open_source(cfg, tmp_path / "cache", val_fraction=0.1)
    assert sum(len(v) for v in train) == 1
    assert len(said) == 1 and "marks 1 document over its 50 sequences" in said[0]
    assert f"{tokens:,} tokens" in said[0] and "end_document()" in said[0]
    cfg["path"] = str(tmp_path / "many_text_document")
    train, val, _, said = open_source(cfg, tmp_path / "cache", val_fraction=0.1)
    assert not said and sum(len(v) for v in train + val) == 50


# -- a loader that cannot make a row ---------------------------------------------------------------


def test_a_source_of_only_too_long_conversations_is_an_error_not_a_spin(tmp_path):
    rng = np.random.default_rng(0)
    docs = [np.concatenate([[BOS], rng.integers(0, BOS, 40)]) for _ in range(30)]
    write_shard(tmp_path / "chat.bin", docs, TOK.vocab_size, BOS, TOK.fingerprint)
    packer = BestFitPacker(DocStream([Shard(tmp_path / "chat.bin")], 0, label="chat"), 33, 8, "pad")
    result: list = []

    def fill():
        try:
            packer.fill(np.empty(33, np.int64))
        except DataError as e:
            result.append(e)

    t = threading.Thread(target=fill, daemon=True)
    t.start()
    t.join(timeout=20)  # bounded: the code before this change spun here forever
    assert not t.is_alive() and result, "the packer did not stop"
    message = str(result[0])
    assert "data.sources.chat" in message and "none of its 30 conversations" in message
    assert "a training row of 33 tokens" in message and "train.seq_len to at least 40" in message


def test_conversations_all_longer_than_a_row_stop_at_start(tmp_path):
    from test_chat import data_cfg, write_conversations

    from littlelm.data.build import build_data

    src = write_conversations(tmp_path / "chat.jsonl", 60)
    data = build_data(data_cfg(tmp_path, {"dataset": str(src)}, cache_dir=str(tmp_path / "c")))
    longest = int(max(s.lengths().max() for s in data.sources["chat"].train))
    assert data.chat_notes(longest) == []  # every one fits
    with pytest.raises(DataError, match="every one of them, so no training row") as e:
        data.chat_notes(8)  # none fits a row of 9 tokens
    assert "raise train.seq_len to at least" in str(e.value)


# -- SIGTERM while the loader is stalled, or during start-up ---------------------------------------

STALLED = """
import sys, time
from littlelm.data import loader, foreign
from littlelm.cli import main

def stall(*a, **k):
    print("STALLED", flush=True)
    while True:
        time.sleep(0.05)  # a loader that makes no batch (a slow disk, a source that cannot)

if sys.argv[1] == "loader":
    loader.MixtureLoader.next_batch = stall
else:
    foreign.TokenFiles.open = stall
sys.exit(main(["train", sys.argv[2], "--resume", "never"]))
"""


# [startup] runs with Python's default SIGTERM (no StopSignals yet): it once timed out inside the
# full suite because an earlier in-process stop left SIGTERM as SIG_IGN, which children inherit
@pytest.mark.parametrize("where", ["loader", "startup"])
def test_sigterm_while_the_loader_is_stalled_exits_promptly(tmp_path, where):
    tokens, _ = stream_of(200)
    write_llmc_dir(tmp_path / "web", tokens, 1000, None)
    tree = tiny_tree(tmp_path / "unused.txt", tmp_path / "runs")
    tree["data"]["sources"] = {
        "web": {"name": "tokens", "format": "nanogpt", "path": str(tmp_path / "web")}
    }
    cfg = write_config(tmp_path / "run.yaml", tree)
    script = tmp_path / "stalled.py"
    script.write_text(textwrap.dedent(STALLED))
    env = {**os.environ, "PYTHONPATH": str(REPO), "LITTLELM_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen(
        [sys.executable, str(script), where, str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    line = ""
    while "STALLED" not in line:  # bounded by the process: it prints or ends
        line = proc.stdout.readline()
        assert line or proc.poll() is None, "ended before the stall"
    time.sleep(0.5)  # inside the stall
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("SIGTERM did not end the run within 10 s") from None
    out = proc.stdout.read()
    proc.stdout.close()
    assert rc in (0, 143, -signal.SIGTERM), out
    run = tmp_path / "runs" / "tiny"
    if where == "loader":  # it saved its step-0 state and said why
        assert rc == 0 and "stopped while waiting for the next batch" in out, out
        ckpts = sorted((run / "checkpoints").iterdir())
        assert [c.name for c in ckpts] == ["step_000000"], ckpts
        assert main(["train", str(cfg), "train.max_steps=2"]) == 0  # it resumes


# -- data that changed under a checkpoint ----------------------------------------------------------


def checkpointed_run(tmp_path: Path) -> tuple[Path, list[Path]]:
    tokens, _ = stream_of(400, longest=60)
    paths = write_llmc_dir(tmp_path / "web", tokens, 4000, None)
    tree = tiny_tree(tmp_path / "unused.txt", tmp_path / "runs", train={"max_steps": 3})
    tree["checkpoint"] = {"every": 3}
    tree["data"]["sources"] = {
        "web": {"name": "tokens", "format": "nanogpt", "path": str(tmp_path / "web")}
    }
    cfg = write_config(tmp_path / "run.yaml", tree)
    assert main(["train", str(cfg), "--resume", "never"]) == 0
    return cfg, paths


def rewrite_same_size(path: Path) -> None:
    raw = np.frombuffer(path.read_bytes()[1024:], "<u2")
    write_nanogpt(path, np.where(raw == BOS, BOS, (raw + 1) % BOS))


def shrink(path: Path) -> None:
    raw = np.frombuffer(path.read_bytes()[1024:], "<u2")
    write_nanogpt(path, raw[:300])


@pytest.mark.parametrize("change", [rewrite_same_size, shrink])
def test_data_changed_under_a_checkpoint_is_refused_with_the_choices(tmp_path, capsys, change):
    cfg, paths = checkpointed_run(tmp_path)
    before = paths[1].read_bytes()
    change(paths[1])
    capsys.readouterr()
    assert main(["train", str(cfg), "train.max_steps=5"]) == 2
    err = capsys.readouterr().err
    assert str(paths[1]) in err and "changed since it was written" in err, err
    assert "data.on_changed=restart" in err and "--resume never" in err
    assert "Traceback" not in err
    # each choice works: restoring the file resumes where the run was ...
    changed = paths[1].read_bytes()
    paths[1].write_bytes(before)
    assert main(["train", str(cfg), "train.max_steps=5"]) == 0
    assert "resumed from" in capsys.readouterr().out
    # ... and with the data changed again, the override starts the data position over
    paths[1].write_bytes(changed)
    assert main(["train", str(cfg), "train.max_steps=7"]) == 2
    assert main(["train", str(cfg), "train.max_steps=7", "data.on_changed=restart"]) == 0
    assert "the data position starts over" in capsys.readouterr().out


def test_a_checkpoint_from_before_fingerprints_on_shrunk_data_is_an_error(tmp_path, capsys):
    import json

    cfg, paths = checkpointed_run(tmp_path)
    state = next((tmp_path / "runs/tiny/checkpoints").glob("step_*")) / "state.json"
    saved = json.loads(state.read_text())
    del saved["data_files"]  # as littlelm wrote it before it fingerprinted the data
    state.write_text(json.dumps(saved))
    for p in paths:
        shrink(p)  # every file: the saved position points past their documents
    capsys.readouterr()
    assert main(["train", str(cfg), "train.max_steps=5"]) == 2
    err = capsys.readouterr().err
    assert "its data position does not fit this run's data" in err, err
    assert "data.on_changed=restart" in err and "Traceback" not in err
    assert main(["train", str(cfg), "train.max_steps=5", "data.on_changed=restart"]) == 0


def test_val_fraction_over_a_stream_holds_out_whole_documents_once(tmp_path):
    tokens, docs = stream_of(300)
    paths = write_llmc_dir(tmp_path / "web", tokens, 250, None)
    cfg = {"format": "nanogpt", "path": str(tmp_path / "web")}
    train, val, summary, said = open_source(cfg, tmp_path / "cache", val_fraction=0.2)
    assert not said and summary["continued"] > 0
    assert sorted(trained_docs(train) + trained_docs(val)) == as_trained(docs)
    held = sum(v.n_tokens for v in val) / len(tokens)
    assert 0.1 < held < 0.35, held  # about the last fifth of each file, whole documents
    # a document cut at a file's end goes with its start: held out when it starts after the
    # cut of its first file (the last fifth), trained on when before
    seps = np.flatnonzero(tokens == BOS)
    for i in range(len(paths) - 1):
        start = int(seps[seps < 250 * (i + 1)][-1])
        nxt = int(seps[seps > start][0]) if (seps > start).any() else len(tokens)
        if nxt <= 250 * (i + 1):
            continue  # this file ends at a document's end
        doc = tuple([BOS, *tokens[start + 1 : nxt].tolist()])
        assert doc in (trained_docs(val) if start >= 250 * i + 200 else trained_docs(train))


# -- llm.c's val shard, filled like the others, and gaps in the numbering -------------------------


def write_llmc_as_fineweb(d: Path, tokens: np.ndarray, shard: int) -> list[Path]:
    """llm.c's fineweb.py exactly: one stream of documents cut into shards of `shard` tokens,
    the first of which is the val shard (fineweb_val_000000.bin), the rest train shards."""
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, a in enumerate(range(0, len(tokens), shard)):
        name = "fineweb_val_000000.bin" if i == 0 else f"fineweb_train_{i:06d}.bin"
        paths.append(write_nanogpt(d / name, tokens[a : a + shard]))
    return paths


def test_the_val_shards_last_document_goes_on_into_the_first_train_shard(tmp_path):
    tokens, docs = stream_of(300)
    seps = np.flatnonzero(tokens == BOS)
    shard = int(seps[40]) + 7  # the val shard ends 7 tokens into document 40
    paths = write_llmc_as_fineweb(tmp_path / "fineweb", tokens, shard)
    assert paths[1].read_bytes()[1024:1026] != np.uint16(BOS).tobytes()  # it starts mid-document
    cfg = {"format": "nanogpt", "path": str(tmp_path / "fineweb")}
    train, val, _, said = open_source(cfg, tmp_path / "cache")
    # documents 0..40 are held out, document 40 whole (its tail from train_000001 with it);
    # training has documents 41.. and nothing of 40, and no document with a BOS put before
    assert trained_docs(val) == as_trained(docs[:41])
    assert trained_docs(train) == as_trained(docs[41:])
    assert sum(v.n_tokens for v in train + val) == len(tokens)
    assert len(said) == 1 and "fineweb_val_000000.bin" in said[0]


def test_a_gap_in_the_shard_numbering_is_said_and_glues_nothing(tmp_path):
    tokens, _ = stream_of(300)
    paths = write_llmc_dir(tmp_path / "web", tokens, 250, None)
    gone = paths[2]
    gone.unlink()  # fineweb_train_000003.bin
    cfg = {"format": "nanogpt", "path": str(tmp_path / "web")}
    train, _, summary, said = open_source(cfg, tmp_path / "cache")
    assert (
        len(said) == 1
        and "skips from fineweb_train_000002.bin to fineweb_train_000004.bin" in said[0]
    )
    assert summary["gaps"] == [["fineweb_train_000002.bin", "fineweb_train_000004.bin"]]
    # what the files around the gap hold is trained on as it is, nothing joined across it
    before = tokens[: 2 * 250]
    after = tokens[3 * 250 :]
    last_start = int(np.flatnonzero(before == BOS)[-1])
    first_sep = int(np.flatnonzero(after == BOS)[0])
    cut_end = tuple([BOS, *before[last_start + 1 :].tolist()])
    head = tuple([BOS, *after[:first_sep].tolist()])
    got = trained_docs(train)
    assert cut_end in got and (head in got or first_sep == 0)
    assert sum(v.n_tokens for v in train) == len(tokens) - 250 + (1 if first_sep else 0)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_megatron_documents_written_with_append_eod_get_one_delimiter(tmp_path, capsys):
    """preprocess_data.py --append-eod ends each document with EOD (gpt2's <|endoftext|>, the
    BOS here): a boundary is that one token, not EOD then a BOS put before the next."""
    _, docs = stream_of(60)
    megatron_with_builder(tmp_path / "eod_text_document", [np.append(d, BOS) for d in docs], False)
    cfg = {"format": "megatron", "path": str(tmp_path / "eod_text_document")}
    train, _, _, _ = open_source(cfg, tmp_path / "cache")
    assert trained_docs(train) == as_trained(docs)
    rows = np.concatenate([v.head(None) for v in train])
    assert not np.any((rows[1:] == BOS) & (rows[:-1] == BOS))  # never 50256 50256
    assert main(["data", "inspect", str(tmp_path / "eod_text_document")]) == 0
    assert "ends with EOD" in capsys.readouterr().out


def test_data_inspect_counts_documents_as_training_reads_them(tmp_path, capsys):
    tokens, docs = stream_of(300)
    paths = write_llmc_as_fineweb(tmp_path / "fineweb", tokens, 997)
    starts = np.flatnonzero(tokens == BOS)
    crossing = sum(
        1 for a in range(997, len(tokens), 997) if not (starts == a).any()
    )  # a file that does not begin at a document: the one before goes on into it
    assert crossing > 2
    assert main(["data", "inspect", str(tmp_path / "fineweb"), "--separator", str(BOS)]) == 0
    out = capsys.readouterr().out
    assert (
        f"{len(paths)} file(s)" in out and f"{len(docs):,} documents as training reads them" in out
    ), out
    assert f"{crossing:,} go on from one file into the next" in out
    assert "fineweb_val_000000.bin" in out and "held out" in out
    table = [line.split() for line in out.splitlines() if line.startswith("fineweb_")]
    assert sum(int(row[2].replace(",", "")) for row in table) == len(docs)  # each starts once
