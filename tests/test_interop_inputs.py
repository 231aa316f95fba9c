"""Issue 36 items 10-12: export and import under careless input (symlinked --out, a config.json
that does not describe its weights) and the file modes of what they write."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest

from littlelm.cli import main

pytest.importorskip("transformers")
from test_interop import FEATURES, _small_bpe, make_checkpoint, save_hf


def _links(tmp_path):
    (tmp_path / "empty").mkdir()
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    to_empty = tmp_path / "to_empty"
    to_empty.symlink_to(tmp_path / "empty")
    return [loop, dangling, to_empty]


@pytest.mark.parametrize("verb", ["export", "import"])
def test_out_that_is_a_symlink_is_a_clear_error(tmp_path, capsys, verb):
    if verb == "export":
        src, _ = make_checkpoint(tmp_path / "run")
    else:
        src = tmp_path / "hf"
        save_hf("llama", src)
    before = sorted(p.name for p in tmp_path.iterdir())
    for link in _links(tmp_path):
        capsys.readouterr()
        assert main([verb, str(src), "--out", str(link)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "Traceback" not in err, err
        assert f"--out {link} is a symbolic link" in err
        assert link.is_symlink()  # left as it was
    assert not any((tmp_path / "empty").iterdir())
    after = sorted(p.name for p in tmp_path.iterdir())
    assert after == sorted([*before, "empty", "loop", "dangling", "to_empty"])  # no .tmp left


@pytest.mark.parametrize("layers", [1_000_000, 100_000, 3])
def test_config_claiming_other_layers_is_refused_fast(tmp_path, capsys, layers):
    src = tmp_path / "hf"
    save_hf("llama", src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_hidden_layers"] = layers  # the weights hold 2
    (src / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    start = time.perf_counter()
    assert main(["import", str(src), "--out", str(tmp_path / "run")]) == 2
    assert time.perf_counter() - start < 10  # was minutes and gigabytes, then killed
    err = capsys.readouterr().err
    assert f"it says {layers} layers, the weights hold layers 0-1" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_config_claiming_another_vocabulary_is_refused(tmp_path, capsys):
    src = tmp_path / "hf"
    save_hf("llama", src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["vocab_size"] = 1_000_000_000  # the weights hold 300 rows
    (src / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    assert main(["import", str(src), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "model.embed_tokens.weight has 300 rows" in err and "Traceback" not in err


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_safetensors_get_the_mode_of_other_files(tmp_path, umask):
    old = os.umask(umask)
    try:
        path, _ = make_checkpoint(tmp_path / "run")
        assert main(["export", str(path), "--out", str(tmp_path / "hf")]) == 0
        stock, _ = make_checkpoint(tmp_path / "run2", **FEATURES["llama"])
        args = ["export", str(stock), "--out", str(tmp_path / "big"), "--max-shard-size", "20KB"]
        assert main(args) == 0
    finally:
        os.umask(old)
    want = 0o666 & ~umask
    assert _mode(path / "model.safetensors") == want == _mode(path / "state.json")
    assert (
        _mode(tmp_path / "hf" / "model.safetensors")
        == want
        == _mode(tmp_path / "hf" / "config.json")
    )
    shards = list((tmp_path / "big").glob("*.safetensors"))
    assert len(shards) > 1 and {_mode(p) for p in shards} == {want}


@pytest.mark.parametrize(
    "where", ["/dev/full/{name}", "{tmp}/a_file/{name}", "{tmp}/a_file/deeper/{name}"]
)
@pytest.mark.parametrize("flag, name", [("--out", "hf"), ("--gguf", "m.gguf")])
def test_export_to_a_path_under_a_file_is_a_clear_error(tmp_path, capsys, where, flag, name):
    """A path under a file (or a device) was a NotADirectoryError traceback; now rc 2 and a
    message naming the file in the way, before any work, and nothing written."""
    src, _ = make_checkpoint(tmp_path / "run", **FEATURES["llama"])
    (tmp_path / "a_file").write_text("not a directory")
    out = where.format(tmp=tmp_path, name=name)
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    assert main(["export", str(src), flag, out]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag} {out}: ") and "Traceback" not in err
    assert "is not a directory" in err and f"choose another {flag}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_gguf_and_out_both_create_missing_folders(tmp_path, capsys):
    """--out created its missing folders while --gguf refused them; both create them now."""
    pytest.importorskip("gguf")
    src, _ = make_checkpoint(tmp_path / "run", tok=_small_bpe(), **FEATURES["llama"])
    gguf, hf = tmp_path / "new" / "sub" / "m.gguf", tmp_path / "new2" / "sub" / "hf"
    assert main(["export", str(src), "--gguf", str(gguf), "--out", str(hf)]) == 0, (
        capsys.readouterr().err
    )
    assert gguf.is_file() and (hf / "config.json").is_file()
    refused, _ = make_checkpoint(tmp_path / "byte", **FEATURES["llama"])  # no BPE merges: no GGUF
    assert main(["export", str(refused), "--gguf", str(tmp_path / "new3" / "sub" / "m.gguf")]) == 2
    assert not (tmp_path / "new3").exists()  # a refused export leaves no folder behind
