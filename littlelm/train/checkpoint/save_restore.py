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

A LoRA run's checkpoint (model/lora.py) keeps the trained tensors alone (adapters, and the
embeddings or norms lora trains in full) with their optimizer state; its state.json's
`lora_base` says where the frozen base is (a checkpoint directory) and its fingerprint
(files.py), checked when the run resumes or is loaded (`load_lora`): a user's 3B base is not
copied into every checkpoint, and the base must still be there, unchanged.

Under torchrun every rank takes part in gathering and rank 0 alone writes (`Parallel.on_main`: a
failure is raised on every rank); every rank reads the same checkpoint to resume or roll back.
docs/reliability.md and docs/distributed.md describe the behaviour.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from littlelm.config import dump_yaml, to_tree, validate
from littlelm.data.reshard import MakeLoader, loader_state_for
from littlelm.errors import CheckpointError, ConfigError, RunDirError, TrainingError
from littlelm.model.gpt import GPT
from littlelm.model.grow import parent_model_config
from littlelm.model.lora import (
    LoRAConfig,
    add_lora,
    check_lora,
    load_trained,
    merge_lora,
    trained_tensors,
)
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

    def describe(self, state: TrainState, world: int) -> list[str]:
        """The resume, for the log: where from, what changed, whether the data was re-dealt."""
        lines = [f"resumed from {self.loaded.path} (step {state.step}, {state.tokens:,} tokens)"]
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
    # files, and the package must not import it back)
    def __init__(self, cfg, parallel, tokenizer, run_dir: Path, data_files: dict | None = None):
        self.cfg = cfg
        # per source [path, bytes, content hash] of its files (data/build.py's RunData)
        self.data_files = data_files
        self.parallel = parallel
        self.tokenizer = tokenizer
        self.run_dir = run_dir
        self.dir = run_dir / "checkpoints"
        self.lora_base: dict | None = None  # a LoRA run's {path, fingerprint} of its base

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
        saved = self._state_json(state)
        # every rank takes part in gathering the whole state; rank 0 writes it
        weights = self.parallel.model_state_dict(model)
        if self.cfg.lora is not None:  # the adapters (+ full-trained tensors); the base stays put
            weights = trained_tensors(weights, model)
        weights = Frozen(weights)
        moments = Frozen(optimizer.state_dict())
        origin = origin_tags(model, optimizer)  # kept by the groups (optim/groups.py)
        path = self.parallel.on_main(
            lambda: ckpt.save_checkpoint(
                self.dir, state.step, weights, moments, saved, origin, self.tokenizer
            )
        )
        state.last_checkpoint, state.saved_step = path, state.step
        if self.parallel.is_main:
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
        if self.cfg.lora is not None:
            saved["lora_base"] = self._lora_base()
        budget = state.budget.state_dict() if state.budget is not None else None
        if budget is not None:  # a time budget: the time spent counts after a resume
            saved["budget"] = budget
        if self.parallel.world > 1:  # a checkpoint resumes each rank exactly where it was
            saved["loader_world_size"] = self.parallel.world
            saved["loader_ranks"] = self.parallel.gather_objects(state.loader.state_dict())
        return saved

    def _lora_base(self) -> dict:
        """{path, fingerprint, sha256, stat} of a LoRA run's base: the checkpoint the run started
        from (a resumed run's: the one its checkpoint names), identified at the first save."""
        if self.lora_base is None:
            g = self.cfg.starts_from()
            assert g is not None, "a LoRA run starts from a checkpoint (growth.check_lora_start)"
            # complete_growth made it the exact checkpoint; absolute, so that every verb finds
            # it from any directory
            path = Path(g.parent).resolve()
            self.lora_base = {
                "path": str(path),
                "fingerprint": ckpt.fingerprint(path),
                **ckpt.weights_identity(path),
            }
        return self.lora_base

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
        changes = resuming.check_compatible(
            loaded.state, to_tree(self.cfg), self.tokenizer.fingerprint, loaded.path, type(self.cfg)
        )
        if "lora_base" in loaded.state:  # base, then adapters on it, then the checkpoint's
            self.lora_base = load_lora(model, loaded, self.cfg.lora)
        else:
            ckpt.load_model_tensors(model, loaded.model, loaded.path)
        loaded.model.release()  # the weights are in the model: unmap their file now
        return Resumed(loaded, changes)

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
        changed = data_change(saved.get("data_files"), self.data_files)
        choices = (
            "restore the data as it was; or keep the weights and optimizer state and start the "
            "data position over: data.on_changed=restart; or start a new run: --resume never "
            "(another run.name keeps this one)"
        )
        if changed and self.cfg.data.on_changed == "restart":
            return f"{changed}: the data position starts over (data.on_changed=restart)"
        if changed:
            raise CheckpointError(f"cannot resume {path}: {changed}; {choices}")
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
        if self.cfg.lora is not None:  # the trained tensors alone; the frozen base is in
            load_trained(model, loaded.model, loaded.path)
        else:
            self.parallel.load_model_state(model, loaded.model, loaded.path)
        loaded.model.release()
        assert loaded.optimizer is not None and loaded.rng is not None, "loaded with_optimizer"
        resuming.load_optimizer_state(optimizer, loaded.optimizer)
        ckpt.set_rng_state(loaded.rng)
        state.restore_counters(loaded.state, keep_time=True)
        state.guard.rolled_back(loaded.state.get("guard", {}))
        return {
            "step": state.step,
            "tokens": state.tokens,
            "failed_at": failed_at,
            "reason": reason,
            "rollbacks": state.guard.rollbacks,
            "checkpoint": str(loaded.path),
        }


def load_lora(model, loaded: ckpt.Loaded, lora: LoRAConfig | None) -> dict:
    """A LoRA checkpoint (`loaded`) into the plain `model`: the base's weights from the
    checkpoint its state.json names (checked against the fingerprint recorded there), the
    adapters of `lora` put on, then the checkpoint's trained tensors. Returns the base's record.
    Raises CheckpointError when the base is gone or changed."""
    record = loaded.state["lora_base"]
    path, want = base_path(loaded), record.get("fingerprint")
    if lora is None:
        raise ConfigError(
            [f"{loaded.path} is a LoRA run's checkpoint; its config's lora section is missing"]
        )
    try:
        found = ckpt.fingerprint(path)
    except CheckpointError:
        relative = (
            ""
            if Path(record.get("path", "")).is_absolute()
            else (
                f" (its state.json records it relative to the directory that run started in: run "
                f"from there, or write the absolute path into lora_base.path of "
                f"{loaded.path / 'state.json'})"
            )
        )
        raise CheckpointError(
            f"{loaded.path} holds LoRA adapters of the base {path}, which cannot be read{relative}: "
            "put that checkpoint back where it was (a LoRA run's checkpoints keep the adapters "
            "alone, the base's weights stay in the base's checkpoint)"
        ) from None
    changed = f"fingerprint was {want}, is {found}" if found != want else None
    if changed is None and ckpt.weights_changed(path, record):
        changed = "its model.safetensors hashes differently, same size and header"
    if changed:
        raise CheckpointError(
            f"{loaded.path} holds LoRA adapters of the base {path}, which changed since (its "
            f"{changed}): the adapters only fit the weights they were trained on; restore that "
            "checkpoint as it was"
        )
    base = ckpt.load_checkpoint(path, with_optimizer=False)
    ckpt.load_model_tensors(model, plain_tensors(base), path)  # a LoRA base: merged in turn
    base.model.release()
    problems = check_lora(model, lora)
    if problems:
        raise ConfigError(problems)
    add_lora(model, lora)
    load_trained(model, loaded.model, loaded.path)
    kept = {k: record[k] for k in ("sha256", "stat") if k in record}
    if "sha256" in kept:  # checked above: equal; its stat now (a copy has a new mtime)
        kept["stat"] = ckpt.weights_stat(path)
    return {"path": str(path.resolve()), "fingerprint": found, **kept}


def base_path(loaded: ckpt.Loaded) -> Path:
    """The base checkpoint LoRA checkpoint `loaded` names. Runs record it absolute; an older
    run's relative path is relative to the directory that run started in, which is known when
    run.out_dir was relative: the checkpoint is START/out_dir/name/checkpoints/step_N."""
    path = Path(loaded.state["lora_base"].get("path", ""))
    if path.is_absolute() or path.exists():
        return path
    out_dir = Path(loaded.state.get("config", {}).get("run", {}).get("out_dir", ""))
    parents = loaded.path.resolve().parents
    depth = 2 + len(out_dir.parts)  # checkpoints/, the run's directory, out_dir's parts: START
    usable = out_dir.parts and not out_dir.is_absolute() and ".." not in out_dir.parts
    if usable and depth < len(parents) and (parents[depth] / path).exists():
        return parents[depth] / path
    return path


def plain_tensors(loaded: ckpt.Loaded) -> Mapping:
    """The plain model's tensors of a checkpoint: its own, or for a LoRA run's checkpoint
    (adapters alone) its base's with the adapters merged in, as `load_model` reads it; so a run
    may start from a LoRA run (sft.base, grow.parent, RL's and DPO's reference)."""
    if "lora_base" not in loaded.state:
        return loaded.model
    config = loaded.state.get("config", {})
    model = parent_model_config(loaded.state, loaded.path)
    lora = validate(LoRAConfig, config.get("lora") or {}, source=str(loaded.path / "state.json"))
    # the adapters go on the base's own weights (a QLoRA run's too: nf4 needs CUDA), as load_model
    with torch.random.fork_rng(devices=[]):  # building it must not move the run's RNG
        plain = GPT(model)
    load_lora(plain, loaded, lora.model_copy(update={"quantize": "none"}))
    return merge_lora(plain).state_dict()


class Frozen:
    """A state dict computed already (gathered from every rank: a collective, so it cannot wait
    until rank 0 alone writes), handed to the checkpoint writer in place of the live object."""

    def __init__(self, state: dict):
        self._state = state

    def state_dict(self) -> dict:
        return self._state


def data_change(saved: dict | None, now: dict | None) -> str | None:
    """What changed between a checkpoint's data fingerprints and this run's (None: nothing, or
    a checkpoint written before littlelm recorded them). Files are compared by size and content
    in order, so a moved directory of the same files is no change."""
    if saved is None or now is None:
        return None
    for label in sorted(set(saved) & set(now)):
        old, new = saved[label], now[label]
        for i, (a, b) in enumerate(zip(old, new)):
            if a[1:] != b[1:]:
                was = f"{a[1]:,} bytes, content hash {a[2]}"
                is_ = f"{b[1]:,} bytes, content hash {b[2]}"
                if a[0] != b[0]:
                    return (
                        f"data.sources.{label}'s file {i + 1} was {a[0]} ({was}) when it was "
                        f"written, it is now {b[0]} ({is_})"
                    )
                return f"data.sources.{label}'s file {b[0]} changed since it was written (was {was}, now {is_})"
        if len(old) != len(new):
            extra = new[len(old)][0] if len(new) > len(old) else old[len(new)][0]
            return (
                f"data.sources.{label} had {len(old)} file(s) when it was written, it has "
                f"{len(new)} now ({'new' if len(new) > len(old) else 'gone'}: {extra})"
            )
    return None
