"""Resuming: which checkpoint, which config changes may apply to it, and what is restored."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from conftest import tiny_tree, write_config
from littlelm.cli import main
from littlelm.errors import CheckpointError, RunDirError
from littlelm.schema import RunConfig, load_run, resumable
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.checkpoint import resume as resuming
from littlelm.train.checkpoint.rundir import RunLock
from littlelm.train.trainer import Trainer


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny run stopped after 2 steps (one checkpoint), shared by the config-change tests."""
    from conftest import make_corpus

    root = tmp_path_factory.mktemp("resume")
    corpus = make_corpus(root / "corpus.txt")
    path = write_config(root / "tiny.yaml", tiny_tree(corpus, root / "runs"))
    with pytest.MonkeyPatch.context() as mp:  # the private cache (conftest._cache is per test)
        mp.setenv("LITTLELM_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        Trainer(load_run(path), resume="never").fit(stop_after=2)
    return path


REFUSED = [
    (["model.n_layer=3"], "model.n_layer: 2 -> 3"),
    (["model.d_model=64"], "model.d_model: 32 -> 64"),
    (["model.n_kv_head=1"], "model.n_kv_head"),
    (["model.max_seq_len=64", "train.seq_len=64"], "train.seq_len: 32 -> 64"),
    (["train.micro_batch_size=2"], "train.micro_batch_size: 4 -> 2"),
    (["run.seed=1"], "run.seed: 0 -> 1"),
    (["data.val_fraction=0.2"], "data.val_fraction"),
    (["data.buffer_docs=8"], "data.buffer_docs"),
    (["data.sources.text.split=file"], "data.sources.text.split"),
    (["optimizer.name=adamw"], "optimizer.name: 'muon' -> 'adamw'"),
]


@pytest.mark.parametrize("overrides, named", REFUSED, ids=[o[0] for o, _ in REFUSED])
def test_change_that_cannot_apply_is_refused_by_name(trained, overrides, named):
    with pytest.raises(CheckpointError, match="cannot change mid-run") as e:
        Trainer(load_run(trained, overrides))
    assert named in str(e.value)


def test_other_tokenizer_is_refused_by_name(tmp_path, trained):
    """A BPE tokenizer instead of bytes: the tokenizer and the vocabulary it implies."""
    with pytest.raises(CheckpointError) as e:
        Trainer(load_run(trained, ["data.tokenizer={name: bpe, vocab_size: 300}"]))
    msg = str(e.value)
    # the tokenizer's changed keys, in key order (bpe's chat_tokens sorts before name)
    assert msg.count("the tokenizer (data.tokenizer.") == 1
    assert "data.tokenizer.name: 'byte' -> 'bpe'" in msg
    assert "model.vocab_size: 257 -> 300" in msg


ALLOWED = [
    ["train.max_steps=9"],
    ["train.max_tokens=1024", "train.max_steps=null"],
    ["train.log_every=2", "train.grad_clip=0.5", "train.compile=true"],
    ["optimizer.lr=0.05", "optimizer.weight_decay=0.1", "optimizer.momentum=0.9"],
    ["schedule={name: cosine, warmup_steps: 1}"],
    ["eval.every=2", "eval.max_tokens=256"],
    ["checkpoint.every=1", "checkpoint.keep_last=3", "checkpoint.keep_every=2"],
    ["guard.spike_factor=4.0", "guard.on_persistent=stop"],
    ["callbacks=[{name: sample, every: 2}]"],
    ["data.sources.text.weight=2.0", "data.prefetch=1", "data.on_exhausted=stop"],
    ["run.device=auto", "run.name=forked"],
]


@pytest.mark.parametrize("overrides", ALLOWED, ids=[o[0] for o in ALLOWED])
def test_change_that_can_apply_is_allowed_and_logged(trained, overrides, capsys):
    cfg = load_run(trained, overrides)
    if cfg.run.name == "forked":  # another run directory: resume from the path
        path = ckpt.latest_checkpoint(load_run(trained).run_dir() / "checkpoints")
        trainer = Trainer(cfg, resume=str(path))
    else:
        trainer = Trainer(cfg)
    assert trainer.step == 2
    out = capsys.readouterr().out
    assert "resuming with changed settings: " in out
    for o in overrides:
        assert o.split("=")[0].split("{")[0] in out


def test_precision_may_change_on_resume_and_auto_records_what_ran(trained, capsys):
    """`precision: auto` is saved as what the run computed in; a resume may change it (a run
    moved to other hardware): weights and optimizer state are fp32 either way."""
    path = ckpt.latest_checkpoint(load_run(trained).run_dir() / "checkpoints")
    saved = json.loads((path / "state.json").read_text())["config"]["train"]["precision"]
    assert saved in ("bf16", "fp32")  # not "auto"
    other = "fp32" if saved == "bf16" else "bf16"
    trainer = Trainer(load_run(trained, [f"train.precision={other}"]))
    assert trainer.step == 2 and trainer.cfg.train.precision == other
    assert f"train.precision: '{saved}' -> '{other}'" in capsys.readouterr().out


def test_changed_optimizer_settings_take_effect(trained):
    """torch's load_state_dict would restore the checkpoint's lr and weight decay."""
    before = Trainer(load_run(trained))
    after = Trainer(load_run(trained, ["optimizer.lr=0.04", "optimizer.weight_decay=0.1"]))
    muon_before = [g for g in before.optimizer.param_groups if g["name"].startswith("matrix")]
    muon_after = [g for g in after.optimizer.param_groups if g["name"].startswith("matrix")]
    assert muon_after and all(
        a["base_lr"] == pytest.approx(2 * b["base_lr"]) and a["weight_decay"] == 0.1
        for a, b in zip(muon_after, muon_before)
    )
    a, b = after.optimizer.state_dict(), before.optimizer.state_dict()
    for k in a["state"]:  # the moments still come from the checkpoint
        for name, t in a["state"][k].items():
            assert torch.equal(t, b["state"][k][name])


def test_resume_never_refuses_to_mix_runs(trained):
    with pytest.raises(CheckpointError, match="already holds checkpoints.*--resume never"):
        Trainer(load_run(trained), resume="never")


def test_resume_from_an_older_checkpoint_of_the_same_run_is_refused(tmp_path, tiny_config):
    cfg = load_run(tiny_config)
    Trainer(cfg, resume="never").fit()  # checkpoints at 3 and 6
    old = cfg.run_dir() / "checkpoints" / "step_000003"
    with pytest.raises(CheckpointError, match=r"newer than .*step_000003 \(step_000006\)"):
        Trainer(cfg, resume=str(old))
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        Trainer(cfg, resume=str(tmp_path / "nowhere"))


def test_unreadable_newest_checkpoint_falls_back_to_the_previous(tiny_config):
    cfg = load_run(tiny_config)
    Trainer(cfg, resume="never").fit()
    root = cfg.run_dir() / "checkpoints"
    weights = root / "step_000006" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.warns(UserWarning, match="resuming from the one before it"):
        trainer = Trainer(cfg)
    assert trainer.step == 3
    with pytest.raises(ckpt.UnreadableCheckpoint):
        Trainer(cfg, resume=str(root / "step_000006"))


def test_resume_after_a_kill_between_renames(tiny_config):
    cfg = load_run(tiny_config)
    Trainer(cfg, resume="never").fit(stop_after=3)
    root = cfg.run_dir() / "checkpoints"
    shutil.move(root / "step_000003", root / "step_000003.replaced-77")
    trainer = Trainer(cfg)
    assert trainer.step == 3
    trainer.fit()  # puts it back, then trains on
    assert [d.name for d in ckpt.list_checkpoints(root)] == ["step_000003", "step_000006"]


def test_resuming_a_finished_run_rewrites_nothing(tmp_path, corpus, capsys):
    """Starting a finished run again says so, names how to go on, exits 0 and writes nothing:
    no second evaluation or end record in metrics.jsonl, no new checkpoint."""
    config = write_config(tmp_path / "c.yaml", tiny_tree(corpus, tmp_path / "runs"))
    cfg = load_run(config)
    Trainer(cfg, resume="never").fit()
    run_dir = cfg.run_dir()
    path = run_dir / "checkpoints" / "step_000006"
    before = load_file(path / "model.safetensors")

    def files():  # all but the run lock, which each process takes
        return {
            p: (p.stat().st_mtime_ns, p.read_bytes())
            for p in run_dir.rglob("*")
            if p.is_file() and p.name != ".lock"
        }

    before_files = files()
    capsys.readouterr()
    assert main(["train", str(config)]) == 0
    out = capsys.readouterr().out
    assert "has already finished" in out and "step 6 and train.max_steps is 6" in out
    assert "raise it (e.g. add train.max_steps=12 to the command)" in out
    assert files() == before_files
    result = Trainer(cfg).fit()
    assert result["finished"] and result["already_finished"] and result["step"] == 6
    after = load_file(path / "model.safetensors")
    assert all(torch.equal(before[k], after[k]) for k in before)

    # raising max_steps continues the run: its records follow on, one end record
    Trainer(load_run(config, ["train.max_steps=8"])).fit()
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["kind"] == "eval"] == [3, 6, 8]
    assert [r["step"] for r in recs if r["kind"] == "end"] == [8]


def test_one_trainer_per_run_directory(tiny_config):
    cfg = load_run(tiny_config)
    with RunLock(cfg.run_dir()), pytest.raises(RunDirError, match="in use by another littlelm"):
        Trainer(cfg, resume="never").fit()
    Trainer(cfg, resume="never").fit(stop_after=1)  # released: it works now


def test_config_changes_are_reported_with_values():
    old = {"model": {"d_model": 32}, "optimizer": {"name": "muon", "lr": 0.02}}
    new = {"model": {"d_model": 64}, "optimizer": {"name": "muon", "lr": 0.03}}
    allowed, refused = resuming.config_changes(old, new, RunConfig)
    assert allowed == ["optimizer.lr: 0.02 -> 0.03"]
    assert refused == ["model.d_model: 32 -> 64"]
    assert resumable("data.sources.web.weight")
    assert not resumable("data.sources.web.path")


def test_a_checkpoint_from_before_a_new_field_resumes_at_its_default(tiny_config):
    """Upgrading littlelm mid-run: fields added since the checkpoint was written (absent from
    its state.json) count as unchanged at their defaults, and as changed otherwise."""
    cfg = load_run(tiny_config)
    Trainer(cfg, resume="never").fit(stop_after=1)
    path = ckpt.latest_checkpoint(cfg.run_dir() / "checkpoints")
    state = json.loads((path / "state.json").read_text())
    del state["config"]["model"]["norm_eps"]  # a field this checkpoint's littlelm lacked
    del state["config"]["data"]["sources"]["text"]["long_docs"]
    (path / "state.json").write_text(json.dumps(state))
    resumed = Trainer(load_run(tiny_config))
    assert resumed.step == 1
    with pytest.raises(CheckpointError, match="model.norm_eps: None -> 1e-05"):
        Trainer(load_run(tiny_config, ["model.norm_eps=1e-5"]))


def test_filesystem_without_locks_warns_and_goes_on(tiny_config, monkeypatch):
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    trainer = Trainer(load_run(tiny_config), resume="never")  # data prepared (it locks too)
    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.warns(UserWarning, match="cannot lock .*No locks available"):
        assert trainer.fit(stop_after=1)["step"] == 1


def test_strided_optimizer_state_resumes_like_a_compact_one():
    """Moments saved as strided views (as ZeroAdamW's checkpoints were: views into one gathered
    buffer) must step exactly like compact ones; fused AdamW kernels assume contiguous state."""

    def adamw() -> tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]:
        params = [torch.nn.Parameter(torch.full((2,), 0.5)), torch.nn.Parameter(torch.zeros(2))]
        return torch.optim.AdamW([{"params": params, "lr": 0.5}], fused=True), params

    def step_after_loading(moments: list[torch.Tensor]) -> list[torch.Tensor]:
        opt, params = adamw()
        sd = opt.state_dict()
        sd["state"] = {
            i: {"step": torch.tensor(2.0), "exp_avg": moments[i], "exp_avg_sq": moments[i + 2]}
            for i in range(2)
        }
        resuming.load_optimizer_state(opt, sd)
        for p, g in zip(params, ([-0.05, -0.03], [-0.07, -0.1])):
            p.grad = torch.tensor(g)
        opt.step()
        return [p.detach().clone() for p in params]

    values = [[2e-4, 1e-4], [3e-4, 5e-4], [4e-8, 1e-8], [9e-8, 2e-7]]  # exp_avg, then exp_avg_sq
    buffer = torch.zeros(2, 100)  # (ranks, gathered): each moment is a column of it
    for col, v in enumerate(values):
        buffer[:, col] = torch.tensor(v)
    strided = [buffer[:, col] for col in range(4)]
    assert not strided[0].is_contiguous()
    want = step_after_loading([torch.tensor(v) for v in values])
    got = step_after_loading(strided)
    for a, b in zip(want, got):
        assert torch.equal(a, b)
