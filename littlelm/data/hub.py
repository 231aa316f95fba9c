"""The `hf` source: a Hugging Face hub dataset, or a local copy of one, as raw documents.

    edu:   {name: hf, dataset: HuggingFaceFW/fineweb-edu, subset: sample-10BT}
    math:  {name: hf, dataset: open-web-math/open-web-math, files: "data/train-0000[0-3]-*"}
    qa:    {name: hf, dataset: ~/data/my_qa, template: "Q: {question}\nA: {answer}"}
    local: {name: hf, dataset: ~/downloads/pubmed/, field: abstract}

A hub dataset is downloaded once, file by file, into the Hugging Face cache (HF_HUB_CACHE) with
`huggingface_hub.hf_hub_download`, which resumes a file interrupted mid-way; a failed file is
retried, and a rerun downloads only the files still missing. The files of a subset and split
are those `datasets` resolves for it (its data_files), or the repository's files matching
`files`. What was resolved (commit, files) is recorded in the littlelm cache
(`$LITTLELM_CACHE/hub/`), so later runs, offline ones included (HF_HUB_OFFLINE=1), read the same
commit's files from the cache without asking the hub; offline, a file not in the cache is an
error naming it. The files are then prepared like any source (parquet by row-group ranges,
Arrow and JSONL whole), and never streamed during training.

A local directory is one written by `datasets` (`save_to_disk`, a Dataset or a DatasetDict, of
which `split` is taken) or a directory of parquet / JSONL files (`files` patterns narrow it).
"""

from __future__ import annotations

import fnmatch
import json
import os
import string
import time
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from littlelm.config import named
from littlelm.data.cache import cache_root, digest
from littlelm.data.records import ParquetFiles, open_lines
from littlelm.data.sources import DocumentSourceConfig, Unit, find_files, shard_options
from littlelm.errors import DataError
from littlelm.extras import require

DATA_PATTERNS = ("*.parquet", "*.arrow", "*.jsonl", "*.jsonl.gz", "*.jsonl.zst", "*.json.gz")
RETRIES = 3  # attempts per file before the download stops with an error
RETRY_WAIT = 5.0  # seconds before the first retry, doubled after each


class HFConfig(DocumentSourceConfig):
    """A Hugging Face dataset (hub id or local copy), one document per row."""

    name: Literal["hf"] = named("hf")
    dataset: str = Field(
        ...,
        description="A hub dataset id (owner/name), or a local directory: one written by "
        "`datasets` save_to_disk, or of parquet / JSONL files.",
    )
    subset: str | None = Field(
        None, description="The dataset's configuration (subset), e.g. sample-10BT; null = default."
    )
    split: str = Field("train", description="The split to take (train, validation, ...).")
    field: str = Field("text", description="Column holding each row's text.")
    template: str | None = Field(
        None,
        description="Instead of `field`: a text made of several columns, Python format syntax, "
        'e.g. "{question}\\n{answer}".',
    )
    files: str | list[str] | None = Field(
        None,
        description="Glob patterns of the files to take (paths in the repository or directory), "
        "to prepare a subset, e.g. sample/10BT/00[0-4]_*.parquet; null = the split's files.",
    )
    revision: str | None = Field(
        None,
        description="Hub branch, tag or commit; null = main, pinned at the first download.",
    )

    @field_validator("template")
    @classmethod
    def _names(cls, v: str | None) -> str | None:
        if v is not None and not template_fields(v):
            raise ValueError("a template names at least one column, e.g. '{title}\\n{text}'")
        return v

    def build(self, label: str) -> HubDataset:
        return HubDataset(self, label)


def template_fields(template: str) -> list[str]:
    """The column names a template uses, in order, once each."""
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise ValueError(f"template {template!r}: {e}") from None
    if any(not n.isidentifier() for n in names):
        raise ValueError(f"template {template!r}: fields are plain column names, like {{text}}")
    return list(dict.fromkeys(names))


class HubDataset(ParquetFiles):
    """A Hugging Face dataset (hub id or local copy), one document per row."""

    # HFConfig is not a ParquetConfig (`dataset` and `field` where it has `path` and `column`);
    # the methods that read those (files, columns, text_column) are overridden here
    cfg: HFConfig  # type: ignore[assignment]  # not a ParquetConfig (above)
    patterns = DATA_PATTERNS
    noun = "dataset files"

    def __init__(self, cfg: HFConfig, label: str):
        super().__init__(cfg, label)
        self._files: list[Path] | None = None
        self._record: dict | None = None

    @cached_property
    def columns(self) -> list[str]:
        return template_fields(self.cfg.template) if self.cfg.template else [self.cfg.field]

    @property
    def text_column(self) -> str | None:
        return None if self.cfg.template else self.cfg.field

    @property
    def key(self) -> str:
        return f"data.sources.{self.label}"

    def local(self) -> Path | None:
        p = Path(self.cfg.dataset).expanduser()
        if p.is_dir():
            return p
        if (
            p.exists()
            or self.cfg.dataset.startswith((".", "/", "~"))
            or self.cfg.dataset.count("/") != 1
        ):
            raise DataError(
                f"{self.key}.dataset: {self.cfg.dataset!r} is neither a directory nor a hub "
                "dataset id (owner/name); fix the path or the id"
            )
        return None

    # -- files ------------------------------------------------------------------------------------

    def files(self) -> list[Path]:
        if self._files is None:
            local = self.local()
            self._files = self._local_files(local) if local else self._hub_files()
        return self._files

    def _local_files(self, root: Path) -> list[Path]:
        if (root / "dataset_dict.json").is_file() or (root / "state.json").is_file():
            return self._saved_files(root)
        files = find_files(str(root), DATA_PATTERNS, f"{self.key}.dataset", self.noun)
        if self.cfg.files:
            files = [f for f in files if self._wanted(str(f.relative_to(root)))]
            if not files:
                raise DataError(
                    f"{self.key}.files: no file of {root} matches {self.cfg.files}; fix the patterns"
                )
        return files

    def _saved_files(self, root: Path) -> list[Path]:
        """The Arrow files of a `datasets` save_to_disk directory (the split of a DatasetDict)."""
        datasets = require("datasets", "hub", f"the hf source ({self.key})")
        saved = root
        if (root / "dataset_dict.json").is_file():
            splits = _json(root / "dataset_dict.json", self.key).get("splits") or []
            if self.cfg.split not in splits:
                raise DataError(
                    f"{self.key}.split: {root} has no split {self.cfg.split!r} (splits: "
                    f"{', '.join(map(str, splits))}); set {self.key}.split to one of them"
                )
            saved = root / self.cfg.split
        # load_from_disk of 0 rows raises IndexError (datasets 5.2): say what it is instead
        if not _json(saved / "state.json", self.key).get("_data_files"):
            raise DataError(
                f"{self.key}.dataset: {saved} is a saved `datasets` dataset with no rows (no data "
                "files in its state.json); give a dataset that has rows, or remove the source"
            )
        try:
            ds = datasets.load_from_disk(str(saved))
        except (OSError, ValueError, IndexError, KeyError) as e:
            raise DataError(
                f"{self.key}.dataset: cannot load {saved} with datasets.load_from_disk "
                f"({type(e).__name__}: {e}); re-save it with save_to_disk"
            ) from None
        return [Path(f["filename"]) for f in ds.cache_files]

    def _wanted(self, path: str) -> bool:
        files = self.cfg.files
        assert files is not None, "called only when `files` is set"
        pats = [files] if isinstance(files, str) else files
        return any(fnmatch.fnmatch(path, p) for p in pats)

    def identity(self) -> dict:
        if self.local() is not None:
            return super().identity()
        record = self.record()  # the commit and its files name the input; no download needed
        return {"config": shard_options(self.cfg), "hub": record}

    # -- the hub ----------------------------------------------------------------------------------

    def record_path(self) -> Path:
        query = self.cfg.model_dump(include={"dataset", "subset", "split", "files", "revision"})
        slug = self.cfg.dataset.replace("/", "--")
        return cache_root() / "hub" / f"{slug}-{digest(query)}.json"

    def describe(self) -> str:
        parts = [f"dataset {self.cfg.dataset!r}"]
        parts += [f"subset {self.cfg.subset!r}"] if self.cfg.subset else []
        return ", ".join([*parts, f"split {self.cfg.split!r}"])

    def record(self) -> dict:
        """{repo, revision (a commit), files: [[path, size], ...]}: resolved once, then read
        from the littlelm cache."""
        if self._record is None:
            path = self.record_path()
            if path.is_file():
                self._record = json.loads(path.read_text())
            else:
                self._record = self._resolve()
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
                tmp.write_text(json.dumps(self._record, indent=1))
                os.replace(tmp, path)
        return self._record

    def _hub(self):
        return require("huggingface_hub", "hub", f"the hf source ({self.key})")

    def _resolve(self) -> dict:
        hub = self._hub()
        if _offline():
            raise DataError(
                f"{self.key}: {self.describe()} is not in the cache and HF_HUB_OFFLINE is set; "
                "run once with network access (unset HF_HUB_OFFLINE) to download it, or set "
                f"{self.key}.dataset to a local copy"
            )
        try:
            info = hub.HfApi().dataset_info(
                self.cfg.dataset, revision=self.cfg.revision, files_metadata=True
            )
        except Exception as e:  # not found, gated, no network: the library's message says which
            raise DataError(
                f"{self.key}: cannot open {self.describe()} on the hub ({type(e).__name__}: "
                f"{_first_line(e)}); check the id and revision, your network, and for a gated "
                "dataset your token (`hf auth login`)"
            ) from None
        sizes = {s.rfilename: s.size or 0 for s in info.siblings or []}
        wanted = self._split_files(info.sha, sorted(sizes))
        return {
            "repo": self.cfg.dataset,
            "revision": info.sha,
            "files": [[f, sizes.get(f, 0)] for f in wanted],
        }

    def _split_files(self, sha: str, repo_files: list[str]) -> list[str]:
        if self.cfg.files:
            found = [f for f in repo_files if self._wanted(f)]
            if not found:
                raise DataError(
                    f"{self.key}.files: no file of {self.cfg.dataset} matches {self.cfg.files}; "
                    "fix the patterns (paths are relative to the repository root)"
                )
            return found
        return self._data_files(sha)

    def _data_files(self, sha: str) -> list[str]:
        """The split's files as `datasets` resolves them for the subset (repository paths)."""
        datasets = require("datasets", "hub", f"the hf source ({self.key})")
        try:
            builder = datasets.load_dataset_builder(self.cfg.dataset, self.cfg.subset, revision=sha)
        except Exception as e:
            raise DataError(
                f"{self.key}: `datasets` cannot resolve the files of {self.describe()} "
                f"({type(e).__name__}: {_first_line(e)}); check subset, or name the files: "
                f"{self.key}.files=PATTERN"
            ) from None
        data_files = builder.config.data_files or {}
        if self.cfg.split not in data_files:
            raise DataError(
                f"{self.key}.split: {self.describe()} has no such split (splits: "
                f"{', '.join(data_files) or 'none'}); set {self.key}.split"
            )
        return [_repo_path(str(url), sha) for url in data_files[self.cfg.split]]

    def _hub_files(self) -> list[Path]:
        """Local paths of the recorded files, downloading the missing ones."""
        hub = self._hub()
        record, paths, missing = self.record(), [], []
        repo, sha = record["repo"], record["revision"]
        for name, _ in record["files"]:
            cached = hub.try_to_load_from_cache(repo, name, revision=sha, repo_type="dataset")
            if isinstance(cached, str):
                paths.append(Path(cached))
            elif _offline():
                missing.append(name)
            else:
                paths.append(self._download(hub, repo, name, sha, len(paths), len(record["files"])))
        if missing:
            raise DataError(
                f"{self.key}: {len(missing)} of {len(record['files'])} file(s) of "
                f"{self.describe()} are not in the Hugging Face cache "
                f"({_hub_cache()}): {', '.join(missing[:5])}"
                + (" ..." if len(missing) > 5 else "")
                + "; unset HF_HUB_OFFLINE and run again to download them"
            )
        return paths

    def _download(self, hub, repo: str, name: str, sha: str, done: int, total: int) -> Path:
        """One file into the cache; a failure is retried (the library resumes the partial
        file), then is an error that keeps every finished file."""
        from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError

        for attempt in range(RETRIES):
            try:
                return Path(hub.hf_hub_download(repo, name, repo_type="dataset", revision=sha))
            except (RepositoryNotFoundError, EntryNotFoundError) as e:
                raise DataError(f"{self.key}: {repo}/{name}: {_first_line(e)}") from None
            except Exception as e:  # network, disk: retried, then reported
                if attempt + 1 == RETRIES:
                    raise DataError(
                        f"{self.key}: downloading {name} of {self.describe()} failed "
                        f"{RETRIES} times ({type(e).__name__}: {_first_line(e)}); {done} of "
                        f"{total} file(s) are in the cache: run the same command again to "
                        "resume (a partly downloaded file continues where it stopped)"
                    ) from None
                time.sleep(RETRY_WAIT * 2**attempt)
        raise AssertionError("unreachable")

    # -- documents --------------------------------------------------------------------------------

    def _ranges(self, path: Path, size: int, target: int) -> list:
        return super()._ranges(path, size, target) if path.suffix == ".parquet" else []

    def _read_unit(self, unit: Unit) -> Iterator[str]:
        import pyarrow as pa

        for f in unit.files:
            path = Path(f)
            try:
                if path.suffix == ".parquet":
                    yield from self._parquet(path, unit.start, unit.stop)
                elif path.suffix == ".arrow":
                    yield from self._arrow(path)
                else:
                    yield from self._jsonl(path)
            except (OSError, EOFError, ValueError, pa.ArrowException) as e:
                self.bad(f"unreadable file ({type(e).__name__}: {e})", path)

    def _arrow(self, path: Path) -> Iterator[str]:
        """A `datasets` Arrow file (the IPC stream format), memory-mapped."""
        import pyarrow as pa

        with pa.memory_map(str(path)) as source:
            reader = pa.ipc.open_stream(source)
            if self._usable(reader.schema, path):
                for batch in reader:
                    yield from self._batch_texts(batch.select(self.columns), path)

    def _batch_texts(self, batch, path: Path) -> Iterator[str]:
        if self.cfg.template is None:
            yield from super()._batch_texts(batch, path)
            return
        columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
        for values in zip(*columns):
            text = self._fill(dict(zip(self.columns, values)), path)
            if text is not None:
                yield text

    def _fill(self, row: dict, where) -> str | None:
        """The row's text: its field, or the template filled in."""
        if self.cfg.template is None:
            value = row.get(self.cfg.field)
            if not isinstance(value, str):
                what = "missing" if value is None else "not text in"
                self.bad(f"{what} field {self.cfg.field!r}", where)
                return None
            return value
        missing = [c for c in self.columns if row.get(c) is None]
        if missing:
            self.bad(f"missing field {missing[0]!r}", where)
            return None
        return self.cfg.template.format_map(row)

    def _where(self, path: Path, n: int) -> str:
        """How a bad row's place is named in messages."""
        return f"{path} (line {n})"

    def _jsonl(self, path: Path) -> Iterator[str]:
        for n, line in enumerate(open_lines(path), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                self.bad("malformed JSON", self._where(path, n))
                continue
            text = self._fill(row if isinstance(row, dict) else {}, self._where(path, n))
            if text is not None:
                yield text


def _json(path: Path, key: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(
            f"{key}.dataset: {path} is unreadable ({type(e).__name__}: {e}); re-save the "
            "dataset with save_to_disk"
        ) from None
    if not isinstance(data, dict):
        raise DataError(f"{key}.dataset: {path} is not a `datasets` file (not a JSON object)")
    return data


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _hub_cache() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _repo_path(url: str, sha: str) -> str:
    """'hf://datasets/owner/name@SHA/sample/10BT/x.parquet' -> 'sample/10BT/x.parquet'."""
    _, sep, rest = url.partition(f"@{sha}/")
    if not sep:
        _, sep, rest = url.partition("@")
        rest = rest.partition("/")[2]
    return rest


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]
