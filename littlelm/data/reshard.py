"""Loader positions when a run resumes with a different number of processes.

At world size w, rank r of each source reads the documents at positions r, r + w, r + 2w, ... of
each shard's seeded order (DocStream), so a checkpoint holds w positions and w packing buffers.
Resuming with the same w gives each rank its own saved state back: the batches are exactly
those of an uninterrupted run. Resuming with another w' re-deals the data, per source:

1. The restart point is the earliest position (epoch, shard, index in the shard's order) that
   some old rank had not read yet; every document before it has been read by its rank.
2. The new ranks read on from there, rank r' taking positions r', r' + w', ... (the usual rule),
   so no document after the restart point is skipped and none is read twice by the new ranks.
3. The documents waiting in the old packing buffers that were read before the restart point are
   dealt round-robin to the new buffers (in arrival order); those read after it are dropped from
   the buffers because the new ranks read them again.

Nothing is skipped. The documents the faster old ranks had already packed into rows beyond the
restart point are seen a second time: the old ranks' difference in progress, usually a handful
of documents per rank. When every old rank had read the same number of same-length documents,
as in the tests, the global order continues exactly as an uninterrupted run at the new size.
"""

from __future__ import annotations

from collections.abc import Callable

from littlelm.data.loader import DocStream, MixtureLoader

Position = tuple[int, int, int]  # (epoch, shard_pos, index in the shard's document order)
MakeLoader = Callable[[int, int], MixtureLoader]  # (rank, world) -> a fresh loader


def loader_state_for(state: dict, rank: int, world: int, make_loader: MakeLoader) -> dict:
    """This rank's loader state from a checkpoint's state.json, for a run of `world` ranks."""
    saved = state.get("loader_ranks") or [state["loader"]]
    if len(saved) == world:
        return saved[rank]
    return reshard(saved, world, make_loader)[rank]


def reshard(states: list[dict], world: int, make_loader: MakeLoader) -> list[dict]:
    """Loader states of `world` ranks that continue the run saved as `states` (one per old
    rank), as described in the module docstring. Works on the plain state dicts; fresh loaders
    of the old world size only tell where each old rank's streams stand."""
    old = [make_loader(r, len(states)) for r in range(len(states))]
    for loader, s in zip(old, states):
        loader.load_state_dict(s)
    new: list[dict] = [{"rows": [], "packers": {}} for _ in range(world)]
    for label in old[0].packers:
        streams = [o.packers[label].stream for o in old]
        packed = _reshard_source(streams, [s["packers"][label] for s in states], world)
        for n, p in zip(new, packed):
            n["packers"][label] = p
    for k in range(len(states[0]["rows"])):
        total = sum(int(s["rows"][k]) for s in states)  # this source's rows, split evenly
        for r, n in enumerate(new):
            n["rows"].append(total // world + (r < total % world))
    return new


def _reshard_source(streams: list[DocStream], packers: list[dict], world: int) -> list[dict]:
    """One source's packer states for the new ranks, from the old ranks' streams and packer
    states (buffer entries are [length, arrival, shard, doc(, offset)], split mode's whole-row
    pieces [arrival, shard, doc, offset, count] (one entry per document; an older state's
    [arrival, shard, doc, offset], one per piece, share their arrival))."""
    fronts = [front(s) for s in streams]
    start = min(fronts)
    kept: dict[tuple[int, int], tuple[list, list]] = {}  # (arrival, old rank) -> entries
    for r, (stream, p, f) in enumerate(zip(streams, packers, fronts)):
        reread = reads_between(stream, start, f)  # read at or after `start`: read again
        for b in p["buffer"]:  # waiting documents read before the restart point
            if b[1] < p["seq"] - reread:
                kept.setdefault((b[1], r), ([], []))[0].append(b)
        for q in p.get("pieces", []):
            if q[0] < p["seq"] - reread:
                kept.setdefault((q[0], r), ([], []))[1].append(q)
    docs = sorted(kept)
    epoch, shard_pos, k = start
    seq = max(p["seq"] for p in packers)
    out = []
    for r in range(world):
        doc_pos = max(0, -(-(k - r) // world))  # first position >= k that is r mod world
        mine = docs[r::world]
        # arrival numbers identify a buffered document within one packer: renumber, in order
        buffer = [[b[0], j, *b[2:]] for j, key in enumerate(mine) for b in kept[key][0]]
        state = {
            "stream": {"epoch": epoch, "shard_pos": shard_pos, "doc_pos": doc_pos},
            "buffer": buffer,
            "seq": max(seq, len(mine)),
            "stats": [0] * len(packers[0]["stats"]),
        }
        if "long_docs" in packers[0]:  # the packing it was saved with (data/loader.py)
            state["long_docs"] = packers[0]["long_docs"]
        if any("pieces" in p for p in packers):
            state["pieces"] = [[j, *q[1:]] for j, key in enumerate(mine) for q in kept[key][1]]
        out.append(state)
    n_stats = len(packers[0]["stats"])
    out[0]["stats"] = [sum(int(p["stats"][i]) for p in packers) for i in range(n_stats)]
    return out


def front(stream: DocStream) -> Position:
    """The position of the next document `stream` would read."""
    return stream.epoch, stream.shard_pos, stream.rank + stream.world * stream.doc_pos


def reads_between(stream: DocStream, start: Position, end: Position) -> int:
    """How many documents `stream` (its rank's slice) reads from position `start` up to `end`."""
    epoch, shard_pos, k = start
    count = 0
    while (epoch, shard_pos) < end[:2]:
        n = shard_length(stream, epoch, shard_pos)
        count += slice_count(k, n, stream.rank, stream.world)
        last = shard_pos + 1 == len(stream.shards)  # then the next epoch's first shard
        epoch, shard_pos, k = (epoch + 1, 0, 0) if last else (epoch, shard_pos + 1, 0)
    n = shard_length(stream, epoch, shard_pos)
    return count + slice_count(k, min(end[2], n), stream.rank, stream.world)


def slice_count(lo: int, hi: int, rank: int, world: int) -> int:
    """Positions in [lo, hi) that are `rank` mod `world`."""
    first = max(0, -(-(lo - rank) // world))
    stop = max(0, -(-(hi - rank) // world))
    return max(0, stop - first)


def shard_length(stream: DocStream, epoch: int, shard_pos: int) -> int:
    """Documents in the shard visited at `shard_pos` of `epoch` (the stream's seeded order)."""
    probe = DocStream(stream.shards, stream.seed, 0, 1, stream.repeat, stream.label)
    probe.load_state_dict({"epoch": epoch, "shard_pos": shard_pos, "doc_pos": 0})
    return len(stream.shards[int(probe._shard_order()[shard_pos])])
