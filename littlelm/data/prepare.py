"""Raw documents -> tokenizer -> token shards: one implementation for `littlelm data prepare`
and for `littlelm train`, which prepares (and caches) its sources the same way.

A prepared dataset is a directory:

    manifest.json                written last: its presence means the directory is complete
    tokenizer/                   the tokenizer the shards were made with
    train-00000-000.bin ...      shards of unit 0 (see shards.py), then unit 1, ...
    val-00000-000.bin ...

    plan.json, units/            how the input was cut into units, and each unit's shards

It is built in `NAME.partial/` and renamed into place. The source's input is cut into units of
about one shard (sources.py); units are tokenized in parallel (workers.py), each one's shards
renamed into place when complete and the unit then recorded in `units/`, so an interrupted
prepare starts again where it stopped: finished units are kept, a half-done unit is redone.
A complete dataset keeps its plan and unit records, so that `verify` can find a damaged shard's
unit and `littlelm data prepare` rebuild that unit alone (a dataset from before they were kept is
rebuilt whole). `resolve_tokenizer` trains (or finds in the cache) the tokenizer a run asks for.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import numpy as np

from littlelm.data.cache import digest
from littlelm.data.chat import chat_format
from littlelm.data.meter import Meter
from littlelm.data.shards import Shard, read_header
from littlelm.data.sources import Source, Unit
from littlelm.data.split import ValSplit
from littlelm.data.tokenizer import META, HFTokenizer, Tokenizer, TokenizerConfig
from littlelm.data.tokenizers import load_tokenizer
from littlelm.data.workers import UNITS, UnitJob, pool_size, run_units, unit_record_path
from littlelm.errors import DataError

MANIFEST = "manifest.json"
PLAN = "plan.json"
FORMAT = 2


def make_split(
    source: Source, fraction: float, mode: Literal["hash", "tail"], seed: int
) -> ValSplit:
    """The source's split; 'tail' counts its pieces first (one reading pass)."""
    n = sum(_count(source.pieces(d)) for d in source.documents()) if mode == "tail" else None
    return ValSplit(fraction, mode, seed, n)


def train_documents(source: Source, split: ValSplit) -> Iterator[str]:
    """The source's training pieces, in order."""
    index = 0
    for doc in source.documents():
        parts = list(source.pieces(doc))
        sides = split.sides(index, doc.encode("utf-8"), len(parts))
        index += len(parts)
        yield from (p for p, held in zip(parts, sides) if not held)


def _count(items: Iterator) -> int:
    return sum(1 for _ in items)


# -- tokenizer -------------------------------------------------------------------------------------


def resolve_tokenizer(
    cfg: TokenizerConfig,
    sources: dict[str, Source],
    splits: dict[str, ValSplit],
    root: Path,
    log=print,
) -> Tokenizer:
    """The run's tokenizer: built directly, or trained on the raw sources' training documents
    (in proportion to their weights) and cached under root/tokenizers."""
    cls = cfg.tokenizer_class()
    if not cls.trainable:
        return cls.from_config(cfg)
    raw = {k: s for k, s in sources.items() if not s.prepared}
    if not raw:
        raise DataError(
            f"data.tokenizer {cfg.name!r} is trained on raw documents, but every source is "
            "prepared shards; use the tokenizer they were made with: "
            "data.tokenizer={name: saved, path: DATASET_DIR}"
        )
    key = digest(
        {
            "tokenizer": cls.cache_identity(cfg),
            "sources": {k: s.identity() for k, s in raw.items()},
            "splits": {k: splits[k].key() for k in raw},
        }
    )
    target = root / "tokenizers" / f"{cfg.name}-{key}"
    if (target / META).is_file():
        return load_tokenizer(target)
    log(f"training a {cfg.name} tokenizer ({cls.vocab_size_for(cfg):,} tokens) -> {target}")
    t0 = time.time()
    tok = cls.train(cfg, _weighted_texts(raw, splits, cls.train_chars_for(cfg)))
    for note in tok.notes:
        log(note)
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tok.save(tmp)
    _rename_into_place(tmp, target)
    log(f"tokenizer trained in {time.time() - t0:.1f}s")
    return tok


def _weighted_texts(
    sources: dict[str, Source], splits: dict[str, ValSplit], chars: int | None
) -> Iterator[str]:
    """Training documents of every source, `chars` in all (None: no limit), shared by weight."""
    total = sum(s.cfg.weight for s in sources.values())
    budget = chars or 10**12
    for label, src in sources.items():
        share, seen = budget * src.cfg.weight / total, 0
        for doc in train_documents(src, splits[label]):
            if seen >= share:
                break
            if src.conversations:  # canonical JSON: the tokenizer learns from the words said
                doc = src.words(doc)
            seen += len(doc)
            yield doc


# -- preparing a source ----------------------------------------------------------------------------


def dataset_key(source: Source, tok: Tokenizer, split: ValSplit) -> str:
    key = {
        "source": source.identity(),
        "tokenizer": tok.fingerprint,
        "split": split.key(),
        "format": FORMAT,
    }
    if source.conversations:  # rendered with the tokenizer's chat format
        key["chat"] = chat_format(tok).identity()
    elif isinstance(tok, HFTokenizer):  # shards made when special-token text became control
        key["special_text"] = "ordinary"  # tokens are not found again (tokenizer.encode)
    return digest(key)


def dataset_dir(source: Source, tok: Tokenizer, split: ValSplit, root: Path) -> Path:
    return root / "datasets" / f"{source.label}-{dataset_key(source, tok, split)}"


def prepare_source(
    source: Source,
    tok: Tokenizer,
    split: ValSplit,
    out: Path,
    shard_tokens: int = 100_000_000,
    workers: int | None = None,
    log=print,
    progress=None,
    verify: str = "none",
) -> dict:
    """Tokenize `source` into shards under `out`; a complete copy is reused, a partial one
    (`out.partial`, left by an interrupted prepare) is resumed. `verify` ("none", "sizes" or
    "checksums", see `damaged_shards`) checks a complete copy first and rebuilds what is damaged."""
    key = dataset_key(source, tok, split)
    if (out / MANIFEST).is_file():
        manifest = _existing(out, key)
        damaged = damaged_shards(out, manifest, verify) if verify != "none" else {}
        if not damaged:
            return manifest
        return _rebuild(source, tok, split, out, manifest, damaged, workers, log, progress)
    if out.exists() and any(out.iterdir()):
        raise DataError(
            f"{out} exists and is not a prepared dataset ({MANIFEST} missing); "
            "choose another output directory or empty it"
        )
    partial = out.with_name(out.name + ".partial")
    with _locked(partial, log):
        if (out / MANIFEST).is_file():  # another process finished it while we waited
            return _existing(out, key)
        return _prepare_locked(
            source, tok, split, out, partial, key, shard_tokens, workers, log, progress
        )


def _existing(out: Path, key: str) -> dict:
    manifest = read_manifest(out)
    if manifest.get("key") != key:
        raise DataError(
            f"{out} holds data prepared from other inputs, options or tokenizer; delete it to "
            "prepare again, or choose another output directory"
        )
    return manifest


def _prepare_locked(
    source, tok, split, out, partial, key, shard_tokens, workers, log, progress
) -> dict:
    t0 = time.time()
    plan = _load_plan(partial, key, shard_tokens, log) or _make_plan(
        partial, source, tok, split, key, shard_tokens
    )
    units = [Unit.from_dict(u) for u in plan["units"]]
    records = _finished_units(partial, len(units))
    _clean_unfinished(partial, records)
    dups = plan.get("duplicates") or [[] for _ in units]
    # a plan written before tail counted pieces is a hash split's (a tail split's key changed),
    # which reads no index
    firsts = plan["first_piece"] if "first_piece" in plan else plan["first_doc"]
    jobs = [
        UnitJob(
            source.cfg,
            source.label,
            u,
            i,
            firsts[i],
            split,
            str(partial),
            shard_tokens,
            frozenset(dups[i]),
        )
        for i, u in enumerate(units)
        if i not in records
    ]
    workers = pool_size(jobs, workers)
    log(
        f"preparing {source.label!r} ({tok.describe()}) -> {out}: {len(units)} unit(s)"
        + (f", {len(records)} already done" if records else "")
        + (f", {workers} worker processes" if workers > 1 else ", tokenizing on every core")
    )
    meter = Meter(source.label, units, records, progress)

    def done(job: UnitJob, record: dict) -> None:
        records[job.uid] = record
        meter.unit_done(job.uid, record)

    try:
        run_units(jobs, tok, partial / "tokenizer", workers, meter.add, done)
    except KeyboardInterrupt:
        meter.close()
        log(
            f"interrupted: {len(records)} of {len(units)} units are done and kept in {partial}; "
            "run the same command again to finish"
        )
        raise
    meter.close()
    manifest = _manifest(source, tok, split, key, shard_tokens, units, records, time.time() - t0)
    _check_not_empty(source, manifest)
    (partial / MANIFEST).write_text(json.dumps(manifest, indent=1))
    _rename_into_place(partial, out)  # plan.json and units/ stay: a damaged unit can be rebuilt
    _log_summary(manifest, log)
    return manifest


# -- verifying and rebuilding a complete dataset ----------------------------------------------------


def damaged_shards(directory: Path, manifest: dict, level: str = "checksums") -> dict[str, str]:
    """{file: what is wrong} for every shard of the manifest that is missing, is not a shard,
    has another size than its header promises or a header that is not the one the manifest
    recorded (level "sizes": one header read per shard), or, at level "checksums", whose
    contents do not match its sha256 (reads every shard)."""
    damaged = {}
    for split in ("train", "val"):
        for rec in manifest["splits"][split]["shards"]:
            problem = _shard_problem(Path(directory) / rec["file"], rec, level == "checksums")
            if problem:
                damaged[rec["file"]] = problem
    return damaged


def _shard_problem(path: Path, rec: dict, full: bool) -> str | None:
    if not path.is_file():
        return "missing"
    try:
        h = read_header(path)
    except DataError:
        return "not a shard (bad header)"
    size = path.stat().st_size
    if size != h.file_size:
        return f"truncated or damaged ({size:,} bytes, its header promises {h.file_size:,})"
    if h.checksum != rec.get("sha256") or h.n_tokens != rec.get("tokens"):
        return "its header differs from the manifest's record"
    try:
        Shard(path, verify=full)
    except DataError as e:
        return "checksum mismatch" if "checksum" in str(e) else "inconsistent document offsets"
    return None


def _rebuild(source, tok, split, out, manifest, damaged, workers, log, progress) -> dict:
    """Rebuild the units that hold damaged shards (every unit of a dataset prepared before
    plans were kept) through the resumable path: the dataset moves back to `out.partial`, the
    damaged units' records are dropped, and preparing it again redoes exactly those."""
    partial = out.with_name(out.name + ".partial")
    key, shard_tokens = manifest["key"], manifest["shard_tokens"]  # as made, to rebuild the same
    for name, problem in damaged.items():
        log(f"{out / name}: {problem}")
    with _locked(partial, log):
        if not (out / MANIFEST).is_file():  # deleted while we waited: prepare it afresh
            return _prepare_locked(
                source, tok, split, out, partial, key, shard_tokens, workers, log, progress
            )
        recs = {r["file"]: r for sp in manifest["splits"].values() for r in sp["shards"]}
        damaged = {n: p for n in damaged if (p := _shard_problem(out / n, recs[n], True))}
        if not damaged:  # another process rebuilt them while we waited
            return _existing(out, key)
        if not (out / PLAN).is_file():  # made before plans were kept: any plan here is stale
            shutil.rmtree(partial / UNITS, ignore_errors=True)
            (partial / PLAN).unlink(missing_ok=True)
        _move_back(out, partial)
        units = _drop_damaged_units(partial, damaged)
        log(
            f"rebuilding {len(damaged)} damaged shard(s) of {out}: "
            + (f"unit(s) {', '.join(map(str, units))}" if units else "the whole dataset")
        )
        rebuilt = _prepare_locked(
            source, tok, split, out, partial, key, shard_tokens, workers, log, progress
        )
    log(f"rebuilt {', '.join(sorted(damaged))} in {out}")
    return rebuilt


def _move_back(out: Path, partial: Path) -> None:
    """Move a complete dataset's files into `partial`, the manifest last (until then `out` is
    still a dataset, so a prepare killed midway finds the missing files and finishes the move)."""
    for entry in out.iterdir():
        if entry.name not in (MANIFEST, ".lock"):
            target = partial / entry.name
            if target.is_dir():
                shutil.rmtree(target)
            os.replace(entry, target)
    (out / MANIFEST).unlink()
    shutil.rmtree(out)


def _drop_damaged_units(partial: Path, damaged: dict[str, str]) -> list[int]:
    """Forget the units holding a damaged shard (their shards are then deleted and redone);
    without a plan every unit is redone. Returns the units dropped, [] for all."""
    if not (partial / PLAN).is_file():
        return []
    dropped = []
    for path in sorted((partial / UNITS).glob("*.json")):
        try:
            record = json.loads(path.read_text())
            files = {s["file"] for shards in record["shards"].values() for s in shards}
        except (OSError, json.JSONDecodeError, KeyError):
            files = set(damaged)  # an unreadable record: redo that unit too
        if files & set(damaged):
            path.unlink()
            dropped.append(int(path.stem))
    return dropped


def _make_plan(
    partial: Path, source: Source, tok: Tokenizer, split: ValSplit, key: str, shard_tokens: int
) -> dict:
    shutil.rmtree(partial / "units", ignore_errors=True)
    for f in partial.glob("*.bin*"):
        f.unlink()
    per_token = _bytes_per_token(source, tok)
    target = max(1 << 12, int(shard_tokens * per_token))
    units = source.units(target)
    first_piece, duplicates = _scan(source, units, split.mode == "tail")
    tok.save(partial / "tokenizer")
    plan = {
        "key": key,
        "shard_tokens": shard_tokens,
        "target_bytes": target,
        "units": [u.to_dict() for u in units],
        "first_piece": first_piece,
        "duplicates": duplicates,
    }
    (partial / PLAN).write_text(json.dumps(plan))
    return plan


def _scan(source: Source, units: list[Unit], count: bool) -> tuple[list[int], list[list[int]]]:
    """One reading pass, when needed: the global number of each unit's first piece (for the
    tail split: `count`) and, per unit, the numbers of the documents that repeat an earlier one
    exactly (dedup). A document is known by a 64-bit hash of its text: 8 bytes per document in
    memory."""
    first_piece, first_doc, hashes = [0] * len(units), [0] * len(units), []
    if not (count or source.cfg.dedup):
        return first_piece, [[] for _ in units]
    n = pieces = 0
    for i, u in enumerate(units):
        first_piece[i], first_doc[i] = pieces, n
        h = []
        for doc in source.unit_documents(u):
            h.append(_doc_hash(doc))
            pieces += _count(source.pieces(doc)) if count else 0
        hashes.append(np.array(h, dtype=np.uint64))
        n += len(h)
    source.skipped.clear()
    if not source.cfg.dedup:
        return first_piece, [[] for _ in units]
    everything = np.concatenate(hashes) if n else np.zeros(0, np.uint64)
    keep = np.zeros(n, dtype=bool)
    keep[np.unique(everything, return_index=True)[1]] = True  # the first copy of each text
    return first_piece, [
        np.flatnonzero(~keep[a : a + len(h)]).tolist() for a, h in zip(first_doc, hashes)
    ]


def _doc_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def _load_plan(partial: Path, key: str, shard_tokens: int, log) -> dict | None:
    try:
        plan = json.loads((partial / PLAN).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if (
        plan.get("key") == key
        and plan.get("shard_tokens") == shard_tokens
        and (partial / "tokenizer" / META).is_file()
    ):
        return plan
    log(f"{partial}: left by a prepare of other inputs or settings; starting it over")
    return None


def _bytes_per_token(source: Source, tok: Tokenizer, sample_bytes: int = 1 << 18) -> float:
    """UTF-8 bytes per token on the first ~256 KB of the source, to size units like shards."""
    texts, n = [], 0
    for unit in source.units(sample_bytes):
        for doc in source.unit_documents(unit):
            texts.append(doc[:sample_bytes])
            n += len(texts[-1].encode("utf-8"))
            if n >= sample_bytes:
                break
        if n >= sample_bytes:
            break
    source.skipped.clear()
    tokens = len(tok.encode_docs(texts)[0]) if texts else 0
    return n / tokens if tokens else 4.0


def _finished_units(partial: Path, n_units: int) -> dict[int, dict]:
    """Records of units whose shards are all present and complete."""
    out = {}
    for uid in range(n_units):
        try:
            record = json.loads(unit_record_path(partial, uid).read_text())
            shards = [s for shards in record["shards"].values() for s in shards]
            if any(_shard_problem(partial / s["file"], s, full=False) for s in shards):
                continue
        except (OSError, json.JSONDecodeError, KeyError):
            continue
        out[uid] = record
    return out


def _clean_unfinished(partial: Path, records: dict[int, dict]) -> None:
    """Remove temporary files and any shard of a unit that did not finish."""
    keep = {s["file"] for r in records.values() for shards in r["shards"].values() for s in shards}
    for f in partial.glob("*.bin*"):
        if f.name not in keep:
            f.unlink()


def _manifest(source, tok, split, key, shard_tokens, units, records, seconds) -> dict:
    ordered = [records[i] for i in range(len(units))]
    skipped: Counter[str] = Counter()
    for r in ordered:
        skipped.update(r["skipped"])
    splits = {}
    for name in ("train", "val"):
        shards = [s for r in ordered for s in r["shards"][name]]
        splits[name] = {
            "shards": shards,
            "tokens": sum(s["tokens"] for s in shards),
            "docs": sum(s["docs"] for s in shards),
        }
    return {
        "format": FORMAT,
        "key": key,
        "label": source.label,
        "source": source.identity(),
        "tokenizer": {
            "fingerprint": tok.fingerprint,
            "describe": tok.describe(),
            "vocab_size": tok.vocab_size,
            "bos_id": tok.bos_id,
        },
        "split": split.key(),
        "shard_tokens": shard_tokens,
        "documents": sum(r["documents"] for r in ordered),
        "duplicates": sum(r.get("duplicates", 0) for r in ordered),
        "chars": sum(r["chars"] for r in ordered),
        "bytes": sum(r["bytes"] for r in ordered),
        "skipped": dict(skipped),
        "splits": splits,
        "seconds": round(seconds, 3),
        # conversations: a run on these shards trains on the assistant's tokens only
        **({"conversations": True} if source.conversations else {}),
        **({"pairs": True} if source.pairs else {}),  # DPO's: two documents per pair
    }


def _check_not_empty(source: Source, manifest: dict) -> None:
    if manifest["splits"]["train"]["docs"] == 0:
        skipped = manifest["skipped"]
        why = f"; skipped: {_skips(skipped)}" if skipped else ""
        raise DataError(
            f"source {source.label!r} has no training documents{why}; check its path"
            + (", field or column" if skipped else "")
            + " and data.val_fraction"
        )


def _skips(skipped: dict) -> str:
    return ", ".join(f"{n:,} {reason}" for reason, n in sorted(skipped.items()))


def duplicates_note(label: str, m: dict, prepared_here: bool = True) -> str | None:
    """What a run and `data prepare` say of a source's exact duplicates dropped when it was
    prepared (dedup: true, the default): how many, and how to repeat documents on purpose."""
    n = m.get("duplicates") or 0
    if not n:
        return None
    fix = (
        f"data.sources.{label}.dedup=false keeps every copy"
        if prepared_here
        else f"prepare {m.get('label', label)!r} again with dedup: false to keep every copy"
    )
    return (
        f"data.sources.{label}: {n:,} exact duplicate document(s) were dropped when it was "
        f"prepared (dedup: true, the default; {m.get('documents', 0):,} kept), so repeating "
        f"documents in the input does not upsample them: {fix}, and a higher weight gives a "
        "source a larger share of the training tokens"
    )


def _log_summary(m: dict, log) -> None:
    tr, va = m["splits"]["train"], m["splits"]["val"]
    secs = max(m["seconds"], 1e-9)
    n = tr["tokens"] + va["tokens"]
    log(
        f"prepared {m['label']!r}: {n:,} tokens (train {tr['tokens']:,} in {len(tr['shards'])} "
        f"shard(s), val {va['tokens']:,}) from {m['documents']:,} documents, "
        f"{m['bytes'] / 1e6:.1f} MB, in {secs:.1f}s"
        + (f"; skipped: {_skips(m['skipped'])}" if m["skipped"] else "")
    )
    if va["docs"] == 0 and m["split"]["fraction"] > 0:
        log(f"warning: {m['label']!r} has no validation documents; raise data.val_fraction")


@contextmanager
def _locked(partial: Path, log):
    """Hold an exclusive lock on `partial` (created if needed) while preparing into it."""
    partial.mkdir(parents=True, exist_ok=True)
    with open(partial / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another process preparing {partial} ...")
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError as e:  # ENOLCK, EOPNOTSUPP: a filesystem without locks (some NFS)
            warnings.warn(
                f"cannot lock {partial} ({e.strerror}); preparing without a lock: make sure no "
                "other process prepares the same dataset at the same time",
                stacklevel=3,
            )
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _rename_into_place(tmp: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, target)
    except OSError:
        if (target / MANIFEST).is_file() or (target / META).is_file():  # another process won
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            raise
    (target / ".lock").unlink(missing_ok=True)


def read_manifest(directory: Path) -> dict:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise DataError(
            f"{directory} is not a prepared dataset ({MANIFEST} missing); run `littlelm data prepare`"
        )
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"{path} is unreadable ({e}); prepare the data again") from None
