"""Data pipeline throughput: `data prepare` beside the tokenizer's own batch speed, and the loader.

    .venv/bin/python benchmarks/data.py [--mb 32] [--repeats 2] [--seconds 5] [--work DIR]

1. Builds a JSONL corpus (8 files) of about --mb MB from the Python standard library's sources
   and the Tiny Shakespeare paragraphs shipped in data/.
2. For each tokenizer (the GPT-2 tiktoken encoding when its file is available, a byte-level BPE
   trained here with `tokenizers`): the raw throughput of its batch encoder on the corpus's
   documents (1 MB batches, every core), then a full `prepare_source` of the same corpus (read,
   split, tokenize, write shards with checksums, manifest) with every core, as MB/s of text and
   tokens/s, and their ratio (target: prepare >= 90% of raw); with the default worker count,
   the same with exact dedup off (its cost), and with one worker process per core (what a
   large corpus gets). The two are measured alternately
   --repeats times and the best of each is kept, so a busy shared machine hurts both alike.
3. The loader on one core: a four-source mixture (weights 0.6/0.15/0.15/0.1) with BOS-aligned
   best-fit packing, seq 2048, batch 32, on synthetic shards with realistic (log-normal) document
   lengths, the same with long documents cut into pieces of at most 2048 tokens (what
   `max_chars` does at prepare time), short ones, and one document per source (a whole book:
   under split every row is a piece of it), each packed with long_docs=crop and
   long_docs=split: tokens/s and tokens per CPU-second of the loader thread (target >= 5M),
   crop rate, split rate, and the size of the loader state a checkpoint keeps and the time to
   make it (target: one long document's no larger than the short documents'). --loader-only
   skips 1-2.
4. Other tools' token files (data/foreign.py): --shards (528) small nanoGPT / llm.c `.bin` files
   generated here as llm.c's fineweb script fills them (one stream of documents cut every
   --shard-tokens tokens, so documents continue from one file into the next), and the same
   documents as as many littlelm shards: the time to open every shard (the first open builds and
   caches each file's index and joins the documents cut at file ends; the second reads them),
   the time from nothing open to the first batch (target: within 2x of littlelm's), the
   warning lines the open printed (target: none), the
   resident memory that opening them added beside the size of their document index, and the
   loader's tokens per CPU-second on each (target: foreign >= 0.8x littlelm shards, start-up
   < 5 s, RSS not growing with the shard count beyond the index). --foreign-only runs only 4.
Prints markdown tables (paste them into benchmarks/RESULTS.md with the date and machine).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("LITTLELM_SHARED") or ROOT.parent / "shared")  # gpt2.tiktoken, if any
SHAKESPEARE = ROOT / "data" / "tinyshakespeare.txt"  # shipped in the repository


def make_corpus(directory: Path, megabytes: float) -> list[str]:
    """Write the corpus as 8 JSONL files; return its documents in file order."""
    docs, size, limit = [], 0, int(megabytes * 1e6)
    for p in SHAKESPEARE.read_text().split("\n\n"):
        if p.strip():
            docs.append(p)
            size += len(p.encode())
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for f in sorted(stdlib.rglob("*.py")):
        if size >= limit:
            break
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            docs.append(text)
            size += len(text.encode())
    directory.mkdir(parents=True, exist_ok=True)
    files = [[] for _ in range(8)]
    for i, d in enumerate(docs):
        files[i * 8 // len(docs)].append(d)
    ordered = []
    for k, part in enumerate(files):
        with open(directory / f"part{k}.jsonl", "w") as fh:
            for d in part:
                fh.write(json.dumps({"text": d}) + "\n")
        ordered += part
    return ordered


def tokenizers(work: Path, docs: list[str]):
    from littlelm.data.tiktoken_tokenizer import TiktokenConfig, TiktokenTokenizer
    from littlelm.data.tokenizer import BPEConfig, BPETokenizer

    gpt2 = SHARED / "data" / "tokenizers" / "gpt2.tiktoken"
    if gpt2.is_file():
        cfg = TiktokenConfig(name="tiktoken", encoding="gpt2", file=str(gpt2))
        yield "tiktoken gpt2", TiktokenTokenizer.from_config(cfg), ""
    else:
        print(f"(no {gpt2}: tiktoken skipped)", file=sys.stderr)
    t0 = time.perf_counter()
    bpe = BPETokenizer.train(
        BPEConfig(name="bpe", vocab_size=8192, train_chars=4_000_000), iter(docs)
    )
    yield "bpe 8192 (trained here)", bpe, f"trained on 4M chars in {time.perf_counter() - t0:.1f}s"


def raw_throughput(tok, docs: list[str]) -> tuple[float, float, float]:
    """(seconds, MB/s, tokens/s) of tok.encode_batch over the documents in ~1 MB batches."""
    batches, batch, size = [], [], 0
    for d in docs:
        batch.append(d)
        size += len(d.encode())
        if size >= 1 << 20:
            batches.append(batch)
            batch, size = [], 0
    if batch:
        batches.append(batch)
    nbytes = sum(len(d.encode()) for d in docs)
    t0 = time.perf_counter()
    tokens = sum(len(ids) for b in batches for ids in tok.encode_batch(b))
    secs = time.perf_counter() - t0
    return secs, nbytes / secs / 1e6, tokens / secs


def prepare_throughput(
    tok, raw_dir: Path, out: Path, workers: int | None, dedup: bool = True
) -> tuple[float, float, float, int]:
    """(seconds, MB/s, tokens/s, shards) of a complete prepare_source of the corpus."""
    from littlelm.data.prepare import prepare_source
    from littlelm.data.records import JSONLConfig, JSONLFiles
    from littlelm.data.split import ValSplit
    from littlelm.progress import Progress

    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(out.with_name(out.name + ".partial"), ignore_errors=True)
    src = JSONLFiles(JSONLConfig(name="jsonl", path=str(raw_dir), dedup=dedup), "bench")
    quiet = Progress(open(os.devnull, "w"))  # noqa: SIM115
    t0 = time.perf_counter()
    m = prepare_source(
        src, tok, ValSplit(0.01, "hash", 0), out, 2_000_000, workers, lambda s: None, quiet
    )
    secs = time.perf_counter() - t0
    tokens = m["splits"]["train"]["tokens"] + m["splits"]["val"]["tokens"]
    shards = len(m["splits"]["train"]["shards"]) + len(m["splits"]["val"]["shards"])
    return secs, m["bytes"] / secs / 1e6, tokens / secs, shards


REALISTIC = {"web": (500, 1.0), "math": (300, 0.8), "pubmed": (250, 0.4), "code": (700, 1.2)}
LENGTHS = {  # (median tokens, sigma of log) per source; max document length (None = any)
    "realistic": (REALISTIC, None),
    "realistic, cut at 2048 (max_chars)": (REALISTIC, 2048),
    "short": ({k: (40, 0.7) for k in REALISTIC}, None),
    # each source one document (a whole book, a code dump): every row a piece of it under split
    "one document per source": ({k: (0, 0.0) for k in REALISTIC}, None),
}
WEIGHTS = {"web": 0.6, "math": 0.15, "pubmed": 0.15, "code": 0.1}


def synthetic_shards(directory: Path, kind: str, tokens_per_source: int) -> dict:
    import numpy as np

    from littlelm.data.shards import Shard, ShardWriter

    rng = np.random.default_rng(0)
    out = {}
    dists, cut = LENGTHS[kind]
    for i, (label, (median, sigma)) in enumerate(dists.items()):
        path = directory / f"{''.join(c if c.isalnum() else '_' for c in kind)}-{i}-{label}.bin"
        if median == 0:  # one document of every token
            lengths = np.array([tokens_per_source], dtype=np.int64)
        else:
            draws = rng.lognormal(np.log(median), sigma, tokens_per_source // median)
            lengths = np.maximum(2, draws).astype(np.int64)
        if cut:  # each long document as pieces of at most `cut` tokens, each with its BOS
            pieces = [[cut] * (n // cut) + ([n % cut] if n % cut > 1 else []) for n in lengths]
            lengths = np.array([p for ps in pieces for p in ps], dtype=np.int64)
        tokens = rng.integers(1, 50000, int(lengths.sum()), dtype=np.int64)
        tokens[np.cumsum(lengths) - lengths] = 0  # BOS
        w = ShardWriter(path, 50257, 0, "ab" * 32)
        w.add_docs(tokens, lengths)
        w.close()
        out[label] = Shard(path)
    return out


def loader_throughput(
    shards: dict, seconds: float, long_docs: str
) -> tuple[float, float, float, float, float, float, int]:
    """(tokens/s, tokens per CPU-second of this thread, crop rate, split rate, mean document
    length, seconds to make the state a checkpoint keeps, its JSON bytes) of the mixture loader
    on this thread. CPU time is what a busy shared machine does not take away."""
    from littlelm.data.loader import BestFitPacker, DocStream, MixtureLoader

    packers = {
        k: BestFitPacker(DocStream([s], seed=i, label=k), 2049, 1000, long_docs)
        for i, (k, s) in enumerate(shards.items())
    }
    mix = MixtureLoader(packers, WEIGHTS, batch=32, seq_len=2048)
    for _ in range(20):
        mix.next_batch()
    n, t0, c0 = 0, time.perf_counter(), time.thread_time()
    while time.perf_counter() - t0 < seconds:
        mix.next_batch()
        mix.snapshot()  # what the prefetch thread takes after every batch
        n += 1
    secs, cpu = time.perf_counter() - t0, time.thread_time() - c0
    mean_len = sum(int(s.header.n_tokens) for s in shards.values()) / sum(
        len(s) for s in shards.values()
    )
    tokens = n * 32 * 2048
    t0 = time.perf_counter()
    state = mix.snapshot().state_dict()  # what each checkpoint writes (state.json's loader)
    state_s, state_bytes = time.perf_counter() - t0, len(json.dumps(state))
    return (
        tokens / secs,
        tokens / cpu,
        mix.crop_rate(),
        mix.split_rate(),
        mean_len,
        state_s,
        state_bytes,
    )


def rss_mb() -> float:
    """Resident memory of this process now (MB), from /proc (0 where there is none)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except OSError:
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def foreign_table(work: Path, n_files: int, tokens_per_file: int, seconds: float) -> None:
    """Case 4: n_files small llm.c .bin files against the same documents as littlelm shards."""
    import numpy as np

    from littlelm.data.foreign import TokenFiles, TokensConfig
    from littlelm.data.loader import BestFitPacker, DocStream, MixtureLoader
    from littlelm.data.shards import Shard, ShardWriter

    class Tok:  # what TokenFiles.open reads of a tokenizer (GPT-2's sizes)
        vocab_size, bos_id = 50257, 50256

        def describe(self) -> str:
            return "gpt2-sized"

    rng = np.random.default_rng(0)
    ours_dir, theirs_dir = work / "ours528", work / "theirs528"
    ours_dir.mkdir(parents=True, exist_ok=True)
    theirs_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    total = n_files * tokens_per_file
    median, sigma = REALISTIC["web"]
    lengths = np.maximum(2, rng.lognormal(np.log(median), sigma, 2 * total // median))
    lengths = lengths.astype(np.int64)[: int(np.searchsorted(np.cumsum(lengths), total)) + 1]
    lengths[-1] -= int(lengths.sum()) - total  # the stream ends with the last shard
    lengths = lengths[lengths > 1]
    tokens = rng.integers(0, 50256, int(lengths.sum()), dtype=np.int64)
    tokens[np.cumsum(lengths) - lengths] = 50256  # <|endoftext|> starts each document
    n_docs, ends = len(lengths), np.cumsum(lengths)
    a = 0  # littlelm shards: whole documents, about tokens_per_file each
    for i in range(n_files):
        b = min(n_docs, int(np.searchsorted(ends, (i + 1) * tokens_per_file, "left")) + 1)
        w = ShardWriter(ours_dir / f"shard-{i:05d}.bin", 50257, 50256, "ab" * 32)
        w.add_docs(tokens[ends[a] - lengths[a] : ends[b - 1]], lengths[a:b])
        w.close()
        a = b
        if a >= n_docs:
            break
    for i in range(n_files):  # llm.c's fill loop: every shard exactly tokens_per_file tokens
        part = tokens[i * tokens_per_file : (i + 1) * tokens_per_file]
        header = np.zeros(256, "<i4")
        header[:3] = [20240520, 1, len(part)]
        (theirs_dir / f"fineweb_train_{i:06d}.bin").write_bytes(
            header.tobytes() + part.astype("<u2").tobytes()
        )
    cut = sum(1 for i in range(1, n_files) if tokens[i * tokens_per_file] != 50256)
    print(
        f"\n{n_files} shards, {len(tokens) / 1e6:.1f}M tokens, {n_docs:,} documents ({cut} "
        f"continue into the next llm.c file), written in {time.perf_counter() - t0:.0f}s "
        "(littlelm shards and llm.c .bin files of the same documents); one source, seq 2048, "
        "batch 32, one core\n"
    )
    cfg = TokensConfig(name="tokens", format="nanogpt", path=str(theirs_dir))
    cache = work / "cache"
    opened = {}
    rss0 = rss_mb()
    t0 = time.perf_counter()
    said: list[str] = []
    opened["theirs, first open (index built)"] = TokenFiles(cfg, "x").open(
        Tok(), 0, cache, said.append
    )[0]
    first = time.perf_counter() - t0
    rss1 = rss_mb()
    t0 = time.perf_counter()
    theirs = TokenFiles(cfg, "x").open(Tok(), 0, cache)[0]
    again = time.perf_counter() - t0
    rss2 = rss_mb()
    t0 = time.perf_counter()
    ours = [Shard(p, verify=True) for p in sorted(ours_dir.glob("*.bin"))]
    ours_verify = time.perf_counter() - t0
    rss3 = rss_mb()
    t0 = time.perf_counter()
    ours = [Shard(p, verify=False) for p in sorted(ours_dir.glob("*.bin"))]
    ours_open = time.perf_counter() - t0
    rss4 = rss_mb()
    index_mb = sum(16 * len(t) for t in theirs) / 1e6

    def first_batch(open_shards) -> float:
        """Seconds from nothing open (indexes cached) to the first batch."""
        t0 = time.perf_counter()
        packer = BestFitPacker(DocStream(open_shards(), 0, label="x"), 2049, 1000, "split")
        MixtureLoader({"x": packer}, {"x": 1.0}, batch=32, seq_len=2048).next_batch()
        return time.perf_counter() - t0

    def speed(shards: list, long_docs: str) -> float:
        packer = BestFitPacker(DocStream(shards, 0, label="x"), 2049, 1000, long_docs)
        mix = MixtureLoader({"x": packer}, {"x": 1.0}, batch=32, seq_len=2048)
        for _ in range(20):
            mix.next_batch()
        n, t0, c0 = 0, time.perf_counter(), time.thread_time()
        while time.perf_counter() - t0 < seconds:
            mix.next_batch()
            mix.snapshot()
            n += 1
        return n * 32 * 2048 / (time.thread_time() - c0)

    print("| what | littlelm shards | llm.c .bin (tokens source) | ratio | target |")
    print("| --- | --- | --- | --- | --- |")
    print(
        f"| open every shard | {ours_open:.2f}s ({ours_verify:.2f}s with checksums) | "
        f"{first:.2f}s first (index built), {again:.2f}s after | - | < 5 s |"
    )
    print(
        f"| RSS added by opening | {rss4 - rss3:.1f} MB | {rss1 - rss0:.1f} MB first, {rss2 - rss1:.1f} MB again; "
        f"their index {index_mb:.1f} MB | - | ~ the index |"
    )
    fa = min(
        first_batch(lambda: [Shard(p) for p in sorted(ours_dir.glob("*.bin"))]) for _ in range(3)
    )
    fb = min(first_batch(lambda: TokenFiles(cfg, "x").open(Tok(), 0, cache)[0]) for _ in range(3))
    print(f"| nothing open to first batch | {fa:.2f}s | {fb:.2f}s | {fb / fa:.2f}x | <= 2x |")
    docs = sum(len(t) for t in theirs)
    print(
        f"| documents; warning lines at open | {n_docs:,} | {docs:,}; {len(said)} | - | equal; 0 |"
    )
    for long_docs in ("split", "crop"):
        a, b = [], []
        for _ in range(2):  # alternating, best of 2: a busy machine hurts both alike
            a.append(speed(ours, long_docs))
            b.append(speed(theirs, long_docs))
        print(
            f"| loader tokens/CPU-s, long_docs={long_docs} | {max(a) / 1e6:.1f}M | "
            f"{max(b) / 1e6:.1f}M | {max(b) / max(a):.2f}x | >= 0.8x |",
            flush=True,
        )


def prepare_tables(work: Path, args, cores: int) -> None:
    """Raw tokenizer speed beside a full prepare, per tokenizer and worker mode."""
    docs = make_corpus(work / "raw", args.mb)
    mb = sum(len(d.encode()) for d in docs) / 1e6
    print(f"corpus: {len(docs):,} documents, {mb:.1f} MB in 8 JSONL files; {cores} cores")
    print(
        f"best of {args.repeats} alternating runs each; workers 'default' = data.workers null "
        f"(one process per 64 MB of input, so here one process, tokenizer threads on every "
        f"core), '{cores} processes' = data.workers {cores}\n"
    )
    print("| tokenizer | raw encode_batch | data prepare | workers | prepare / raw | shards |")
    print("| --- | --- | --- | --- | --- | --- |")
    # exact dedup (on by default) hashes every document: "dedup off" is its cost
    modes = {"default": (None, True), "default, dedup off": (None, False)}
    modes[f"{cores} processes"] = (cores, True)
    for name, tok, note in tokenizers(work, docs):
        raws, preps = [], {m: [] for m in modes}
        for _ in range(args.repeats):
            raws.append(raw_throughput(tok, docs))
            for mode, (workers, dedup) in modes.items():
                out = work / "out"
                preps[mode].append(prepare_throughput(tok, work / "raw", out, workers, dedup))
        r_secs, r_mbs, r_toks = min(raws)
        raw = f"{r_mbs:.2f} MB/s, {r_toks / 1e6:.2f}M tok/s ({r_secs:.1f}s)"
        for mode in modes:
            p_secs, p_mbs, p_toks, shards = min(preps[mode])
            print(
                f"| {name} | {raw} | {p_mbs:.2f} MB/s, {p_toks / 1e6:.2f}M tok/s "
                f"({p_secs:.1f}s) | {mode} | {100 * p_mbs / r_mbs:.0f}% | {shards} |",
                flush=True,
            )
        if note:
            print(f"({name}: {note})", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=32, help="corpus size for the prepare benchmark")
    p.add_argument("--repeats", type=int, default=2, help="alternating raw/prepare measurements")
    p.add_argument("--seconds", type=float, default=5, help="loader measurement time per case")
    p.add_argument(
        "--loader-tokens", type=int, default=20_000_000, help="tokens per synthetic source"
    )
    p.add_argument("--work", help="scratch directory (default: a new temporary one, removed after)")
    p.add_argument("--loader-only", action="store_true", help="measure the loader only")
    p.add_argument("--foreign-only", action="store_true", help="measure case 4 only")
    p.add_argument("--shards", type=int, default=528, help="case 4: number of token files")
    p.add_argument("--shard-tokens", type=int, default=40_000, help="case 4: tokens per file")
    args = p.parse_args()
    from littlelm.components import register_all

    register_all()  # an entry point: the prepare's sources are looked up in the registries
    work = Path(args.work or tempfile.mkdtemp(prefix="littlelm-bench-data-"))
    cores = os.cpu_count() or 1
    try:
        if not (args.loader_only or args.foreign_only):
            prepare_tables(work, args, cores)
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        if args.foreign_only:
            foreign_table(work, args.shards, args.shard_tokens, args.seconds)
            return
        print(
            "\nloader, one core: 4-source mixture (0.6/0.15/0.15/0.1), best-fit, seq 2048, batch 32\n"
        )
        print(
            "| documents | long_docs | mean length (tokens) | tokens/s | tokens/CPU-s | crop rate "
            "| split rate | loader state | state made in |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for kind in LENGTHS:
            shards = synthetic_shards(work, kind, args.loader_tokens)
            for long_docs in ("crop", "split"):
                tok_s, tok_cpu, crop, split, mean_len, state_s, state_bytes = loader_throughput(
                    shards, args.seconds, long_docs
                )
                print(
                    f"| {kind} | {long_docs} | {mean_len:.0f} | {tok_s / 1e6:.1f}M | "
                    f"{tok_cpu / 1e6:.1f}M | {100 * crop:.2f}% | {100 * split:.2f}% | "
                    f"{state_bytes / 1e3:.1f} kB | {1e3 * state_s:.1f} ms |",
                    flush=True,
                )
        foreign_table(work, args.shards, args.shard_tokens, args.seconds)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":  # guarded: prepare's worker processes (spawn) import this module
    main()
