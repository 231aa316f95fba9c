"""littlelm bench on the CPU: the real Trainer through steps, a save, a resume and more steps."""

from __future__ import annotations

import json

import pytest

from littlelm.cli import main
from littlelm.errors import RunDirError
from littlelm.plan.bench import bench_config, run_bench
from littlelm.plan.speed import load_measurements
from littlelm.schema import load_run


def test_bench_runs_save_resume_and_matches_the_trace(tiny_config):
    cfg = load_run(tiny_config)
    r = run_bench(cfg, steps=2)
    assert r["kind"] == "cpu" and r["resumed_to_step"] == 4 and r["steps"] == 4
    assert r["tok_s"] > 0 and 0 < r["mfu"] < 1
    # the trace of one step predicts the measured peak of the whole window (save/resume in it)
    assert abs(r["peak_tensor"] / r["predicted_tensor_peak"] - 1) < 0.15
    assert r["peak_rss"] > r["peak_tensor"]
    bench_dir = cfg.run_dir().with_name("tiny-bench")
    assert not (bench_dir / "checkpoints").exists()  # the bench cleans up its checkpoint
    assert json.loads((bench_dir / "bench.json").read_text())["tok_s"] == r["tok_s"]
    assert not cfg.run_dir().exists()  # the user's run is never touched
    assert any(m["workload"] == r["workload"] for m in load_measurements())


def test_bench_config_isolates_the_run(tiny_config):
    cfg = load_run(tiny_config)
    c = bench_config(cfg, 3)
    assert c.run.name == "tiny-bench" and c.train.max_steps == 6
    assert c.eval.every == 0 and not c.eval.at_end and not c.checkpoint.at_end
    assert c.callbacks == [] and cfg.run.name == "tiny"  # the original is not modified


def test_cli_bench_prints_measured_beside_predicted(tiny_config, capsys):
    assert main(["bench", str(tiny_config), "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "peak tensor memory" in out and "measured / predicted" in out and "stored:" in out


def test_bench_refuses_a_directory_it_did_not_make(tiny_config, capsys):
    """Issue 24.1: a run named `<name>-bench` (here with a checkpoint, and locked by a live
    trainer) or a directory of other files is refused before anything is deleted or written."""
    from littlelm.train.checkpoint.rundir import RunLock

    cfg = load_run(tiny_config)
    target = cfg.run_dir().with_name("tiny-bench")
    ckpt = target / "checkpoints" / "step_000003"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"precious")
    with RunLock(target):  # a live `train` holds the run lock
        assert main(["bench", str(tiny_config), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: littlelm bench works in") and "another run.name" in err
    assert "Traceback" not in err
    assert (ckpt / "model.safetensors").read_bytes() == b"precious"
    assert sorted(p.name for p in target.iterdir()) == [".lock", "checkpoints"]
    other = target.with_name("notes-bench")
    other.mkdir()
    (other / "todo.txt").write_text("mine")
    assert main(["bench", str(tiny_config), "run.name=notes", "--steps", "1"]) == 2
    assert "holds files that bench did not make" in capsys.readouterr().err
    assert [p.name for p in other.iterdir()] == ["todo.txt"]


def test_bench_scratch_is_private_and_removed(tiny_config):
    """The bench trains in a temporary directory of its own inside its marked directory and
    deletes only that; a training run refuses the bench's directory."""
    from littlelm.train.checkpoint.rundir import BENCH_MARKER, check_run_dir

    cfg = load_run(tiny_config)
    run_bench(cfg, steps=1)
    target = cfg.run_dir().with_name("tiny-bench")
    assert sorted(p.name for p in target.iterdir()) == [BENCH_MARKER, "bench.json"]
    run_bench(cfg, steps=1)  # a second bench reuses its own directory
    with pytest.raises(RunDirError, match="scratch directory of `littlelm bench`"):
        check_run_dir(target)
