"""Issue 24: hostile or careless inputs and faults that must end in a clear error (or, for a
repeated signal, the documented exit) without a traceback, changing nothing outside the run."""

from __future__ import annotations

import pytest

from conftest import tiny_tree, write_config
from littlelm.cli import main
from littlelm.errors import ConfigError, RunDirError
from littlelm.schema import load_run
from littlelm.train.trainer import Trainer


@pytest.mark.parametrize("name", ["", ".", "..", "../victim", "a/b", "/abs/path", "a\\b"])
def test_run_name_is_one_path_component(tiny_config, name):
    with pytest.raises(ConfigError, match=r"run\.name .*must be one directory name"):
        load_run(tiny_config, [f"run.name={name!r}" if name else "run.name=''"])


def test_run_name_refused_by_train_without_writing(tmp_path, corpus, capsys):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "config.yaml").write_text("mine\n")
    cfg = write_config(tmp_path / "t.yaml", tiny_tree(corpus, tmp_path / "runs"))
    assert main(["train", str(cfg), "run.name=../victim"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "run.name" in err and "Traceback" not in err
    assert [p.name for p in victim.iterdir()] == ["config.yaml"]
    assert (victim / "config.yaml").read_text() == "mine\n"
    assert not (tmp_path / "runs").exists()


def test_run_name_too_long_is_a_config_error(tmp_path, corpus, capsys):
    """Issue 36.16: a 300-character run.name was an OSError (File name too long) at training."""
    cfg = write_config(tmp_path / "t.yaml", tiny_tree(corpus, tmp_path / "runs"))
    with pytest.raises(ConfigError, match=r"run\.name .*is 300 bytes long.*at most 200 bytes"):
        load_run(cfg, ["run.name=" + "n" * 300])
    assert main(["train", str(cfg), "run.name=" + "é" * 101]) == 2  # 202 bytes in UTF-8
    err = capsys.readouterr().err
    assert "error:" in err and "choose a shorter one" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()
    load_run(cfg, ["run.name=" + "n" * 200])  # the longest name is accepted


def test_non_empty_directory_that_is_not_a_run_is_refused(tmp_path, corpus, capsys):
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.yaml").write_text("mine\n")
    (project / "metrics.jsonl").write_text("{}\n")
    tree = tiny_tree(corpus, tmp_path, run={"name": "project"})
    with pytest.raises(RunDirError, match="is not a littlelm run directory"):
        Trainer(load_run(write_config(tmp_path / "t.yaml", tree)))
    assert main(["train", str(tmp_path / "t.yaml")]) == 2
    assert "choose another run.name" in capsys.readouterr().err
    assert sorted(p.name for p in project.iterdir()) == ["config.yaml", "metrics.jsonl"]
    assert (project / "metrics.jsonl").read_text() == "{}\n"
    # an empty directory, or a run (it holds .lock), is accepted
    (tmp_path / "empty").mkdir()
    Trainer(load_run(tmp_path / "t.yaml", ["run.name=empty"]))
    (project / ".lock").touch()
    Trainer(load_run(tmp_path / "t.yaml"))


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8)
)


def test_yaml_alias_bomb_is_refused_quickly(tmp_path, capsys):
    """Issue 24.4: nested aliases expanding to 10^9 values are refused in well under a second,
    and the error is one short line."""
    import time

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB + "model: *i\n")
    assert len(bomb.read_bytes()) < 500
    t0 = time.perf_counter()
    assert main(["config", "show", str(bomb)]) == 2
    assert time.perf_counter() - t0 < 5
    err = capsys.readouterr().err
    assert "aliases (*name) expand to more than 1,000,000 values" in err and len(err) < 500


def test_values_quoted_in_errors_are_truncated(tiny_config, tmp_path, capsys):
    """A large (but allowed) value of the wrong type is quoted in a few hundred characters."""
    text = "x: &x [" + ", ".join(["long-string" * 20] * 200) + "]\n" + tiny_config.read_text()
    bad = tmp_path / "big.yaml"
    bad.write_text(text.replace("max_steps: 6", "max_steps: *x"))
    assert main(["config", "show", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "train.max_steps" in err and "..." in err and len(err) < 1500


def test_duplicate_yaml_keys_are_refused_naming_both_lines(tmp_path, tiny_config, capsys):
    """Issue 24.9: a second `train:` section (or any repeated key) is refused, not merged."""
    dup = tmp_path / "dup.yaml"
    dup.write_text(
        tiny_config.read_text() + "train:\n  max_steps: 3\n"
    )  # tiny_config already has a train section
    with pytest.raises(ConfigError) as e:
        load_run(dup)
    msg = str(e.value)
    first = 1 + tiny_config.read_text().splitlines().index("train:")
    last = len(tiny_config.read_text().splitlines()) + 1
    assert f"dup.yaml:{last}: duplicate key 'train', already set at line {first}" in msg
    inner = tmp_path / "inner.yaml"
    inner.write_text("run:\n  name: a\n  seed: 1\n  name: b\n")
    assert main(["config", "show", str(inner)]) == 2
    assert "inner.yaml:4: duplicate key 'name', already set at line 2" in capsys.readouterr().err
    # YAML merge keys may still be overridden by the mapping's own keys
    merged = tmp_path / "merged.yaml"
    merged.write_text("base: &b {n_layer: 2, d_model: 32}\nmodel:\n  <<: *b\n  n_layer: 3\n")
    from littlelm.config import read_yaml

    assert read_yaml(merged)["model"] == {"n_layer": 3, "d_model": 32}


def test_repeated_signal_during_teardown_is_ignored(tmp_path):
    """Issue 24.7: after a signal-stop has saved, the handlers are not restored to the defaults,
    so a second SIGTERM or Ctrl-C during teardown cannot turn the documented exit 0 into 143."""
    import subprocess
    import sys

    script = (
        "import os, signal\n"
        "from littlelm.train.signals import StopSignals\n"
        "with StopSignals(persist=True) as stop:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "assert stop.requested == 'SIGTERM'\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "print('survived')\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "survived" in r.stdout, r.stderr


def test_signal_during_teardown_of_a_rank_stopped_by_another_is_ignored():
    """Under torchrun a rank stopped by another rank's SIGTERM had its default handlers back for
    the teardown, so a SIGTERM there killed it (143) and torchrun exited 1 (faults.py --nproc 2)."""
    import subprocess
    import sys

    script = (
        "import os, signal\n"
        "from littlelm.train.signals import StopSignals\n"
        "with StopSignals(persist=True) as stop:\n"
        "    stop.agreed = 'SIGTERM'\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('survived')\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "survived" in r.stdout, (r.returncode, r.stderr)


def test_a_stop_in_a_library_call_gives_the_handlers_back():
    """A Trainer used in-process (a notebook, a test, a sweep's bench) stopped by a signal: the
    handlers in place before come back, so Ctrl-C works there again (they were left ignoring
    SIGTERM and SIGINT for the rest of the process)."""
    import os
    import signal

    from littlelm.train.signals import StopSignals

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
    assert stop.requested == "SIGTERM"
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_process_started_after_a_stop_can_still_be_stopped_by_sigterm():
    """After an in-process stop the signals are not left as SIG_IGN, which is inherited across
    exec: every process started afterwards (a test suite's later subprocesses, a notebook's)
    ignored SIGTERM and could hang at start-up."""
    import subprocess
    import sys

    script = (
        "import os, signal, subprocess, sys\n"
        "from littlelm.train.signals import StopSignals\n"
        "with StopSignals() as stop:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "child.send_signal(signal.SIGTERM)\n"
        "print('child', child.wait(timeout=30))\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "child -15" in r.stdout, (r.returncode, r.stdout, r.stderr)


def test_disk_full_at_start_is_a_clear_error(tmp_path, monkeypatch):
    """Issue 24.6: ENOSPC while writing the run lock's pid is a RunDirError (exit 2, which the
    documented restart loop does not retry), not a raw OSError traceback with exit 1."""
    import errno
    import os

    from littlelm.train.checkpoint.rundir import RunLock

    def full(*a):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(RunDirError, match="cannot write to the run directory .*free disk") as e:
        RunLock(tmp_path / "run").__enter__()
    assert e.value.exit_code == 2


def test_wrong_typed_state_json_is_unreadable(tmp_path):
    import json

    from littlelm.train.checkpoint import files as ckpt

    path = tmp_path / "step_000006"
    path.mkdir()
    for state in ({"step": "6"}, {"step": 6, "loader": []}, [6]):
        (path / "state.json").write_text(json.dumps(state))
        with pytest.raises(ckpt.UnreadableCheckpoint, match="state.json"):
            ckpt.check_state_types(json.loads((path / "state.json").read_text()), path)
        with pytest.raises(ckpt.UnreadableCheckpoint, match="state.json (field|is not)"):
            ckpt.load_checkpoint(path)


def test_wrong_typed_state_json_falls_back_to_previous_checkpoint(tiny_config, recwarn):
    """Issue 24.6: a checkpoint whose state.json has a wrong-typed field is skipped like a
    corrupt one, and the run resumes from the checkpoint before it."""
    import json

    cfg = load_run(tiny_config)
    Trainer(cfg).fit()
    newest = cfg.run_dir() / "checkpoints" / "step_000006" / "state.json"
    state = json.loads(newest.read_text())
    state["step"] = "6"
    newest.write_text(json.dumps(state))
    resumed = Trainer(load_run(tiny_config, ["train.max_steps=8"]))
    assert resumed.step == 3
    assert any("field 'step' is a str" in str(w.message) for w in recwarn)


@pytest.mark.parametrize("key", ["optimizer.lr", "train.grad_clip", "guard.spike_factor"])
def test_non_finite_settings_are_refused(tiny_config, key):
    """Issue 24.5: lr=.inf passed validation (pydantic floats accept inf, and `gt=0` with it;
    nan and -inf already fail `gt`)."""
    with pytest.raises(ConfigError, match=rf"{key} .*must be a finite number, got inf"):
        load_run(tiny_config, [f"{key}=.inf"])


def test_collapsed_run_is_detected_like_a_spike():
    """Issue 24.5: zero gradient norm with the loss at ln(V) for collapse_steps steps is bad:
    skipped, and after max_consecutive more, rolled back (lr=1e6 trained "successfully" into a
    dead model before)."""
    import math

    from littlelm.train.guard import Collapse, GuardConfig, LossGuard, Verdict

    guard = LossGuard(GuardConfig(collapse_steps=4, max_consecutive=2))
    guard.collapse = Collapse(256, 4)
    dead = math.log(256)
    verdicts = [guard.verdict(dead, 0.0) for _ in range(5)]
    assert verdicts == [Verdict.OK] * 3 + [Verdict.SKIP, Verdict.ROLLBACK]
    assert "collapsed" in guard.reason and "ln(vocab)" in guard.reason
    assert guard.verdict(dead, 0.3) is Verdict.OK  # gradients flow again: not collapsed
    assert guard.verdict(2.0, 0.0) is Verdict.OK  # a zero norm alone is not a collapse
    off = LossGuard(GuardConfig(collapse_steps=0))
    off.collapse = Collapse(256, 0)
    assert all(off.verdict(dead, 0.0) is Verdict.OK for _ in range(30))


def test_warnings_print_without_a_source_line(tiny_config, monkeypatch, capsys):
    """Issue 24.10: the CLI prints a warning as one `warning: ...` line, not Python's
    `file.py:123: UserWarning: ...` followed by the source line that raised it."""
    import warnings

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # restored after
    assert main(["config", "show", str(tiny_config)]) == 0
    text = warnings.formatwarning(UserWarning("resuming from step_3"), UserWarning, "x.py", 7)
    assert text == "warning: resuming from step_3\n"


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_shard_names_the_directory_to_delete(tmp_path, damage):
    """Issue 24.3: the error names the dataset directory (and `littlelm data prepare`, which
    rebuilds its damaged shards: tests/test_prepare.py)."""
    import json

    import numpy as np

    from littlelm.data.shards import Shard, ShardWriter
    from littlelm.errors import DataError

    ds = tmp_path / "datasets" / "main-abc"
    (ds / "train").mkdir(parents=True)
    (ds / "manifest.json").write_text(json.dumps({"key": "abc"}))
    w = ShardWriter(ds / "train" / "00000.bin", 256, 0, "f" * 16)
    for n in (5, 9, 7):
        w.add(np.arange(n, dtype=np.uint16))
    w.close()
    path = ds / "train" / "00000.bin"
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[-3] ^= 0xFF
    else:
        raw = raw[:-10]
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=f"delete {ds} \\(the prepared dataset"):
        Shard(path)


def test_plan_refuses_or_answers_huge_depths_quickly(tiny_config, capsys, recwarn):
    """Issue 24.8: plan with model.n_layer=1000000 ran past 120 s and 2 GB; 1,000 layers with
    the trace took 82 s. Now the first is refused at once, the second answered without it."""
    assert main(["plan", str(tiny_config), "model.n_layer=1000000", "--no-trace"]) == 2
    assert "model.n_layer 1,000,000 is beyond" in capsys.readouterr().err
    assert main(["plan", str(tiny_config), "model.n_layer=1000"]) == 0
    assert any("analytic estimate only" in str(w.message) for w in recwarn)


def test_empty_validation_split_is_explained_at_start_not_logged_as_nan(tmp_path, corpus, capsys):
    """Issue 24.10: with nothing held out, every evaluation printed `val loss nan` and no hint;
    now the start says why and what to set, and no evaluation is logged."""
    import json

    tree = tiny_tree(corpus, tmp_path / "runs", data={"val_fraction": 0.0})
    assert main(["train", str(write_config(tmp_path / "t.yaml", tree))]) == 0
    out = capsys.readouterr().out
    assert "warning: data.sources.text holds out 0 of its 120 documents" in out
    assert "data.val_fraction 0.0" in out and "Raise data.val_fraction" in out
    assert "set data.val_split=tail, which holds out the last pieces" in out  # one long file
    assert "eval.every=0" in out and "nan" not in out
    assert out.index("warning: data.sources.text") < out.index("step 1")
    lines = (tmp_path / "runs/tiny/metrics.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines]
    assert not [r for r in records if r.get("kind") == "eval"]
    assert not any("val_loss" in r for r in records)


def test_a_source_too_small_to_evaluate_is_named_and_left_out():
    from types import SimpleNamespace

    from littlelm.data.build import PreparedSource, RunData

    class S(SimpleNamespace):  # a shard: its header, its tokens and its number of documents
        def __len__(self):
            return 1

    def source(label, val_tokens):
        val = [S(header=SimpleNamespace(n_tokens=val_tokens), n_tokens=val_tokens)]
        m = {"documents": 40, "split": {"fraction": 0.01}}
        return PreparedSource(label, 1.0, None, [], val, manifest=m)

    data = RunData(None, {"big": source("big", 500), "small": source("small", 20)})
    assert data.can_evaluate(32)
    text = data.val_warning(32)
    assert text.startswith("data.sources.small holds out 1 of its 40 documents")
    assert "20 tokens: fewer than one window of train.seq_len + 1 = 33" in text
    assert "The validation loss leaves it out" in text and "eval.every=0" not in text
    assert data.val_warning(16) is None


def test_report_on_garbage_metrics_is_an_error_naming_the_line(tmp_path, capsys):
    """Issue 24.10: junk lines and no train record made a report of "step None of ?" and exit 0."""
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text('garbage\n{"x": 1}\n[1, 2]\n{"loss": "abc"}\n')
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run / 'metrics.jsonl'}:1: not JSON ('garbage')")
    assert "and 3 more bad line(s)" in err and "Traceback" not in err
    assert not (run / "report").exists()


def test_report_with_a_few_bad_lines_among_good_ones_names_them(tmp_path, recwarn):
    import json

    run = tmp_path / "r"
    run.mkdir()
    good = [{"kind": "train", "step": s, "tokens": 64 * s, "loss": 5.0 - s / 10} for s in (1, 2, 3)]
    lines = [json.dumps(good[0]), "junk", json.dumps(good[1]), '{"loss": 1}', json.dumps(good[2])]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["report", str(run)]) == 0
    (warning,) = [str(w.message) for w in recwarn if "littlelm records skipped" in str(w.message)]
    assert "2 line(s) that are not JSON objects or littlelm" in warning
    assert warning.endswith("(line 2, 4)")
    text = (run / "report" / "report.md").read_text()
    assert "(line 2, 4)" in text and "step None" not in text and "at step 3" in text


@pytest.mark.parametrize(
    "args, expected",
    [
        (["model.d_model=48"], "model.d_model: 32 -> 48"),
        (["--resume", "never"], "--resume never would mix"),
    ],
    ids=["non-resumable-change", "resume-never"],
)
def test_a_refused_resume_prepares_no_data(tmp_path, corpus, capsys, args, expected):
    """Issue 24.10: a resume that is refused prepared the data (and trained a tokenizer) first."""
    cfg = str(write_config(tmp_path / "t.yaml", tiny_tree(corpus, tmp_path / "runs")))
    assert main(["train", cfg, "train.max_steps=3"]) == 0
    capsys.readouterr()
    cache = tmp_path / "fresh-cache"  # data.cache_dir may change on resume: where prep would go
    assert main(["train", cfg, f"data.cache_dir={cache}", *args]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and expected in err and "Traceback" not in err
    assert not cache.exists() and "preparing" not in out
