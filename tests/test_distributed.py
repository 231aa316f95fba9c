"""Data-parallel training on the CPU with gloo: 2 processes against 1, resumes across world
sizes, the sharded optimizers, and the errors of a broken environment.

The corpus has documents of exactly seq_len + 1 tokens and the packer buffers one document, so
every row is one document in the seeded order and the global batch of 2 ranks x 1 row equals
that of 1 process x 2 accumulated rows: the loss trajectories must agree. Every multi-process
run is a real `littlelm train` under torchrun, killed if it outlives its timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import WORDS, tiny_tree, write_config
from littlelm.errors import CheckpointError, ConfigError, DistributedError
from littlelm.schema import load_run
from littlelm.train import distributed
from littlelm.train.distributed import DistEnv, DistributedConfig, Parallel, detect_env
from littlelm.train.trainer import Trainer

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def equal_docs(path: Path, n: int = 48, chars: int = 31) -> Path:
    """Paragraphs of `chars` ASCII characters: with the newline and BOS, 33 byte tokens each."""
    rng = random.Random(0)
    paras = []
    for _ in range(n):
        text = ""
        while len(text) < chars:
            text += rng.choice(WORDS) + " "
        paras.append(text[:chars])
    path.write_text("\n\n".join(paras))  # no trailing newline: the last paragraph is 31 + 1 too
    return path


def run_procs(cmd: list[str], cwd: Path, timeout: float = 120, ok: bool = True) -> str:
    """Run a command that starts torchrun; on timeout torchrun is told to stop its workers
    (SIGTERM), then killed. Returns the output; the exit status must be zero (ok) or not."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} ran over {timeout}s:\n{out[-3000:]}")
    assert (proc.returncode == 0) == ok, f"{' '.join(cmd)}: exit {proc.returncode}\n{out[-5000:]}"
    return out


@contextlib.contextmanager
def cwd(path: Path):
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def losses(run: Path, kind: str = "train", key: str = "loss") -> dict[int, float]:
    lines = (run / "runs/tiny/metrics.jsonl").read_text().splitlines()
    return {r["step"]: r[key] for r in map(json.loads, lines) if r["kind"] == kind}


def weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run / f"runs/tiny/checkpoints/step_{step:06d}/model.safetensors")


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], msg=k)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """`one`: 1 process, 2 accumulated rows per step; `two`: 2 processes (DDP, sharded Muon and
    AdamW), 1 row each. Both: 4 steps, checkpoints at 2 and 4, relative out_dir `runs`."""
    base = tmp_path_factory.mktemp("dist")
    tree = tiny_tree(
        equal_docs(base / "corpus.txt"),
        Path("runs"),
        data={"buffer_docs": 1},
        train={"micro_batch_size": 1, "batch_tokens": 64, "max_steps": 4, "precision": "fp32"},
        eval={"every": 2, "max_tokens": 256},
        checkpoint={"every": 2, "keep_last": 3},
        distributed={"timeout_s": 60, "shard_adamw": True},
    )
    config = write_config(base / "run.yaml", tree)
    (base / "one").mkdir()
    (base / "two").mkdir()
    with cwd(base / "one"):
        Trainer(load_run(config), resume="never").fit()
    out = run_procs(
        [sys.executable, "-m", "littlelm", "train", str(config), "--nproc", "2"], base / "two"
    )
    (base / "two" / "stdout.txt").write_text(out)
    return {"base": base, "config": config, "one": base / "one", "two": base / "two"}


def copy_run(runs: dict, name: str, dest: Path) -> Path:
    shutil.copytree(runs[name], dest)
    return dest


def test_two_processes_match_one_process(runs):
    one, two = runs["one"], runs["two"]
    assert list(losses(two)) == [1, 2, 3, 4]
    torch.testing.assert_close(losses(two), losses(one))  # fp32 tolerance, every step
    torch.testing.assert_close(losses(two, "eval", "val_loss"), losses(one, "eval", "val_loss"))
    assert_same_weights(weights(two, 4), weights(one, 4))
    out = (two / "stdout.txt").read_text()
    assert out.count("step 4/4") == 1  # only rank 0 prints
    assert "× 2 ranks (ddp)" in out
    resolved = (two / "runs/tiny/config.yaml").read_text()
    assert "world_size: 2" in resolved and "grad_accum: 1" in resolved


def test_resume_with_same_world_size_is_bitwise(runs, tmp_path):
    run = copy_run(runs, "two", tmp_path / "again")
    shutil.rmtree(run / "runs/tiny/checkpoints/step_000004")
    run_procs([*TORCHRUN, "-m", "littlelm", "train", str(runs["config"])], run)
    assert losses(run) == losses(runs["two"])  # exact floats: each rank's data position restored


def test_checkpoint_of_two_processes_resumes_in_one(runs, tmp_path):
    run = copy_run(runs, "two", tmp_path / "down")
    shutil.rmtree(run / "runs/tiny/checkpoints/step_000004")  # --resume PATH refuses newer ones
    step2 = run / "runs/tiny/checkpoints/step_000002"
    with cwd(run):
        trainer = Trainer(load_run(runs["config"]), resume=str(step2))
        assert trainer.step == 2 and trainer.cfg.train.grad_accum == 2
        trainer.fit()
    torch.testing.assert_close(losses(run), losses(runs["two"]))
    assert_same_weights(weights(run, 4), weights(runs["two"], 4))


def test_checkpoint_of_one_process_resumes_in_two_with_fsdp(runs, tmp_path):
    run = copy_run(runs, "one", tmp_path / "up")
    shutil.rmtree(run / "runs/tiny/checkpoints/step_000004")  # --resume PATH refuses newer ones
    step2 = "runs/tiny/checkpoints/step_000002"
    cmd = [*TORCHRUN, "-m", "littlelm", "train", str(runs["config"]), "distributed.strategy=fsdp"]
    out = run_procs([*cmd, "--resume", step2], run)
    assert "written by 1 process(es), this run has 2" in out
    torch.testing.assert_close(losses(run), losses(runs["one"]))
    assert_same_weights(weights(run, 4), weights(runs["one"], 4))


def test_fsdp_in_bf16_with_a_callback_that_runs_the_model(runs, tmp_path):
    """bf16 mixed precision under FSDP, the sample callback on every rank (a forward pass needs
    them all) writing once, and the grad norm of sharded gradients without clipping."""
    cmd = [*TORCHRUN, "-m", "littlelm", "train", str(runs["config"]), "distributed.strategy=fsdp"]
    cmd += ["train.precision=bf16", "train.grad_clip=null", "train.max_steps=2"]
    cmd += ['callbacks=[{name: sample, max_tokens: 6, prompt: "the", temperature: 0}]']
    out = run_procs(cmd, tmp_path)
    assert out.count("--- sample at step 2 ---") == 1
    assert (tmp_path / "runs/tiny/samples.txt").read_text().count("=== step 2") == 1
    norms = losses(tmp_path, key="grad_norm")
    assert list(norms) == [1, 2] and all(0 < n < 100 for n in norms.values())


def test_sharded_optimizers_equal_single_process(tmp_path):
    """Sharded Muon (ddp and fsdp), ZeRO-1 AdamW and FSDP AdamW against the single-process
    optimizer on the same gradients, their whole state, and a load of the single-process state
    (in today's layout and in the one written before MuonAdamW, optim/migrate.py); the same for
    a new optimizer's elementwise rule (Lion, tests/test_optim_traits.py)."""
    out = tmp_path / "result.json"
    run_procs([*TORCHRUN, str(ROOT / "tests/dist_optim_worker.py"), str(out)], tmp_path)
    result = json.loads(out.read_text())
    assert result.pop("agree_raised") is True
    assert {"resumed_ddp", "migrated_ddp", "migrated_fsdp"} <= result.keys()
    assert {"lion_state_zero", "lion_resumed_fsdp"} <= result.keys()  # a new optimizer's rule
    for name, diff in result.items():
        assert diff <= 1e-6, (name, diff)


def test_a_failing_rank_stops_the_run_with_its_message(runs, tmp_path):
    """Rank 0 fails while preparing data (the others wait for it): the run exits non-zero at once,
    with rank 0's one-line error, and no process is left waiting."""
    tree = yaml.safe_load(runs["config"].read_text())
    tree["data"]["sources"]["text"]["path"] = str(tmp_path / "missing.txt")
    config = write_config(tmp_path / "bad.yaml", tree)
    cmd = [sys.executable, "-m", "littlelm", "train", str(config), "--nproc", "2"]
    out = run_procs(cmd, tmp_path, timeout=60, ok=False)
    assert "error: data.sources.text.path: no text files" in out


# ----------------------------------------------------------------------------------------------
# Reliability under several ranks: the loss guard, signals, the run lock (docs/reliability.md)


def fault_run(runs: dict, run: Path, faults: dict[str, str], *overrides: str) -> list[dict]:
    """tests/dist_fault_worker.py under torchrun in `run`: faults on rank 1 only; every rank's
    `fit()` result."""
    cmd = [*TORCHRUN, str(ROOT / "tests/dist_fault_worker.py"), str(runs["config"]), "result"]
    run.mkdir(exist_ok=True)
    with patch_env(faults):
        run_procs([*cmd, *overrides], run)
    return [json.loads((run / f"result.rank{r}.json").read_text()) for r in range(2)]


@contextlib.contextmanager
def patch_env(values: dict[str, str]):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


def test_guard_decides_the_same_on_every_rank(runs, tmp_path):
    """Rank 1 alone sees a NaN loss (its gradients are finite, so rank 0 cannot tell from the
    reduced gradients): both ranks skip that update; two in a row make both roll back to the
    same checkpoint and go on. A rank that decided alone would hang in the sharded optimizer.
    DDP and FSDP (where each rank reloads its slice of the checkpoint) give the same losses
    after the rollback (an update left in place would move the next loss by ~1e-2)."""
    for strategy in ("ddp", "fsdp"):
        results = fault_run(
            runs,
            tmp_path / strategy,
            {"FAULT_NAN_CALLS": "2,6,7"},
            "train.max_steps=8",
            "checkpoint.every=4",
            "guard.max_consecutive=2",
            f"distributed.strategy={strategy}",
        )
        for r in results:
            r.pop("train_time")  # each rank's own clock
        assert results[0] == results[1]
        assert results[0]["step"] == 8 and results[0]["finished"]
        assert results[0]["skipped_steps"] == 3 and results[0]["rollbacks"] == 1
        metrics = tmp_path / strategy / "runs/tiny/metrics.jsonl"
        records = [json.loads(line) for line in metrics.open()]
        skips = [r["step"] for r in records if r.get("skipped")]
        rollbacks = [(r["step"], r["failed_at"]) for r in records if r["kind"] == "rollback"]
        assert skips == [2] and rollbacks == [(4, 7)]  # the records of steps 5-7 were dropped
        assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, 9))
    # fp32 reductions in another order, amplified by Newton-Schulz in bf16: close, not equal
    # (1.6e-5 apart by step 8 on a CPU with AMX bf16 units, under 1e-5 on one without)
    for kind, key in (("train", "loss"), ("eval", "val_loss")):
        ddp, fsdp = losses(tmp_path / "ddp", kind, key), losses(tmp_path / "fsdp", kind, key)
        torch.testing.assert_close(fsdp, ddp, rtol=1e-4, atol=0)


def test_sigterm_on_one_rank_stops_every_rank_with_one_checkpoint(runs, tmp_path):
    """The writer's save of step 2 fails (disk full, checkpoint.on_save_error=continue): every
    rank counts it and goes on. SIGTERM reaches rank 1 only, during step 3: every rank stops
    after step 3, one whole checkpoint of step 3 is written, every process exits 0, and the
    checkpoint resumes (here in one process) to the same end as the uninterrupted run."""
    faults = {"FAULT_SIGTERM_CALL": "3", "FAULT_SAVE_FAIL_STEP": "2"}
    results = fault_run(runs, tmp_path, faults, "checkpoint.on_save_error=continue")
    for r in results:
        assert r["stopped_by"] == "SIGTERM" and r["step"] == 3 and not r["finished"]
        assert r["save_failures"] == 1
    ckpts = sorted(p.name for p in (tmp_path / "runs/tiny/checkpoints").iterdir())
    assert ckpts == ["step_000003"]  # the failed save left nothing behind
    state = json.loads((tmp_path / "runs/tiny/checkpoints/step_000003/state.json").read_text())
    assert state["step"] == 3 and state["loader_world_size"] == 2
    with cwd(tmp_path):
        trainer = Trainer(load_run(runs["config"]))
        assert trainer.step == 3
        assert trainer.fit()["finished"]
    torch.testing.assert_close(losses(tmp_path), losses(runs["two"]))
    assert_same_weights(weights(tmp_path, 4), weights(runs["two"], 4))


def test_run_lock_and_finished_restart_under_torchrun(runs, tmp_path):
    """Only rank 0 takes RUN_DIR/.lock: a directory in use stops every rank with the lock's
    message (no rank left waiting); a finished run started again exits 0 on every rank."""
    from littlelm.train.checkpoint.rundir import RunLock

    run = copy_run(runs, "two", tmp_path / "again")
    cmd = [*TORCHRUN, "-m", "littlelm", "train", str(runs["config"])]
    with RunLock(run / "runs/tiny"):
        out = run_procs(cmd, run, timeout=60, ok=False)
    assert out.count("is in use by another littlelm process") == 2  # rank 0's and rank 1's
    out = run_procs(cmd, run)
    assert out.count("has already finished") == 1  # printed by rank 0, exit 0 everywhere


def children(pid: int) -> list[int]:
    """The live child processes of `pid` (from /proc)."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            stat = (d / "stat").read_text() if d.name.isdigit() else ""
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split() if stat else []
        if fields and fields[0] not in "ZX" and int(fields[1]) == pid:
            found.append(int(d.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_of_a_killed_torchrun_stop_with_a_checkpoint(runs, tmp_path):
    """torchrun SIGKILLed alone (its workers run in sessions of their own): the kernel sends
    each worker SIGTERM, every rank stops after the same step with one checkpoint and exits,
    and the run directory is free for the restart. Before, the orphaned workers trained on to
    max_steps holding the run lock, and the restart was refused as "in use"."""
    from littlelm.train.checkpoint.rundir import RunLock

    cmd = [sys.executable, "-m", "littlelm", "train", str(runs["config"]), "train.max_steps=100000",
           "eval.every=0", "checkpoint.every=100000", "--nproc", "2"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    lines = []
    for line in proc.stdout:  # EOF (the run failed) ends the loop too
        lines.append(line)
        if line.startswith("step 3/"):
            break
    workers = children(proc.pid)
    assert len(workers) == 2, "".join(lines)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    try:
        out, _ = proc.communicate(timeout=60)  # EOF once both workers have exited
    except subprocess.TimeoutExpired:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pytest.fail("the workers of a killed torchrun are still training 60 s later")
    stop = [line for line in out.splitlines() if line.startswith("stopped by SIGTERM at step")]
    assert len(stop) == 1, out[-3000:]  # rank 0 reports it once
    step = int(stop[0].split()[5].rstrip(";"))
    state = json.loads((tmp_path / f"runs/tiny/checkpoints/step_{step:06d}/state.json").read_text())
    assert state["step"] == step and state["loader_world_size"] == 2
    with RunLock(tmp_path / "runs/tiny"):  # nobody holds the run lock any more
        pass


def test_stop_with_launcher_is_armed_only_under_torchrun():
    assert not distributed.stop_with_launcher({"RANK": "0", "WORLD_SIZE": "2"})


def test_a_failed_save_stops_every_rank_with_the_writers_error(runs, tmp_path):
    """checkpoint.on_save_error=stop (the default): rank 0's failed save raises the same
    CheckpointError (exit 2) on every rank; nothing is left half-written."""
    cmd = [*TORCHRUN, str(ROOT / "tests/dist_fault_worker.py"), str(runs["config"]), "result"]
    with patch_env({"FAULT_SAVE_FAIL_STEP": "2"}):
        out = run_procs(cmd, tmp_path, timeout=60, ok=False)
    assert out.count("error: cannot save the checkpoint of step 2") == 2
    assert "exitcode  : 2" in out and "exitcode  : 1" not in out
    assert not any((tmp_path / "runs/tiny/checkpoints").iterdir())


# ----------------------------------------------------------------------------------------------
# Environment and config errors (one process)


def test_detect_env():
    assert detect_env({}) == DistEnv()
    env = detect_env(
        {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
         "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
    )  # fmt: skip
    assert (env.rank, env.world_size, env.local_rank, env.master) == (3, 4, 1, "node0:29500")


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR, MASTER_PORT missing"),
        ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "outside"),
        ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "not an integer"),
        ({"SLURM_NTASKS": "8"}, "srun torchrun"),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2",
             "MASTER_ADDR": "a", "MASTER_PORT": "1"},
            "LOCAL_RANK=2",
        ),
    ],
)  # fmt: skip
def test_broken_environment_is_refused(environ, message):
    with pytest.raises(DistributedError, match=message):
        detect_env(environ)


def test_unreachable_master_is_a_clear_error():
    """Rank 1 of 2 whose rendezvous never answers: a DistributedError naming the address."""
    code = (
        "import torch; from littlelm.train import distributed as d\n"
        "cfg = d.DistributedConfig(timeout_s=2)\n"
        "env = d.DistEnv(1, 2, 0, 1, '127.0.0.1:9')\n"
        "try:\n"
        "    with d.session(cfg, torch.device('cpu'), env): pass\n"
        "except d.DistributedError as e: print('ERR', e)\n"
    )
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "9", "RANK": "1",
           "WORLD_SIZE": "2"}  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    ).stdout
    assert "ERR rank 1 of 2 could not join the process group at 127.0.0.1:9" in out, out


def test_nccl_on_cpu_and_nproc_errors(monkeypatch):
    with pytest.raises(DistributedError, match="backend=gloo"):
        distributed.pick_backend("nccl", "cpu")
    assert distributed.pick_backend("auto", "cpu") == "gloo"
    assert distributed.pick_backend("auto", "cuda") == "nccl"
    with pytest.raises(DistributedError, match="at least 1"):
        distributed.launch(0, ["train"])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(DistributedError, match="--nproc 4 but 2 GPU"):
        distributed.launch(4, ["train"])
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(DistributedError, match="already one of torchrun's workers"):
        distributed.launch(2, ["train"])
    with pytest.raises(DistributedError, match="no distributed session"):
        Parallel.single(DistributedConfig())


def test_config_checks(tiny_config):
    cfg = load_run(tiny_config, world_size=2)
    assert cfg.distributed.world_size == 2 and cfg.train.batch_tokens == 4 * 32 * 2
    with pytest.raises(ConfigError, match="distributed.world_size is 4 but 2"):
        load_run(tiny_config, ["distributed.world_size=4"], world_size=2)
    with pytest.raises(ConfigError, match="on_exhausted=stop needs a single process"):
        load_run(tiny_config, ["data.on_exhausted=stop"], world_size=2)
    with pytest.raises(ConfigError, match="shard_muon=false is ddp-only"):
        load_run(tiny_config, ["distributed.strategy=fsdp", "distributed.shard_muon=false"])
    with pytest.raises(ConfigError, match="adamw_8bit is not supported with several"):
        load_run(tiny_config, ["optimizer.adamw_8bit=true"], world_size=2)
    bf16 = ["train.precision=bf16", "train.master_weights=bf16", "distributed.strategy=fsdp"]
    with pytest.raises(ConfigError, match="master_weights=bf16 is not supported with"):
        load_run(tiny_config, bf16, world_size=2)
    load_run(tiny_config, bf16, world_size=1)  # one process: fsdp is not used


def test_world_size_change_needs_the_same_global_batch(tiny_config):
    """A checkpoint of 2 processes x 4 rows, resumed by 1 process x 4 rows: refused, naming
    the batch_tokens that keeps the global batch."""
    cfg = load_run(tiny_config)
    Trainer(cfg, resume="never").fit(stop_after=2)
    saved = cfg.run_dir() / "checkpoints/step_000002/state.json"
    state = json.loads(saved.read_text())
    state["config"]["distributed"]["world_size"] = 2
    state["config"]["train"]["batch_tokens"] = 256
    saved.write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=r"set train.batch_tokens=256 to keep the global"):
        Trainer(load_run(tiny_config))
