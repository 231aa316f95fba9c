"""Data files that change under a checkpointed run: a same-size edit outside the sampled
blocks, files compared by name (added after the old ones, inserted among them, deleted), and
what only the full verify catches."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from test_foreign import write_nanogpt
from test_shards import BOS, stream_of, write_llmc_dir

from conftest import tiny_tree, write_config
from littlelm.cli import main
from littlelm.data import cache


def run_on(tmp_path: Path, data_dir: Path) -> Path:
    tree = tiny_tree(tmp_path / "unused.txt", tmp_path / "runs", train={"max_steps": 3})
    tree["checkpoint"] = {"every": 3}
    tree["data"]["sources"] = {
        "web": {"name": "tokens", "format": "nanogpt", "path": str(data_dir)}
    }
    cfg = write_config(tmp_path / "run.yaml", tree)
    assert main(["train", str(cfg), "--resume", "never"]) == 0
    return cfg


def unsampled_offset(path: Path) -> int:
    """A byte offset of `path` that none of content_hash's sampled 4 KiB blocks covers."""
    size = path.stat().st_size
    covered = np.zeros(size, bool)
    for k in range(cache.SAMPLES + 2):
        a = max(0, min(size - cache.BLOCK, (size - cache.BLOCK) * k // (cache.SAMPLES + 1)))
        covered[a : a + cache.BLOCK] = True
    free = np.flatnonzero(~covered[1024:]) + 1024  # past llm.c's header
    assert len(free) > 64, "the file must be larger than the sampled blocks"
    return int(free[len(free) // 2]) // 2 * 2  # a whole uint16 token


def edit_in_place_keeping_mtime(path: Path, offset: int, n: int = 16) -> None:
    """Change n tokens at `offset` (same size, same inode), then set the mtime back."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        raw = np.frombuffer(f.read(2 * n), "<u2")
        f.seek(offset)
        f.write(np.where(raw == BOS, BOS, (raw + 1) % BOS).astype("<u2").tobytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        st.st_size,
        st.st_mtime_ns,
        st.st_ino,
    )


def test_a_same_size_edit_outside_the_sampled_blocks_is_refused(tmp_path, capsys):
    tokens, _ = stream_of(4000, longest=60)  # one file of ~120k tokens: far more than 18 blocks
    d = tmp_path / "web"
    d.mkdir()
    path = write_nanogpt(d / "fineweb_train_000001.bin", tokens)
    cfg = run_on(tmp_path, d)
    before = cache.content_hash(path)
    edit_in_place_keeping_mtime(path, unsampled_offset(path))
    assert cache.content_hash(path) == before  # what resume compared before the sha256
    capsys.readouterr()
    assert main(["train", str(cfg), "train.max_steps=5"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "changed since it was written" in err and "sha256" in err, err
    assert "data.on_changed=restart" in err and "Traceback" not in err


def test_an_edit_that_keeps_every_stat_field_takes_the_full_verify(tmp_path, capsys, monkeypatch):
    """What docs/data.md says is not detected without data.full_verify: an edit that keeps the
    size, mtime, ctime and inode (here the stat is held fixed, as only a raw write could)."""
    from littlelm import filehash

    tokens, _ = stream_of(4000, longest=60)
    d = tmp_path / "web"
    d.mkdir()
    path = write_nanogpt(d / "fineweb_train_000001.bin", tokens)
    cfg = run_on(tmp_path, d)
    real, held = filehash.FileStat.of, filehash.FileStat.of(path)
    fixed = classmethod(lambda cls, p: held if Path(p) == path else real(p))
    monkeypatch.setattr(filehash.FileStat, "of", fixed)
    edit_in_place_keeping_mtime(path, unsampled_offset(path))
    capsys.readouterr()
    assert main(["train", str(cfg), "train.max_steps=4"]) == 0  # trusted from its stat
    capsys.readouterr()
    assert main(["train", str(cfg), "train.max_steps=5", "data.full_verify=true"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "changed since it was written" in err, err


def grown_run(tmp_path: Path) -> tuple[Path, list[Path]]:
    tokens, _ = stream_of(400, longest=60)
    paths = write_llmc_dir(tmp_path / "web", tokens, 3000, None)
    return run_on(tmp_path, tmp_path / "web"), paths


def test_files_added_after_the_old_ones_continue_the_run(tmp_path, capsys):
    cfg, paths = grown_run(tmp_path)
    more, _ = stream_of(60, seed=5, longest=60)
    added = write_nanogpt(tmp_path / "web" / f"fineweb_train_{len(paths) + 1:06d}.bin", more)
    capsys.readouterr()
    assert main(["train", str(cfg), "train.max_steps=5"]) == 0
    out = capsys.readouterr().out
    assert "resumed from" in out and "1 data file(s) were added after" in out, out
    assert str(added) in out and "data position starts over" in out


def test_a_file_inserted_among_the_old_ones_is_refused_naming_it(tmp_path, capsys):
    cfg, paths = grown_run(tmp_path)
    inserted = write_nanogpt(tmp_path / "web" / "fineweb_train_000001a.bin", stream_of(5)[0])
    capsys.readouterr()
    assert main(["train", str(cfg), "train.max_steps=5"]) == 2
    err = capsys.readouterr().err
    assert str(inserted) in err and "sorts among the files" in err, err
    assert paths[1].name in err and "Traceback" not in err


def test_a_deleted_file_is_named_exactly(tmp_path, capsys):
    cfg, paths = grown_run(tmp_path)
    assert len(paths) >= 3
    paths[1].unlink()
    capsys.readouterr()
    assert main(["train", str(cfg), "train.max_steps=5"]) == 2
    err = capsys.readouterr().err
    assert f"file {paths[1].name} (at {paths[1]}" in err and "is gone" in err, err
    assert paths[2].name not in err  # an unchanged file is not blamed


def test_a_file_edited_in_place_with_its_mtime_kept_is_indexed_again(tmp_path):
    """The token index is keyed by the file's stat, ctime and inode included: a separator
    written in place (the mtime set back) makes new documents, not a stale index's."""
    from test_shards import open_source, trained_docs

    tokens, _ = stream_of(50)
    d = tmp_path / "web"
    d.mkdir()
    path = write_nanogpt(d / "fineweb_train_000001.bin", tokens)
    cfg = {"format": "nanogpt", "path": str(d)}
    before = open_source(cfg, tmp_path / "cache")[0]
    inside = int(np.flatnonzero(tokens != BOS)[10])  # a token inside a document
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(1024 + 2 * inside)
        f.write(np.uint16(BOS).tobytes())  # one more separator: one more document
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = open_source(cfg, tmp_path / "cache")[0]
    assert sum(len(v) for v in after) == sum(len(v) for v in before) + 1
    assert trained_docs(after) != trained_docs(before)
