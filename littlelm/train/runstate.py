"""The Trainer's run directory, checkpoints, resume and rollback (a mixin of `Trainer`: the
methods use its attributes). Under torchrun every rank gathers the whole state and rank 0 alone
writes it (`Parallel.on_main`: a failure is raised on every rank); every rank reads the same
checkpoint to resume or roll back, each taking its own loader position (data/reshard.py).
docs/reliability.md and docs/distributed.md describe the behaviour.
"""

from __future__ import annotations

import json
from pathlib import Path

from littlelm.config import dump_yaml, to_tree
from littlelm.data.reshard import loader_state_for
from littlelm.errors import CheckpointError, RunDirError, TrainingError
from littlelm.train import checkpoint as ckpt
from littlelm.train import resume as resuming
from littlelm.train.growth import GrownFrom, grow_from_parent


class RunState:
    # ------------------------------------------------------------------------------------------
    # Run directory, checkpoints, resume

    def _write_run_files(self) -> None:
        self.parallel.on_main(self._write_config)

    def _write_config(self) -> None:
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.run_dir / "config.yaml.tmp"
            tmp.write_text(dump_yaml(self.cfg))
            tmp.replace(self.run_dir / "config.yaml")
        except OSError as e:
            raise RunDirError(
                f"cannot write to the run directory {self.run_dir}: {e.strerror}; free disk "
                "space, fix its permissions, or point run.out_dir elsewhere"
            ) from None

    def save(self, final: bool = False) -> Path | None:
        """Checkpoint now. A failed periodic save stops the run, or with
        checkpoint.on_save_error=continue is reported and skipped; a final save always raises."""
        state = {
            "tokens": self.tokens,
            "train_time": self.train_time,
            "loader": self.loader_state.state_dict(),
            "tokenizer": self.data.tokenizer.fingerprint,
            "config": to_tree(self.cfg),
            "guard": self.guard.state_dict(),
        }
        if getattr(self, "budget", None) is not None:  # time spent counts after a resume
            state["budget"] = self.budget.state_dict()
        # every rank takes part in gathering the whole state; rank 0 writes it
        state.update(self._loader_states())
        model = Frozen(self.parallel.model_state_dict(self.model))
        optimizer = Frozen(self.optimizer.state_dict())
        try:  # a failure (disk full) raises the same CheckpointError on every rank
            path = self.parallel.on_main(
                lambda: ckpt.save_checkpoint(
                    self.ckpt_dir,
                    self.step,
                    model,
                    optimizer,
                    state,
                    self.model.origin,
                    self.data.tokenizer,
                )
            )
        except CheckpointError as e:
            if final or self.cfg.checkpoint.on_save_error == "stop":
                raise
            self.save_failures += 1
            self.log(f"warning: {e}\ntraining goes on (checkpoint.on_save_error is continue)")
            return None
        self.last_checkpoint, self.saved_step = path, self.step
        if self.is_main:
            ckpt.prune(self.ckpt_dir, self.cfg.checkpoint.keep_last, self.cfg.checkpoint.keep_every)
        for cb in self._my_callbacks():
            cb.on_checkpoint(self, path)
        return path

    def _loader_states(self) -> dict:
        """Every rank's loader position (a checkpoint resumes each rank exactly where it was)."""
        if self.parallel.world == 1:
            return {}
        return {
            "loader_world_size": self.parallel.world,
            "loader_ranks": self.parallel.gather_objects(self.loader_state.state_dict()),
        }

    def _load_weights(self, resume: str) -> ckpt.Loaded | None:
        """Read the checkpoint to resume from (if any), check this run may continue it and load
        its weights into the model (before it is sharded); the rest follows in `_resume`."""
        loaded = resuming.load_first(resuming.choose(self.ckpt_dir, resume))
        self.parallel.agree(
            None if loaded is None else loaded.path.name,
            "the checkpoint to resume from (run.out_dir must be on a file system every node sees)",
        )
        if loaded is None:
            return None
        self._changed = resuming.check_compatible(
            loaded.state, to_tree(self.cfg), self.data.tokenizer.fingerprint, loaded.path
        )
        ckpt.load_model_tensors(self.model, loaded.model, loaded.path)
        if loaded.origin:
            self.model.origin.update(loaded.origin)  # before the optimizer's groups are made
        return loaded

    def _resume(self, loaded: ckpt.Loaded) -> None:
        """The optimizer, counters, RNG, guard and (re-dealt if the world size changed) every
        rank's data position from the checkpoint whose weights `_load_weights` loaded."""
        self._restore(loaded)
        self.loader.load_state_dict(
            loader_state_for(
                loaded.state, self.parallel.rank, self.parallel.world, self._make_loader
            )
        )
        self.loader_state = self.loader.snapshot()
        self.guard.load_state_dict(loaded.state.get("guard", {}))
        self.last_checkpoint = loaded.path
        if loaded.path.parent.resolve() == self.ckpt_dir.resolve():
            self.saved_step = self.step
        self.log(f"resumed from {loaded.path} (step {self.step}, {self.tokens:,} tokens)")
        if self._changed:
            self.log(f"resuming with changed settings: {'; '.join(self._changed)}")
        saved_world = loaded.state.get("loader_world_size", 1)
        if saved_world != self.parallel.world:
            self.log(
                f"the checkpoint was written by {saved_world} process(es), this run has "
                f"{self.parallel.world}: the data order was re-dealt (docs/distributed.md)"
            )

    def _restore(self, loaded: ckpt.Loaded) -> None:
        """Optimizer state, RNG states and counters from a checkpoint (not the weights or data)."""
        resuming.load_optimizer_state(self.optimizer, loaded.optimizer)
        ckpt.set_rng_state(loaded.rng)
        self.step, self.tokens = loaded.state["step"], loaded.state["tokens"]
        self.train_time = loaded.state.get("train_time", 0.0)

    # ------------------------------------------------------------------------------------------
    # Growth (train/growth.py) and origin tags

    def _grow_from_parent(self) -> GrownFrom:
        """A fresh grown run: the parent's weights and origin tags, before the model is sharded
        and the optimizer's groups are made from the tags."""
        grown = grow_from_parent(
            self.model, self.cfg.grow, self.data.tokenizer.fingerprint, to_tree(self.cfg)
        )
        self.log(grown.summary())
        return grown

    def _continue_parent_data(self, parent: Path) -> None:
        """grow.continue_data: start at the parent's data position (re-dealt if the parent ran
        with another number of processes)."""
        state = json.loads((parent / "state.json").read_text())
        self.loader.load_state_dict(
            loader_state_for(state, self.parallel.rank, self.parallel.world, self._make_loader)
        )
        self.loader_state = self.loader.snapshot()

    def _rollback(self) -> None:
        """Reload the last checkpoint after persistent bad steps, keeping the data loader where
        it is so the batches since the checkpoint are skipped (train/guard.py explains)."""
        self.rollback_pending = False
        if self.last_checkpoint is None:
            raise TrainingError(self.guard.stop_message(self.step, self.last_checkpoint))
        failed_at, reason = self.step, self.guard.reason
        loaded = ckpt.load_checkpoint(self.last_checkpoint)
        train_time = self.train_time
        # every rank reads the same checkpoint (whole tensors; FSDP keeps its slice)
        self.parallel.load_model_state(self.model, loaded.model, loaded.path)
        self._restore(loaded)
        self.train_time = train_time  # time spent is spent
        self.guard.rolled_back(loaded.state.get("guard", {}))
        self._norm_sum.zero_()
        info = {
            "step": self.step,
            "tokens": self.tokens,
            "failed_at": failed_at,
            "reason": reason,
            "rollbacks": self.guard.rollbacks,
            "checkpoint": str(loaded.path),
        }
        self.log(
            f"rolled back to {loaded.path} (step {self.step}) after {self.guard.cfg.max_consecutive} "
            f"skipped updates up to step {failed_at} ({reason}); the batches of steps "
            f"{self.step + 1}-{failed_at} are skipped (rollback {self.guard.rollbacks} of at most "
            f"{self.guard.cfg.max_rollbacks})"
        )
        for cb in self._my_callbacks():
            cb.on_rollback(self, info)


class Frozen:
    """A state dict computed already (gathered from every rank: a collective, so it cannot wait
    until rank 0 alone writes), handed to the checkpoint writer in place of the live object."""

    def __init__(self, state: dict):
        self._state = state

    def state_dict(self) -> dict:
        return self._state
