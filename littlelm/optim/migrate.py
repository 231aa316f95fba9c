"""Optimizer state written before optim/optimizer.py, into its layout.

Runs up to commit 22771fd stepped one torch optimizer per kind, torch's AdamW (or the
stochastic-rounding or 8-bit AdamW) over the AdamW groups and Muon over the Muon groups, and saved
`{"optimizers": [adamw.state_dict(), muon.state_dict()]}` (a part is missing when it had no
groups), each part numbering its own parameters from 0. Their groups carried the same `name`
("role/origin"), lr, base_lr and weight decay, and their per-parameter state the same tensors
(AdamW: step, exp_avg, exp_avg_sq; Muon: momentum_buffer). MuonAdamW orders its groups as those
parts did, the AdamW groups and then the Muon groups, each in the same order; so the migration
concatenates the parts' groups and numbers their parameters one after another.
"""

from __future__ import annotations


def from_parts(state: dict, groups: list[dict]) -> dict:
    """The old layout `state` as MuonAdamW.state_dict() would have written it, checked against
    `groups` (the param groups of the optimizer that loads it); ValueError when it does not fit."""
    merged_groups, merged_state, offset = [], {}, 0
    for part in state["optimizers"]:
        renumber: dict[int, int] = {}  # the part's parameter ids -> the merged ones
        for g in part["param_groups"]:
            ids = list(range(offset, offset + len(g["params"])))
            renumber.update(zip(g["params"], ids))
            offset += len(ids)
            # that layout knew these two kinds only; later optimizers never wrote it
            kind = "muon" if "momentum" in g and "betas" not in g else "adamw"
            merged_groups.append({**g, "params": ids, "kind": kind})
        merged_state.update({renumber[i]: s for i, s in part["state"].items()})
    if len(merged_groups) != len(groups):
        raise ValueError(
            f"the saved optimizer has {len(merged_groups)} parameter groups, this run {len(groups)}"
        )
    for old, new in zip(merged_groups, groups):
        if (old.get("name"), old["kind"]) != (new["name"], new["kind"]):
            raise ValueError(
                f"saved group {old.get('name')} ({old['kind']}) where this run has "
                f"{new['name']} ({new['kind']})"
            )
        role, origin = new["name"].split("/")
        old.update(role=role, origin=origin)
    return {"state": merged_state, "param_groups": merged_groups}
