"""`littlelm data prepare` / `inspect`, resumability, the shards source and tokenizer checks."""

from __future__ import annotations

import errno
import json

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from conftest import WORDS, tiny_tree, write_config
from littlelm.cli import main
from littlelm.console import Console
from littlelm.data import workers
from littlelm.data.build import DataConfig, build_data, open_dataset, prepare_data
from littlelm.data.prepare import dataset_key, make_split, read_manifest, train_documents
from littlelm.data.shards import Shard, ShardWriter, write_shard
from littlelm.data.sources import TextConfig, shard_options, split_long
from littlelm.data.split import ValSplit
from littlelm.data.tokenizer import ByteTokenizer
from littlelm.errors import DataError
from littlelm.schema import load_run
from littlelm.train.trainer import Trainer


def make_docs(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [
        f"doc {i}: " + " ".join(rng.choice(WORDS, size=int(rng.integers(3, 80)))) for i in range(n)
    ]


@pytest.fixture
def raw(tmp_path):
    """Two JSONL files (one with a bad line) and a text file."""
    d = tmp_path / "raw"
    d.mkdir()
    docs = make_docs(300)
    (d / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[:200]))
    lines = [json.dumps({"text": t}) + "\n" for t in docs[200:]]
    (d / "b.jsonl").write_text("".join(lines[:50]) + "{broken\n" + "".join(lines[50:]))
    (d / "book.txt").write_text("\n\n".join(make_docs(100, seed=1)) + "\n")
    return d


def data_cfg(raw, **kw) -> DataConfig:
    tree = {
        "tokenizer": {"name": "byte"},
        "sources": {
            "web": {"name": "jsonl", "path": str(raw), "weight": 0.7},
            "book": {"name": "text", "path": str(raw / "book.txt"), "split": "paragraph"},
        },
        "val_fraction": 0.1,
        "shard_tokens": 3000,
        "workers": 1,
        **kw,
    }
    return load_run_data(tree)


def load_run_data(data_tree: dict) -> DataConfig:
    from littlelm.config import validate
    from littlelm.schema import RunConfig

    return validate(RunConfig, {"data": data_tree}).data


def decoded(directory, manifest, split="train") -> list[str]:
    tok = ByteTokenizer()
    out = []
    for s in manifest["splits"][split]["shards"]:
        shard = Shard(directory / s["file"])
        out += [tok.decode(shard.doc(i)[1:].tolist()) for i in range(len(shard))]
    return out


def shard_files(directory) -> dict[str, tuple[int, int]]:
    return {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in directory.glob("*.bin")}


def test_prepare_writes_complete_dataset(tmp_path, raw):
    _, result = prepare_data(data_cfg(raw), tmp_path / "out", log=lambda s: None)
    _, directory, m = result["web"]
    assert (directory / "manifest.json").is_file() and not (tmp_path / "out/web.partial").exists()
    assert m["documents"] == 300 and m["skipped"] == {"malformed JSON": 1}
    tr, va = m["splits"]["train"], m["splits"]["val"]
    assert len(tr["shards"]) > 3 and tr["docs"] + va["docs"] == 300
    assert all(s["tokens"] < 3000 + 600 for s in tr["shards"])  # shard size, plus one document
    docs = make_docs(300)
    split = ValSplit(0.1, "hash", 0)
    assert decoded(directory, m, "train") == [d for d in docs if not split.is_val(0, d.encode())]
    assert decoded(directory, m, "val") == [d for d in docs if split.is_val(0, d.encode())]
    for s in tr["shards"] + va["shards"]:
        assert Shard(directory / s["file"]).header.checksum == s["sha256"]
    assert m["tokenizer"]["fingerprint"] == ByteTokenizer().fingerprint


def test_prepare_on_a_filesystem_without_locks_warns_and_goes_on(tmp_path, raw, monkeypatch):
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.warns(UserWarning, match="cannot lock .*No locks available"):
        _, result = prepare_data(data_cfg(raw), tmp_path / "out", log=lambda s: None)
    _, directory, m = result["web"]
    assert (directory / "manifest.json").is_file() and m["documents"] == 300


def test_long_documents_never_straddle_the_split(tmp_path):
    docs = ["\n".join(f"d{i} " + line[:40] for line in make_docs(8, seed=i)) for i in range(300)]
    (tmp_path / "a.txt").write_text("\n\n".join(docs))
    source = {
        "name": "text",
        "path": str(tmp_path / "a.txt"),
        "split": "paragraph",
        "max_chars": 64,
    }
    cfg = load_run_data(
        {"tokenizer": {"name": "byte"}, "sources": {"t": source}, "val_fraction": 0.2, "workers": 1}
    )
    _, result = prepare_data(cfg, tmp_path / "out", log=lambda s: None)
    _, directory, m = result["t"]
    ids = {}
    for split in ("train", "val"):
        pieces = decoded(directory, m, split)
        assert all(len(p) <= 64 for p in pieces)
        ids[split] = {line.split()[0] for p in pieces for line in p.splitlines() if line.strip()}
    assert (
        len(ids["val"]) > 20 and not ids["train"] & ids["val"]
    )  # a document's pieces stay together
    assert len(ids["train"] | ids["val"]) == 300


def test_parallel_prepare_equals_serial(tmp_path, raw):
    _, serial = prepare_data(data_cfg(raw), tmp_path / "one", log=lambda s: None)
    _, parallel = prepare_data(data_cfg(raw, workers=2), tmp_path / "two", log=lambda s: None)
    for label in ("web", "book"):
        assert serial[label][2]["splits"] == parallel[label][2]["splits"]


def test_worker_processes_only_for_enough_input(monkeypatch):
    from littlelm.data.sources import Unit

    monkeypatch.setattr(workers.os, "cpu_count", lambda: 8)
    mb = 1 << 20

    def jobs(*sizes_mb):
        return [
            workers.UnitJob(None, "x", Unit(("f",), size=n * mb), i, 0, None, "", 1)
            for i, n in enumerate(sizes_mb)
        ]

    assert workers.pool_size(jobs(10, 10, 10), None) == 1  # small: this process, every core
    assert workers.pool_size(jobs(*[50] * 6), None) == 4  # one process per 64 MB of input
    assert workers.pool_size(jobs(*[500] * 20), None) == 8  # at most one per core
    assert workers.pool_size(jobs(500, 500), None) == 2  # at most one per unit
    assert workers.pool_size(jobs(1, 1, 1), 3) == 3  # an explicit count is kept
    assert workers.pool_size(jobs(1), 4) == 1


def test_interrupted_prepare_resumes_without_redoing_finished_units(tmp_path, raw, monkeypatch):
    real = workers.tokenize_unit

    def dies_on_unit_3(job, tok, report):
        if job.uid == 3:
            raise KeyboardInterrupt
        return real(job, tok, report)

    monkeypatch.setattr(workers, "tokenize_unit", dies_on_unit_3)
    cfg = data_cfg(raw)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(cfg, tmp_path / "out", only=["web"], log=lambda s: None)
    partial = tmp_path / "out" / "web.partial"
    assert not (tmp_path / "out" / "web").exists() and not (partial / "manifest.json").exists()
    assert sorted(p.name for p in (partial / "units").iterdir()) == [
        "00000.json",
        "00001.json",
        "00002.json",
    ]
    assert not list(partial.glob("*.tmp")) and not list(partial.glob("*-00003-*"))
    # A kill between a shard's rename and its unit's record leaves files that look finished:
    (partial / "train-00003-000.bin").write_bytes((partial / "train-00000-000.bin").read_bytes())
    (partial / "train-00003-001.bin.tmp").write_bytes(b"half a shard")
    kept = shard_files(partial)
    del kept["train-00003-000.bin"]
    monkeypatch.setattr(workers, "tokenize_unit", real)
    logs = []
    _, result = prepare_data(cfg, tmp_path / "out", only=["web"], log=logs.append)
    assert any("3 already done" in line for line in logs)
    directory, m = result["web"][1], result["web"][2]
    after = shard_files(directory)
    assert all(after[name] == stat for name, stat in kept.items())  # not rewritten
    _, fresh = prepare_data(cfg, tmp_path / "fresh", only=["web"], log=lambda s: None)
    assert m["splits"] == fresh["web"][2]["splits"]


def test_partial_from_other_settings_starts_over(tmp_path, raw, monkeypatch):
    monkeypatch.setattr(workers, "tokenize_unit", _raise_interrupt)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(data_cfg(raw), tmp_path / "out", only=["web"], log=lambda s: None)
    monkeypatch.undo()
    logs = []
    _, result = prepare_data(
        data_cfg(raw, shard_tokens=5000), tmp_path / "out", only=["web"], log=logs.append
    )
    assert any("starting it over" in line for line in logs)
    assert result["web"][2]["shard_tokens"] == 5000


def _raise_interrupt(job, tok, report):
    raise KeyboardInterrupt


def test_disk_full_is_a_clear_error_and_leaves_no_complete_looking_shard(
    tmp_path, raw, monkeypatch
):
    def full(self, tokens, lengths):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ShardWriter, "add_docs", full)
    with pytest.raises(DataError, match="No space left on device; free disk space.*kept"):
        prepare_data(data_cfg(raw), tmp_path / "out", only=["web"], log=lambda s: None)
    partial = tmp_path / "out" / "web.partial"
    assert not list(partial.glob("*.bin")) and not list(partial.glob("*.tmp"))
    monkeypatch.undo()
    _, result = prepare_data(data_cfg(raw), tmp_path / "out", only=["web"], log=lambda s: None)
    assert result["web"][2]["splits"]["train"]["docs"] > 0


def test_source_with_no_documents_says_why(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"body": "x"}\n' * 5)
    cfg = load_run_data(
        {
            "tokenizer": {"name": "byte"},
            "sources": {"w": {"name": "jsonl", "path": str(tmp_path / "a.jsonl")}},
            "workers": 1,
        }
    )
    with pytest.raises(
        DataError, match=r"'w' has no training documents; skipped: 5 missing field 'text'"
    ):
        prepare_data(cfg, tmp_path / "out", log=lambda s: None)


def test_out_dir_holding_other_data_is_refused(tmp_path, raw):
    prepare_data(data_cfg(raw), tmp_path / "out", only=["book"], log=lambda s: None)
    with pytest.raises(DataError, match="prepared from other inputs"):
        prepare_data(data_cfg(raw, val_fraction=0.2), tmp_path / "out", only=["book"], log=print)
    (tmp_path / "x" / "book").mkdir(parents=True)
    (tmp_path / "x" / "book" / "mine.txt").write_text("keep me")
    with pytest.raises(DataError, match="not a prepared dataset"):
        prepare_data(data_cfg(raw), tmp_path / "x", only=["book"], log=lambda s: None)


def test_tail_split_spans_units(tmp_path, raw):
    cfg = data_cfg(raw, val_split="tail", val_fraction=0.2)
    _, result = prepare_data(cfg, tmp_path / "out", only=["book"], log=lambda s: None)
    _, directory, m = result["book"]
    docs = [d + "\n" for d in make_docs(100, seed=1)]
    docs[-1] += "\n"  # the file's final newline
    assert len(m["splits"]["train"]["shards"]) > 1
    assert decoded(directory, m, "val") == docs[80:] and decoded(directory, m, "train") == docs[:80]


def test_tail_split_holds_out_the_last_pieces_of_one_file(tmp_path, raw):
    # one long text read as one document and cut by max_chars: the tail split counts pieces, so
    # the file's end is held out (nanoGPT's last 10%), where counting documents held out nothing
    book = {"name": "text", "path": str(raw / "book.txt"), "split": "file", "max_chars": 300}
    cfg = data_cfg(raw, sources={"book": book}, val_split="tail", val_fraction=0.2)
    _, result = prepare_data(cfg, tmp_path / "out", only=["book"], log=lambda s: None)
    _, directory, m = result["book"]
    pieces = list(split_long((raw / "book.txt").read_text(), 300))
    cut = round(len(pieces) * 0.8)
    assert len(pieces) > 20 and m["documents"] == 1
    assert decoded(directory, m, "train") == pieces[:cut]
    assert decoded(directory, m, "val") == pieces[cut:]
    # the tokenizer learns from the same training pieces
    source = cfg.sources["book"].build("book")
    split = make_split(source, 0.2, "tail", 0)
    assert list(train_documents(source, split)) == pieces[:cut]


def test_cut_anywhere_makes_pieces_of_exactly_max_chars(tmp_path, raw):
    # `cut: anywhere` cuts every max_chars characters, mid-sentence, so every piece but the last
    # fills a row after its BOS; nothing of the text is lost and the tail split counts pieces
    text = (raw / "book.txt").read_text()
    book = {"name": "text", "path": str(raw / "book.txt"), "split": "file", "max_chars": 127}
    cfg = data_cfg(raw, sources={"book": {**book, "cut": "anywhere"}}, val_split="tail")
    _, result = prepare_data(cfg, tmp_path / "out", only=["book"], log=lambda s: None)
    _, directory, m = result["book"]
    pieces = decoded(directory, m, "train") + decoded(directory, m, "val")
    assert "".join(pieces) == text
    assert {len(p) for p in pieces[:-1]} == {127} and 0 < len(pieces[-1]) <= 127
    assert any(not p.startswith(("\n", " ")) and p[0].islower() for p in pieces)  # mid-word
    # a dataset of its own: the paragraph cut's shards are another key, and a config that
    # leaves `cut` at its default keeps the key it had before `cut` existed
    para = cfg.sources["book"].model_copy(update={"cut": "paragraphs"}).build("book")
    assert "cut" in shard_options(cfg.sources["book"])
    assert shard_options(para.cfg) == para.cfg.model_dump(exclude={"weight", "long_docs", "cut"})
    split = make_split(para, 0.1, "tail", 0)
    tok = ByteTokenizer()
    assert dataset_key(para, tok, split) != dataset_key(
        cfg.sources["book"].build("book"), tok, split
    )


def test_cut_anywhere_without_max_chars_is_refused(tmp_path, raw, capsys):
    with pytest.raises(ValidationError, match="set max_chars"):
        TextConfig(path=str(raw / "book.txt"), cut="anywhere")
    tree = tiny_tree(raw, tmp_path / "runs")
    tree["data"]["sources"] = {
        "book": {"name": "text", "path": str(raw / "book.txt"), "cut": "anywhere"}
    }
    assert main(["data", "prepare", str(write_config(tmp_path / "run.yaml", tree))]) == 2
    err = capsys.readouterr().err
    assert "data.sources.book" in err and "set max_chars" in err and "Traceback" not in err


def test_hash_split_keeps_a_documents_pieces_together(tmp_path, raw):
    web = {"name": "jsonl", "path": str(raw / "a.jsonl"), "max_chars": 40}
    cfg = data_cfg(raw, sources={"web": web}, val_fraction=0.3)
    _, result = prepare_data(cfg, tmp_path / "out", only=["web"], log=lambda s: None)
    _, directory, m = result["web"]
    val = set(decoded(directory, m, "val"))
    # (a short last piece, "he", may also end a document on the other side)
    sides = [
        {p in val for p in split_long(doc, 40) if len(p) > 10}
        for doc in make_docs(200)
        if len(doc) > 40
    ]
    assert {True} in sides and {False} in sides and all(len(s) == 1 for s in sides)


# -- training on prepared shards -------------------------------------------------------------------


@pytest.fixture
def prepared(tmp_path, raw):
    assert main(prepare_args(tmp_path, raw)) == 0
    return tmp_path / "prep"


def prepare_args(tmp_path, raw) -> list[str]:
    cfg_path = write_config(tmp_path / "data.yaml", {"data": to_tree(data_cfg(raw))})
    return ["data", "prepare", str(cfg_path), "--out", str(tmp_path / "prep")]


def to_tree(cfg):
    from littlelm.config import to_tree as tree

    return tree(cfg)


def shards_run(tmp_path, prepared, **data) -> dict:
    tree = tiny_tree(tmp_path / "unused.txt", tmp_path / "runs")
    tree["data"] = {
        "tokenizer": {"name": "saved", "path": str(prepared / "web")},
        "sources": {
            "web": {"name": "shards", "path": str(prepared / "web"), "weight": 0.75},
            "book": {"name": "shards", "path": str(prepared / "book"), "weight": 0.25},
        },
        "buffer_docs": 16,
        **data,
    }
    return tree


def test_cli_prepare_prints_a_data_section_that_trains(tmp_path, raw, prepared, capsys):
    assert main(prepare_args(tmp_path, raw)) == 0  # already complete: reused, nothing redone
    out = capsys.readouterr().out
    assert "preparing" not in out
    snippet = yaml.safe_load(out[out.index("data:") :])
    assert snippet["data"]["sources"]["web"] == {
        "name": "shards",
        "path": str(prepared / "web"),
        "weight": 0.7,
    }
    cfg = load_run(write_config(tmp_path / "run.yaml", shards_run(tmp_path, prepared)))
    console = Console()  # what the CLI prints: start-up, progress and the realised mixture
    trainer = Trainer(cfg, resume="never", callbacks=(console,))
    result = trainer.fit()
    console.report(trainer, result)
    assert result["finished"] and set(result["mix"]) == {"web", "book"}
    records = [
        json.loads(line) for line in (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()
    ]
    train = [r for r in records if r["kind"] == "train"]
    assert all(0 <= r["crop_rate"] < 1 and abs(sum(r["mix"].values()) - 1) < 1e-9 for r in train)
    assert train[-1]["mix"] == {"web": 0.75, "book": 0.25}  # 24 rows: exactly 18 + 6
    assert "web 0.750 (target 0.750)" in capsys.readouterr().out


def test_tokenizer_mismatch_is_refused_naming_both(tmp_path, prepared):
    tree = shards_run(tmp_path, prepared, tokenizer={"name": "bpe", "vocab_size": 300})
    tree["data"]["sources"]["raw"] = {"name": "text", "path": str(tmp_path / "raw" / "book.txt")}
    cfg = load_run(write_config(tmp_path / "run.yaml", tree))
    with pytest.raises(
        DataError,
        match=r"made by tokenizer byte, 257 tokens .* this run's tokenizer is bpe, 300 tokens",
    ):
        build_data(cfg.data, log=lambda s: None)
    only_shards = shards_run(tmp_path, prepared, tokenizer={"name": "bpe"})
    cfg = load_run(write_config(tmp_path / "run2.yaml", only_shards))
    with pytest.raises(DataError, match="every source is prepared shards.*name: saved"):
        build_data(cfg.data, log=lambda s: None)


def test_shard_from_another_tokenizer_is_refused(tmp_path):
    tok = ByteTokenizer()
    write_shard(tmp_path / "train.bin", [np.array([256, 1, 2])], 257, 256, "cd" * 32)
    manifest = {
        "tokenizer": {"fingerprint": tok.fingerprint},
        "splits": {"train": {"shards": [{"file": "train.bin"}]}, "val": {"shards": []}},
    }
    with pytest.raises(DataError, match=r"train\.bin was made by a different tokenizer"):
        open_dataset("x", 1.0, tmp_path, manifest, tok, verify=True)


def test_inspect_reports_and_checks(prepared, capsys):
    assert main(["data", "inspect", str(prepared / "web"), "--samples", "2", "--chars", "40"]) == 0
    out = capsys.readouterr().out
    m = read_manifest(prepared / "web")
    assert f"{m['splits']['train']['tokens']:,}" in out and "train document lengths" in out
    assert out.count("sample: ") == 2 and "skipped: 1 malformed JSON" in out
    assert (
        f"checks: all {len(m['splits']['train']['shards']) + len(m['splits']['val']['shards'])}"
        in out
    )


def test_corrupt_shard_fails_inspect_and_training_cleanly(tmp_path, prepared, capsys):
    first = (
        prepared / "web" / read_manifest(prepared / "web")["splits"]["train"]["shards"][0]["file"]
    )
    data = bytearray(first.read_bytes())
    data[300] ^= 0xFF
    first.write_bytes(bytes(data))
    assert main(["data", "inspect", str(prepared / "web")]) == 2
    captured = capsys.readouterr()
    assert f"FAILED {first}: checksum mismatch" in captured.out
    assert captured.err.startswith("error: 1 of ") and "Traceback" not in captured.err
    cfg_path = write_config(tmp_path / "run.yaml", shards_run(tmp_path, prepared))
    assert main(["train", str(cfg_path)]) == 2
    assert "checksum mismatch" in capsys.readouterr().err
    with open(first, "r+b") as f:
        f.truncate(1000)
    assert main(["train", str(cfg_path)]) == 2
    assert "is truncated or damaged" in capsys.readouterr().err


def test_data_prepare_fills_the_cache_train_uses(tmp_path, raw, capsys):
    tree = tiny_tree(raw / "book.txt", tmp_path / "runs")
    cfg_path = write_config(tmp_path / "run.yaml", tree)
    assert main(["data", "prepare", str(cfg_path)]) == 0
    assert "preparing 'text'" in capsys.readouterr().out
    Trainer(load_run(cfg_path), resume="never").fit()
    assert "preparing" not in capsys.readouterr().out


def _damage(path, how: str) -> None:
    raw = bytearray(path.read_bytes())
    if how == "flip":
        raw[len(raw) // 2] ^= 0xFF  # inside the tokens: only the checksum tells
    else:
        raw = raw[:-10]
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_prepare_rebuilds_only_the_damaged_unit(tmp_path, raw, how):
    """Issue 24.3: with the manifest present prepare trusted the directory and did nothing; it
    now checks every shard, rebuilds the unit that holds a damaged one, and says so."""
    cfg = data_cfg(raw)
    _, result = prepare_data(cfg, tmp_path / "out", only=["web"], log=lambda s: None)
    directory, manifest = result["web"][1], result["web"][2]
    files = [s["file"] for s in manifest["splits"]["train"]["shards"]]
    victim = next(f for f in files if "-00001-" in f)
    original = {f.name: f.read_bytes() for f in directory.glob("*.bin")}
    before = shard_files(directory)
    _damage(directory / victim, how)
    logs = []
    _, again = prepare_data(cfg, tmp_path / "out", only=["web"], log=logs.append, verify="sizes")
    if how == "flip":  # a flipped byte keeps the size and header: sizes alone cannot see it
        assert not logs and (directory / victim).read_bytes() != original[victim]
    _, again = prepare_data(
        cfg, tmp_path / "out", only=["web"], log=logs.append, verify="checksums"
    )
    text = "\n".join(logs)
    assert f"{victim}: " + ("checksum mismatch" if how == "flip" else "truncated") in text
    assert "rebuilding 1 damaged shard(s)" in text and "unit(s) 1" in text
    assert f"rebuilt {victim}" in text
    assert {f.name: f.read_bytes() for f in directory.glob("*.bin")} == original
    after = shard_files(directory)
    unit1 = {n for n in before if "-00001-" in n}
    assert all(after[n] == before[n] for n in before if n not in unit1)  # others untouched
    assert again["web"][2]["splits"] == manifest["splits"]
    assert not (tmp_path / "out" / "web.partial").exists()
    logs.clear()
    prepare_data(cfg, tmp_path / "out", only=["web"], log=logs.append, verify="checksums")
    assert not logs  # nothing damaged: nothing rebuilt, nothing said


def test_prepare_rebuilds_a_dataset_made_before_plans_were_kept_whole(tmp_path, raw):
    import shutil

    cfg = data_cfg(raw)
    _, result = prepare_data(cfg, tmp_path / "out", only=["web"], log=lambda s: None)
    directory = result["web"][1]
    shutil.rmtree(directory / "units")
    (directory / "plan.json").unlink()
    original = {f.name: f.read_bytes() for f in directory.glob("*.bin")}
    victim = sorted(original)[-1]
    (directory / victim).unlink()
    logs = []
    prepare_data(cfg, tmp_path / "out", only=["web"], log=logs.append, verify="sizes")
    assert any(f"{victim}: missing" in line for line in logs)
    assert any("the whole dataset" in line for line in logs)
    assert {f.name: f.read_bytes() for f in directory.glob("*.bin")} == original


def test_damaged_prepared_shards_source_is_named(tmp_path, raw, capsys):
    _, result = prepare_data(data_cfg(raw), tmp_path / "out", only=["web"], log=lambda s: None)
    directory = result["web"][1]
    victim = sorted(directory.glob("train-*.bin"))[0]
    _damage(victim, "truncate")
    run = {
        "data": {
            "tokenizer": {"name": "saved", "path": str(directory)},
            "sources": {"web": {"name": "shards", "path": str(directory)}},
        }
    }
    assert main(["data", "prepare", str(write_config(tmp_path / "d.yaml", run))]) == 2
    err = capsys.readouterr().err
    assert f"data.sources.web: 1 damaged shard(s) in {directory} ({victim.name}: truncated" in err
    assert "--out` that made it" in err and "Traceback" not in err


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_train_on_a_damaged_shard_says_prepare_rebuilds_it_and_prepare_does(
    tmp_path, corpus, capsys, how
):
    """The whole loop a user meets: train fails naming `littlelm data prepare`, which rebuilds
    the shard with the same tokens, and train then works."""
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    cfg = str(write_config(tmp_path / "t.yaml", tiny_tree(corpus, tmp_path / "runs")))
    assert main(["data", "prepare", cfg, cache]) == 0
    (directory,) = (tmp_path / "cache" / "datasets").iterdir()
    shard = sorted(directory.glob("train-*.bin"))[0]
    original = shard.read_bytes()
    _damage(shard, how)
    capsys.readouterr()
    assert main(["train", cfg, cache]) == 2
    err = capsys.readouterr().err
    assert f"error: {shard}" in err and "run `littlelm data prepare` with the config" in err
    assert "Traceback" not in err
    assert main(["data", "prepare", cfg, cache]) == 0
    assert f"rebuilt {shard.name} in {directory}" in capsys.readouterr().out
    assert shard.read_bytes() == original
    assert main(["train", cfg, cache]) == 0
