"""Saving and restoring a run's TrainState (train/checkpoint/state.py) together with its weights and
optimizer state: the run directory's side of the Trainer.

    save        gather the whole state on every rank; rank 0 writes one checkpoint
                (train/checkpoint/files.py: atomic, whole tensors) and prunes the old ones
    load        at start-up: the checkpoint to resume from (train/checkpoint/resume.py picks it and checks
                this run's config may continue it), its weights loaded into the unsharded model
    resume      after the optimizer and loader exist: optimizer state, RNG, counters, guard and
                this rank's data position (re-dealt if the world size changed, data/reshard.py)
    rollback    mid-run: the last checkpoint's weights, optimizer state, RNG, counters and loss
                window, keeping the data position and the time spent

The run's model transform (train/transform.py) says what a checkpoint keeps of the weights and
adds to state.json, and loads them back: a LoRA run's checkpoint keeps the trained tensors
alone with their optimizer state, and names its frozen base.

Under torchrun every rank takes part in gathering and rank 0 alone writes (`Parallel.on_main`: a
failure is raised on every rank); every rank reads the same checkpoint to resume or roll back.
docs/reliability.md and docs/distributed.md describe the behaviour.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from littlelm.config import dump_yaml, to_tree
from littlelm.data.fingerprint import compare as compare_files
from littlelm.data.reshard import MakeLoader, loader_state_for
from littlelm.errors import CheckpointError, RunDirError, TrainingError
from littlelm.optim.groups import origin_tags
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.checkpoint import resume as resuming
from littlelm.train.checkpoint.rundir import RunLock
from littlelm.train.checkpoint.state import TrainState
from littlelm.train.signals import StopSignals


@dataclass
class Resumed:
    """A checkpoint chosen to resume from, whose weights are in the model already."""

    loaded: ckpt.Loaded
    changes: list[str]  # the config differences this run may make ('key: old -> new')
    data_note: str | None = None  # the data changed and its position started over (on_changed)
    kept: list[str] = field(default_factory=list)  # old defaults kept (resume.CHANGED_DEFAULTS)

    def describe(self, state: TrainState, world: int) -> list[str]:
        """The resume, for the log: where from, what changed, whether the data was re-dealt."""
        lines = [f"resumed from {self.loaded.path} (step {state.step}, {state.tokens:,} tokens)"]
        lines += self.kept
        if self.changes:
            lines.append(f"resuming with changed settings: {'; '.join(self.changes)}")
        if self.data_note:
            lines.append(self.data_note)
        saved_world = self.loaded.state.get("loader_world_size", 1)
        if saved_world != world:
            lines.append(
                f"the checkpoint was written by {saved_world} process(es), this run has "
                f"{world}: the data order was re-dealt (docs/distributed.md)"
            )
        return lines


class Checkpointer:
    # cfg: the run's RunConfig (littlelm/schema.py)
    # parallel: train/distributed.py's Parallel (not imported: distributed.py reads checkpoint
    # files, and the package must not import it back); transform: the run's model transform
    # (train/transform.py, not imported for the same reason): what a checkpoint keeps of the
    # weights and adds to state.json, and how they load back
    def __init__(self, cfg, parallel, tokenizer, run_dir: Path, data_files, transform):
        self.cfg = cfg
        self.transform = transform
        # per source [path, bytes, sampled hash, sha256] of its files (data/fingerprint.py)
        self.data_files = data_files
        self.parallel = parallel
        self.tokenizer = tokenizer
        self.run_dir = run_dir
        self.dir = run_dir / "checkpoints"

    def write_config(self) -> None:
        """The resolved config, RUN_DIR/config.yaml (rank 0; an error is raised on every rank)."""
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

    @contextlib.contextmanager
    def session(self, state: TrainState, stop: StopSignals, log):
        """A training session in the run directory: rank 0 holds its lock and tidies what
        interrupted saves left (the other ranks learn whether it could: a directory in use stops
        every rank with the same error); SIGTERM/SIGINT ask for a clean stop (train/signals.py)."""
        with contextlib.ExitStack() as stack:
            self.parallel.on_main(lambda: self._lock(stack, log))
            stack.enter_context(stop)
            try:
                yield
            except KeyboardInterrupt:
                newest = ckpt.latest_checkpoint(self.dir, warn=False)
                log(f"aborted at step {state.step} without saving; newest checkpoint: {newest}")
                raise

    def _lock(self, stack: contextlib.ExitStack, log) -> None:
        stack.enter_context(RunLock(self.run_dir))
        for note in ckpt.clean_incomplete(self.dir):
            log(note)

    # ------------------------------------------------------------------------------------------
    # Saving

    def save(self, state: TrainState, model, optimizer) -> Path:
        """Checkpoint `state` with the weights and optimizer state; records it in `state` and
        prunes older checkpoints. Raises CheckpointError (on every rank) when the write fails."""
        snap = self.snapshot(state, model, optimizer)
        path = self.parallel.on_main(lambda: self.write(state.step, snap))
        state.last_checkpoint, state.saved_step = path, state.step
        return path

    def snapshot(self, state: TrainState, model, optimizer) -> dict:
        """What a checkpoint of `state` holds, gathered whole by every rank (a collective):
        weights, optimizer state, state.json's contents, origin tags. The tensors may be the
        live ones: `write` them now, or stage a copy (writer.py) to write later."""
        saved = self._state_json(state)
        weights = self.parallel.model_state_dict(model)
        weights = self.transform.trained_state(weights, model)  # a LoRA run's: adapters alone
        moments = optimizer.state_dict()
        origin = origin_tags(model, optimizer)  # kept by the groups (optim/groups.py)
        return {"weights": weights, "moments": moments, "state": saved, "origin": origin}

    def write(self, step: int, snap: dict, rng: dict | None = None) -> Path:
        """Rank 0: write `snap` as the checkpoint of `step` (files.py), then prune older ones.
        `rng`: RNG states read when `snap` was staged (None: now)."""
        path = ckpt.save_checkpoint(
            self.dir,
            step,
            Frozen(snap["weights"]),
            Frozen(snap["moments"]),
            snap["state"],
            snap["origin"],
            self.tokenizer,
            rng,
        )
        ckpt.prune(self.dir, self.cfg.checkpoint.keep_last, self.cfg.checkpoint.keep_every)
        return path

    def _state_json(self, state: TrainState) -> dict:
        """state.json's keys after format_version and step (train/checkpoint/state.py lists them)."""
        saved = {
            "tokens": state.tokens,
            "train_time": state.train_time,
            "loader": state.loader.state_dict(),
            "tokenizer": self.tokenizer.fingerprint,
            **({"data_files": self.data_files} if self.data_files is not None else {}),
            "config": to_tree(self.cfg),
            "guard": state.guard.state_dict(),
        }
        saved.update(self.transform.record())  # a LoRA run's base
        budget = state.budget.state_dict() if state.budget is not None else None
        if budget is not None:  # a time budget: the time spent counts after a resume
            saved["budget"] = budget
        held = state.objective.state_dict() if state.objective is not None else {}
        if self.parallel.world > 1:  # a checkpoint resumes each rank exactly where it was
            saved["loader_world_size"] = self.parallel.world
            saved["loader_ranks"] = self.parallel.gather_objects(state.loader.state_dict())
            ranks = self.parallel.gather_objects(held)  # a collective: every rank takes part
            if any(ranks):
                saved["objective_ranks"] = ranks
        elif held:
            saved["objective"] = held
        return saved

    def restore_objective(self, state: TrainState, saved: dict) -> str | None:
        """Set the objective back to this rank's state in `saved` (a checkpoint's state.json);
        a state written by another number of processes is dropped (the objective starts its
        state afresh: RL samples the batch again): returned, what to say."""
        if state.objective is None:
            return None
        world, rank = self.parallel.world, self.parallel.rank
        if saved.get("loader_world_size", 1) != world:
            held = saved.get("objective") or any(saved.get("objective_ranks", ()))
            state.objective.load_state_dict({})
            return (
                "the objective's state (RL's sampled batch) was written by another number of "
                "processes: it starts afresh (the next step samples a new batch)"
                if held
                else None
            )
        mine = saved["objective_ranks"][rank] if "objective_ranks" in saved else None
        state.objective.load_state_dict(mine or saved.get("objective", {}))
        return None

    # ------------------------------------------------------------------------------------------
    # Resuming and rolling back

    @staticmethod
    def refuse_early(cfg, run_dir: Path, resume: str) -> None:
        """Before any data work: a resume `load` would refuse (resume.refuse_early)."""
        resuming.refuse_early(run_dir / "checkpoints", resume, to_tree(cfg), type(cfg))

    def load(self, resume: str, model) -> Resumed | None:
        """Read the checkpoint to resume from (None: start fresh), check this run may continue
        it, and load its weights into `model`: before the model is sharded (whole tensors). Its
        origin tags (`loaded.origin`) are for the optimizer's groups."""
        loaded = resuming.load_first(resuming.choose(self.dir, resume))
        self.parallel.agree(
            None if loaded is None else loaded.path.name,
            "the checkpoint to resume from (run.out_dir must be on a file system every node sees)",
        )
        if loaded is None:
            return None
        # a default changed since the checkpoint: the run keeps what it trained with (the
        # trainer takes this config back, and later checkpoints save it)
        self.cfg, kept = resuming.keep_old_defaults(self.cfg, loaded.state.get("config", {}))
        changes = resuming.check_compatible(
            loaded.state, to_tree(self.cfg), self.tokenizer.fingerprint, loaded.path, type(self.cfg)
        )
        self.transform.load(model, loaded)  # LoRA: the base, its adapters, the checkpoint's
        loaded.model.release()  # the weights are in the model: unmap their file now
        return Resumed(loaded, changes, kept=kept)

    def resume(self, state: TrainState, resumed, grown, optimizer, loader, make_loader) -> None:
        """After the optimizer and loader exist: a resumed run's state, everything but the
        weights (`load` put them in): optimizer state, RNG, counters, this rank's data position
        (re-dealt if the world size changed) and the guard; or a fresh grown run's parent's data
        position (grow.continue_data; `grown`: train/growth.py's)."""
        if resumed is not None:
            loaded = resumed.loaded
            resuming.load_optimizer_state(optimizer, loaded.optimizer)
            ckpt.set_rng_state(loaded.rng)
            state.restore_counters(loaded.state)
            resumed.data_note = self.restore_data(
                state, loaded.state, loader, make_loader, loaded.path
            )
            state.guard.load_state_dict(loaded.state.get("guard", {}))
            state.last_checkpoint = loaded.path
            if loaded.path.parent.resolve() == self.dir.resolve():
                state.saved_step = state.step
        if grown is not None and grown.loader_state is not None:
            saved = json.loads((grown.path / "state.json").read_text())
            self.restore_data(state, saved, loader, make_loader, grown.path)

    def restore_data(
        self, state: TrainState, saved: dict, loader, make_loader: MakeLoader, path: Path
    ) -> str | None:
        """Move `loader` to this rank's position in `saved` (a state.json: this run's
        checkpoint `path`, or a grown run's parent under grow.continue_data), unless the data
        changed since: then an error naming the file, or with data.on_changed=restart the
        position starts over (returned: what to say)."""
        p = self.parallel
        change = compare_files(saved.get("data_files"), self.data_files)
        changed = change.problem
        choices = (
            "restore the data as it was; or keep the weights and optimizer state and start the "
            "data position over: data.on_changed=restart; or start a new run: --resume never "
            "(another run.name keeps this one)"
        )
        if changed and self.cfg.data.on_changed == "restart":
            return f"{changed}: the data position starts over (data.on_changed=restart)"
        if changed:
            raise CheckpointError(f"cannot resume {path}: {changed}; {choices}")
        if change.added:  # a grown dataset: the old position is not one in the new order
            loader.load_state_dict(make_loader(p.rank, p.world).state_dict())
            state.loader = loader.snapshot()
            shown = ", ".join(change.added[:3]) + (" ..." if len(change.added) > 3 else "")
            return (
                f"{len(change.added)} data file(s) were added after the ones it was trained on "
                f"({shown}): the run continues (weights, optimizer state, step) and its data "
                "position starts over at the beginning of the data, new files included"
            )
        try:
            loader.load_state_dict(loader_state_for(saved, p.rank, p.world, make_loader))
        except (IndexError, KeyError, TypeError, ValueError) as e:  # a position outside the data
            if self.cfg.data.on_changed == "restart":  # a fresh loader's state: the start
                loader.load_state_dict(make_loader(p.rank, p.world).state_dict())
                return (
                    f"its data position does not fit this run's data ({type(e).__name__}): the "
                    "data position starts over (data.on_changed=restart)"
                )
            raise CheckpointError(
                f"cannot resume {path}: its data position does not fit this run's data "
                f"({type(e).__name__}: {e}; the files changed since it was written, or the "
                f"checkpoint predates their fingerprints); {choices}"
            ) from None
        state.loader = loader.snapshot()
        return None

    def rollback(self, state: TrainState, model, optimizer) -> dict:
        """Reload state.last_checkpoint's weights, optimizer state, RNG, counters and loss
        window; the data position and the time spent stay (train/guard.py explains why).
        Returns the on_rollback record; raises TrainingError when there is no checkpoint."""
        if state.last_checkpoint is None:
            raise TrainingError(state.guard.stop_message(state.step, None))
        failed_at, reason = state.step, state.guard.reason
        loaded = ckpt.load_checkpoint(state.last_checkpoint)
        # every rank reads the same checkpoint (whole tensors; FSDP keeps its slice)
        self.transform.load_trained(
            model, loaded, lambda: self.parallel.load_model_state(model, loaded.model, loaded.path)
        )
        loaded.model.release()
        assert loaded.optimizer is not None and loaded.rng is not None, "loaded with_optimizer"
        resuming.load_optimizer_state(optimizer, loaded.optimizer)
        ckpt.set_rng_state(loaded.rng)
        state.restore_counters(loaded.state, keep_time=True)
        state.guard.rolled_back(loaded.state.get("guard", {}))
        self.restore_objective(state, loaded.state)  # RL's batch of that step
        return {
            "step": state.step,
            "tokens": state.tokens,
            "failed_at": failed_at,
            "reason": reason,
            "rollbacks": state.guard.rollbacks,
            "checkpoint": str(loaded.path),
        }


class Frozen:
    """A state dict computed already (gathered from every rank: a collective, so it cannot wait
    until rank 0 alone writes), handed to the checkpoint writer in place of the live object."""

    def __init__(self, state: dict):
        self._state = state

    def state_dict(self) -> dict:
        return self._state
