"""Run by tests/test_distributed.py under torchrun (gloo, CPU): `littlelm train` with faults
injected on rank 1 only, to check that every rank still decides the same. Each rank writes its
result (the dict `Trainer.fit` returns) to OUT.rankN.json.

    FAULT_NAN_CALLS=2,6 FAULT_SIGTERM_CALL=3 python -m torch.distributed.run --standalone \
        --nproc_per_node 2 tests/dist_fault_worker.py CONFIG OUT [key=value ...]

FAULT_NAN_CALLS: forward calls (1-based, counted over the whole run) whose loss value is NaN on
rank 1 while its gradients stay finite (so only the guard's shared loss can tell rank 0).
FAULT_SIGTERM_CALL: the forward call during which rank 1 sends itself SIGTERM.
FAULT_SAVE_FAIL_STEP: rank 0's (the writer's) save of this step fails as on a full disk.
"""

from __future__ import annotations

import errno
import json
import math
import os
import signal
import sys
from pathlib import Path

from littlelm.components import register_all
from littlelm.errors import LittleLMError
from littlelm.schema import load_run
from littlelm.train import distributed
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.device import pick_device
from littlelm.train.trainer import Trainer

register_all()  # an entry point: fill the registries before reading a config


def calls(name: str) -> set[int]:
    return {int(c) for c in os.environ.get(name, "").split(",") if c}


def inject(trainer: Trainer) -> None:
    real, nan_calls, term_calls = (
        trainer.forward,
        calls("FAULT_NAN_CALLS"),
        calls("FAULT_SIGTERM_CALL"),
    )
    count = 0

    def forward(x, y):
        nonlocal count
        count += 1
        if count in term_calls:
            os.kill(os.getpid(), signal.SIGTERM)
        loss = real(x, y)
        if count in nan_calls:
            loss = loss + loss.detach() * math.nan  # the value only: gradients stay finite
        return loss

    trainer.forward = forward


def fill_disk_at(step: int) -> None:
    """The checkpoint writer's files fail with ENOSPC for `step` (the real save's cleanup and
    error report run)."""
    real = ckpt._write_files

    def write_files(tmp, at, *args):
        if at == step:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(tmp, at, *args)

    ckpt._write_files = write_files


def main() -> int:
    config, out, *overrides = sys.argv[1:]
    env = distributed.detect_env()
    try:
        cfg = load_run(config, overrides, world_size=env.world_size)
        with distributed.session(cfg.distributed, pick_device(cfg.run.device), env) as par:
            trainer = Trainer(cfg, parallel=par)
            if par.rank == 1:
                inject(trainer)
            if par.rank == 0 and os.environ.get("FAULT_SAVE_FAIL_STEP"):
                fill_disk_at(int(os.environ["FAULT_SAVE_FAIL_STEP"]))
            result = trainer.fit()
    except LittleLMError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    Path(f"{out}.rank{env.rank}.json").write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
