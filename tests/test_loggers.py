from __future__ import annotations

import shutil
import sys
import types

import pytest

from littlelm.cli import main
from littlelm.errors import DependencyError
from littlelm.schema import load_run
from littlelm.train.loggers import scalars
from littlelm.train.trainer import Trainer


def run_with(tiny_config, callbacks: str, *overrides, stop_after=None, resume="never"):
    cfg = load_run(tiny_config, [f"callbacks={callbacks}", *overrides])
    trainer = Trainer(cfg, resume=resume)
    trainer.fit(stop_after=stop_after)
    return trainer


class FakeRun:
    def __init__(self, calls, **kwargs):
        self.calls, self.kwargs, self.summary = calls, kwargs, {}
        self.logged: list[dict] = []
        calls.append(self)

    def define_metric(self, name, step_metric=None):
        pass

    def log(self, data):
        self.logged.append(data)

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
    """A stand-in `wandb` module that records what littlelm asks of it."""
    module = types.ModuleType("wandb")
    module.runs = []
    module.init = lambda **kwargs: FakeRun(module.runs, **kwargs)
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    return module


def test_scalars_flatten_and_skip_non_numbers():
    rec = {"step": 3, "loss": 2.0, "mfu": None, "finished": True, "mix": {"a": 0.5}, "dev": "cpu"}
    assert scalars(rec, "train") == {"train/loss": 2.0, "train/mix.a": 0.5}


def test_wandb_gets_config_metrics_and_one_id_across_resumes(tiny_config, fake_wandb):
    first = run_with(tiny_config, "[{name: wandb, project: p, mode: offline}]", stop_after=4)
    run = fake_wandb.runs[0]
    assert run.kwargs["mode"] == "offline" and run.kwargs["project"] == "p"
    assert run.kwargs["config"]["model"]["n_layer"] == 2 and run.kwargs["name"] == "tiny"
    train = [d for d in run.logged if "train/loss" in d]
    assert [d["step"] for d in train] == [1, 2, 3, 4]
    assert all(d["train/grad_norm"] > 0 for d in train)
    assert any("eval/val_bpb" in d for d in run.logged)
    run_with(tiny_config, "[{name: wandb, project: p, mode: offline}]", resume="auto")
    resumed = fake_wandb.runs[1]
    assert resumed.kwargs["id"] == run.kwargs["id"] and resumed.kwargs["resume"] == "allow"
    assert resumed.finished and resumed.summary["val_bpb"] > 0
    assert first.run_dir.joinpath("wandb", "littlelm_run_id").is_file()


def test_wandb_mode_env_wins_and_null_defers_to_wandb(tiny_config, fake_wandb, monkeypatch):
    run_with(tiny_config, "[{name: wandb}]", "train.max_steps=1")
    assert "mode" not in fake_wandb.runs[0].kwargs  # wandb reads WANDB_MODE or its own default
    monkeypatch.setenv("WANDB_MODE", "offline")
    # a second run: --resume never is refused over the first one's checkpoints
    run_with(tiny_config, "[{name: wandb, mode: online}]", "train.max_steps=1", "run.name=second")
    assert fake_wandb.runs[1].kwargs["mode"] == "offline"


def test_wandb_start_failure_names_the_fix(tiny_config, fake_wandb):
    def refuse(**kwargs):
        raise RuntimeError("api_key not configured (no-tty)")

    fake_wandb.init = refuse
    with pytest.raises(DependencyError, match=r"api_key not configured.*WANDB_MODE=offline"):
        run_with(tiny_config, "[{name: wandb}]", "train.max_steps=1")


@pytest.mark.parametrize("name, module", [("wandb", "wandb"), ("tensorboard", "tensorboard")])
def test_missing_package_fails_before_data_prep(
    tmp_path, tiny_config, monkeypatch, capsys, name, module
):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ImportError
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    args = ["train", str(tiny_config), f"callbacks=[{{name: {name}}}]"]
    # a missing data file would fail data preparation: the package error must come first
    args.append(f"data.sources.text.path={tmp_path / 'absent.txt'}")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"the {name} callback needs the {module} package" in err
    assert "pip install 'littlelm[logging]'" in err and "Traceback" not in err


def test_tensorboard_writes_events_for_real(tiny_config):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = run_with(tiny_config, "[{name: tensorboard}]", stop_after=5)
    # as if it died after step 5 with its last checkpoint at step 3: steps 4-5 are replayed
    shutil.rmtree(trainer.run_dir / "checkpoints" / "step_000005")
    run_with(tiny_config, "[{name: tensorboard}]", resume="auto")
    events = EventAccumulator(str(trainer.run_dir / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"train/loss", "train/grad_norm", "train/tok_per_s", "eval/val_bpb"} <= set(tags)
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]
    assert [e.step for e in events.Scalars("eval/val_loss")] == [3, 6]
    assert "config/text_summary" in events.Tags()["tensors"]


def test_wandb_offline_for_real_beside_tensorboard(tiny_config, tmp_path, monkeypatch):
    """Both loggers at once, wandb in offline mode as a machine without network would set it."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    trainer = run_with(tiny_config, "[{name: tensorboard}, {name: wandb, project: t}]")
    import wandb

    wandb.teardown()  # the wandb-core service writes the run file asynchronously; wait for it
    rid = (trainer.run_dir / "wandb" / "littlelm_run_id").read_text().strip()
    logs = list((trainer.run_dir / "wandb").glob(f"offline-run-*-{rid}/run-{rid}.wandb"))
    assert len(logs) == 1
    data = logs[0].read_bytes()
    assert b"train/loss" in data and b"eval/val_bpb" in data
    assert list((trainer.run_dir / "tensorboard").glob("events.out.tfevents.*"))


def _broken_wandb(fake_wandb):
    def broken(**kwargs):
        raise RuntimeError("wandb-core failed to start")

    fake_wandb.init = broken


def test_offline_wandb_failure_does_not_advise_going_offline(tiny_config, fake_wandb):
    _broken_wandb(fake_wandb)
    with pytest.raises(DependencyError) as failed:
        run_with(tiny_config, "[{name: wandb, mode: offline}]", "train.max_steps=2")
    message = str(failed.value)
    assert "already offline" in message and "mode: disabled" in message
    assert "set mode: offline" not in message and "WANDB_MODE=offline" not in message


def test_a_failed_logger_start_is_not_a_session(tiny_config, fake_wandb):
    from littlelm.report import write_report

    _broken_wandb(fake_wandb)
    with pytest.raises(DependencyError):
        run_with(tiny_config, "[{name: wandb}]", "train.max_steps=2")
    # the failed start left its start record; the next session's report counts one session
    trainer = run_with(tiny_config, "[]", "train.max_steps=2", resume="auto")
    text = (trainer.run_dir / "metrics.jsonl").read_text()
    assert text.count('"kind": "start"') == 2
    assert "1 session(s)" in write_report([trainer.run_dir]).read_text()
