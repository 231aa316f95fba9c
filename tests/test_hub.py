"""The `hf` source (data/hub.py): local `datasets` and parquet directories, downloads from the
hub (mocked at the huggingface_hub boundary: no network), offline mode."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import WORDS, write_config
from littlelm.cli import main
from littlelm.config import validate
from littlelm.data import hub as hubsrc
from littlelm.data.build import prepare_data
from littlelm.data.shards import Shard
from littlelm.data.tokenizer import ByteTokenizer
from littlelm.errors import DataError
from littlelm.schema import RunConfig

datasets = pytest.importorskip("datasets")
huggingface_hub = pytest.importorskip("huggingface_hub")


def texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"{i}: " + " ".join(rng.choice(WORDS, size=int(rng.integers(3, 40)))) for i in range(n)]


def prepare(tmp_path, source: dict, name: str = "out"):
    tree = {
        "tokenizer": {"name": "byte"},
        "sources": {"hub": {"name": "hf", **source}},
        "val_fraction": 0.0,
        "shard_tokens": 2000,
        "workers": 1,
    }
    cfg = validate(RunConfig, {"data": tree}).data
    _, result = prepare_data(cfg, out=tmp_path / name, log=lambda _: None)
    return result["hub"][1], result["hub"][2]


def decoded(directory, manifest) -> list[str]:
    tok, out = ByteTokenizer(), []
    for s in manifest["splits"]["train"]["shards"]:
        shard = Shard(directory / s["file"])
        out += [tok.decode(shard.doc(i)[1:].tolist()) for i in range(len(shard))]
    return out


def test_prepares_a_datasets_directory_split_and_template(tmp_path):
    train, val = texts(60), texts(10, seed=1)
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": train, "n": list(range(60))}),
            "validation": datasets.Dataset.from_dict({"text": val, "n": list(range(10))}),
        }
    )
    dd.save_to_disk(str(tmp_path / "saved"))
    directory, m = prepare(tmp_path, {"dataset": str(tmp_path / "saved")})
    assert sorted(decoded(directory, m)) == sorted(train)
    directory, m = prepare(
        tmp_path,
        {"dataset": str(tmp_path / "saved"), "split": "validation", "template": "#{n}\n{text}"},
        "out2",
    )
    assert sorted(decoded(directory, m)) == sorted(f"#{i}\n{t}" for i, t in enumerate(val))
    with pytest.raises(DataError, match="no split 'test'.*splits: train, validation"):
        prepare(tmp_path, {"dataset": str(tmp_path / "saved"), "split": "test"}, "out3")


def test_an_empty_saved_dataset_is_a_clear_error(tmp_path, capsys):
    """Issue 36.13: save_to_disk of 0 rows made load_from_disk raise IndexError (rc 1)."""
    empty = datasets.Dataset.from_dict({"text": []})
    empty.save_to_disk(str(tmp_path / "empty"))
    with pytest.raises(DataError, match=r"dataset: .*empty is a saved `datasets` dataset with no"):
        prepare(tmp_path, {"dataset": str(tmp_path / "empty")})
    full = datasets.Dataset.from_dict({"text": texts(5)})
    datasets.DatasetDict({"train": empty, "validation": full}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match=r"dd/train is a saved `datasets` dataset with no rows"):
        prepare(tmp_path, {"dataset": str(tmp_path / "dd")}, "out2")
    _, m = prepare(tmp_path, {"dataset": str(tmp_path / "dd"), "split": "validation"}, "out3")
    assert m["splits"]["train"]["docs"] == 5
    data = {
        "tokenizer": {"name": "byte"},
        "sources": {"hub": {"name": "hf", "dataset": str(tmp_path / "empty")}},
    }
    config = write_config(tmp_path / "data.yaml", {"data": data})
    capsys.readouterr()  # drop save_to_disk's progress bars
    assert main(["data", "prepare", str(config), "--out", str(tmp_path / "ds")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "with no rows" in err and "Traceback" not in err


def write_parquet(path, rows: list[str], group: int = 10) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table({"text": rows, "id": list(range(len(rows)))}), path, row_group_size=group
    )


def test_prepares_a_parquet_directory_and_a_subset_of_its_files(tmp_path):
    a, b = texts(50), texts(30, seed=2)
    write_parquet(tmp_path / "pq" / "data" / "train-00000.parquet", a)
    write_parquet(tmp_path / "pq" / "data" / "train-00001.parquet", b)
    directory, m = prepare(tmp_path, {"dataset": str(tmp_path / "pq")})
    assert sorted(decoded(directory, m)) == sorted(a + b)
    directory, m = prepare(
        tmp_path, {"dataset": str(tmp_path / "pq"), "files": "data/*00001.parquet"}, "sub"
    )
    assert sorted(decoded(directory, m)) == sorted(b)
    with pytest.raises(DataError, match="missing column 'body'"):
        cfg = {"dataset": str(tmp_path / "pq"), "field": "body", "on_error": "fail"}
        prepare(tmp_path, cfg, "bad")


# -- the hub, mocked -------------------------------------------------------------------------------

SHA = "0123456789abcdef0123456789abcdef01234567"
FILES = ["sample/10BT/000.parquet", "sample/10BT/001.parquet", "sample/10BT/002.parquet"]


class FakeHub:
    """dataset_info and hf_hub_download of a three-file dataset, writing into a private cache
    laid out as huggingface_hub's (so try_to_load_from_cache finds what was downloaded)."""

    def __init__(self, tmp_path, monkeypatch):
        self.cache = tmp_path / "hf-cache"
        self.rows = {f: texts(20, seed=i) for i, f in enumerate(FILES)}
        self.calls: list[str] = []
        self.failures: dict[str, int] = {}  # file -> failures left
        monkeypatch.setenv("LITTLELM_CACHE", str(tmp_path / "littlelm-cache"))  # no record yet
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(self.cache))
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(huggingface_hub, "hf_hub_download", self.download)
        monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", self.info)
        monkeypatch.setattr(hubsrc, "RETRY_WAIT", 0.0)

    def info(self, repo_id, revision=None, files_metadata=False):
        siblings = [SimpleNamespace(rfilename=f, size=1000) for f in [*FILES, "README.md"]]
        return SimpleNamespace(sha=SHA, siblings=siblings)

    def download(self, repo_id, filename, repo_type=None, revision=None):
        assert repo_type == "dataset" and revision == SHA
        self.calls.append(filename)
        if self.failures.get(filename, 0) > 0:
            self.failures[filename] -= 1
            raise ConnectionError("connection reset by peer")
        path = self.cache / "datasets--org--edu" / "snapshots" / SHA / filename
        write_parquet(path, self.rows[filename])
        return str(path)


HUB = {"dataset": "org/edu", "files": "sample/10BT/*.parquet"}


def test_interrupted_download_retries_then_resumes_from_the_cache(tmp_path, monkeypatch):
    hub = FakeHub(tmp_path, monkeypatch)
    hub.failures = {FILES[1]: 1}  # fails once, then succeeds on the retry
    directory, m = prepare(tmp_path, HUB)
    assert hub.calls == [FILES[0], FILES[1], FILES[1], FILES[2]]
    assert sorted(decoded(directory, m)) == sorted(t for f in FILES for t in hub.rows[f])
    assert m["source"]["hub"]["revision"] == SHA  # pinned commit recorded

    # a download that keeps failing stops with an error; the rerun fetches only what is missing
    (hub.cache / "datasets--org--edu" / "snapshots" / SHA / FILES[2]).unlink()
    hub.calls.clear()
    hub.failures = {FILES[2]: hubsrc.RETRIES}
    with pytest.raises(DataError, match="failed 3 times.*2 of 3 file.*run the same command again"):
        prepare(tmp_path, HUB, "again")
    hub.calls.clear()
    directory, m = prepare(tmp_path, HUB, "again")
    assert hub.calls == [FILES[2]]  # the two cached files are reused, not downloaded again
    assert len(decoded(directory, m)) == 60


def test_subset_and_split_resolved_by_datasets(tmp_path, monkeypatch):
    hub = FakeHub(tmp_path, monkeypatch)
    urls = [f"hf://datasets/org/edu@{SHA}/{f}" for f in FILES[:2]]
    builder = SimpleNamespace(config=SimpleNamespace(data_files={"train": urls}))
    seen = {}

    def load_dataset_builder(path, name=None, revision=None):
        seen.update(path=path, name=name, revision=revision)
        return builder

    monkeypatch.setattr(datasets, "load_dataset_builder", load_dataset_builder)
    directory, m = prepare(tmp_path, {"dataset": "org/edu", "subset": "sample-10BT"})
    assert seen == {"path": "org/edu", "name": "sample-10BT", "revision": SHA}
    assert hub.calls == FILES[:2] and len(decoded(directory, m)) == 40
    with pytest.raises(DataError, match="no such split.*splits: train"):
        prepare(tmp_path, {"dataset": "org/edu", "subset": "sample-10BT", "split": "test"}, "t")


def test_offline_without_cache_names_the_dataset_and_the_fix(tmp_path, monkeypatch, capsys):
    hub = FakeHub(tmp_path, monkeypatch)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    tree = {"data": {"tokenizer": {"name": "byte"}, "sources": {"edu": {"name": "hf", **HUB}}}}
    cfg = write_config(tmp_path / "run.yaml", tree)
    assert main(["data", "prepare", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "error: data.sources.edu: dataset 'org/edu'" in err and "HF_HUB_OFFLINE" in err
    assert "Traceback" not in err and hub.calls == []

    # resolved and downloaded once online, offline works from the cache; a missing file is named
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    prepare(tmp_path, HUB)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    hub.calls.clear()
    directory, m = prepare(tmp_path, {**HUB, "dedup": False}, "offline")
    assert hub.calls == [] and len(decoded(directory, m)) == 60
    (hub.cache / "datasets--org--edu" / "snapshots" / SHA / FILES[0]).unlink()
    with pytest.raises(DataError, match=r"1 of 3 file.*000\.parquet.*unset HF_HUB_OFFLINE"):
        prepare(tmp_path, {**HUB, "on_empty": "fail"}, "offline2")


def test_not_a_directory_nor_an_id(tmp_path):
    with pytest.raises(DataError, match="neither a directory nor a hub dataset id"):
        prepare(tmp_path, {"dataset": str(tmp_path / "nothing")})
