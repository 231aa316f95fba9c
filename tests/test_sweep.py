"""littlelm sweep: variants from --set, checks before training, resumable runs, the comparison."""

from __future__ import annotations

import json
import shlex

import pytest

from conftest import tiny_tree, write_config
from littlelm import sweep
from littlelm.cli import main
from littlelm.report.compare import write_sweep_report
from littlelm.sweep import SweepOptions, run_sweep
from littlelm.sweep.runner import Pool
from littlelm.sweep.spec import SweepError, combine, make_variants, parse_budget, parse_set


def test_variants_grid_zip_names_and_seeds():
    sets = [parse_set("model.n_layer=2,3"), parse_set("optimizer.lr_matrix=0.01,0.02")]
    grid = make_variants(sets, zip_=False)
    assert [v.name for v in grid] == [
        "n_layer=2,lr_matrix=0.01",
        "n_layer=2,lr_matrix=0.02",
        "n_layer=3,lr_matrix=0.01",
        "n_layer=3,lr_matrix=0.02",
    ]
    assert grid[1].overrides == ["model.n_layer=2", "optimizer.lr_matrix=0.02"]
    assert [v.name for v in make_variants(sets, zip_=True)] == [
        "n_layer=2,lr_matrix=0.01",
        "n_layer=3,lr_matrix=0.02",
    ]
    seeded = make_variants(sets[:1], zip_=False, seeds=2, base_seed=7)
    assert [v.name for v in seeded][:2] == ["n_layer=2,seed=7", "n_layer=2,seed=8"]
    assert seeded[1].overrides[-1] == "run.seed=8" and seeded[1].group == "n_layer=2"
    same_last = make_variants([parse_set("a.x=1,2"), parse_set("b.x=3")], zip_=False)
    assert same_last[0].name == "a.x=1,b.x=3"  # a shared last part keeps the whole key
    assert parse_set("model.window=[1,2],[3,4]")[1] == [[1, 2], [3, 4]]


@pytest.mark.parametrize(
    "sets,zip_,message",
    [
        ([], False, "the grid is empty"),
        (["model.n_layer="], False, "has no values"),
        (["model.n_layer=2,3", "model.d_model=32"], True, "--zip needs as many values"),
        (["model.n_layer=2", "model.n_layer=3"], False, "given twice"),
        (["run.name=a,b"], False, "names each variant's run itself"),
        (["n_layer"], False, "expected KEY=v1,v2"),
    ],
)
def test_bad_sets_are_clear(sets, zip_, message):
    with pytest.raises(SweepError, match=message):
        make_variants([parse_set(s) for s in sets], zip_)


def test_budget_forms():
    assert parse_budget("90s", None) == {"hours": 0.025}
    assert parse_budget("30m", None) == {"hours": 0.5}
    assert parse_budget("2h", None) == {"hours": 2.0}
    assert parse_budget("$5", 2.5) == {"dollars": 5.0, "price_per_gpu_hour": 2.5}
    assert parse_budget("500M", None) == {"tokens": 500_000_000}
    assert parse_budget("2e9", None) == {"tokens": 2_000_000_000}
    with pytest.raises(SweepError, match="needs a price"):
        parse_budget("$5", None)
    with pytest.raises(SweepError, match="expected a time"):
        parse_budget("soon", None)
    assert combine([("k", [1, 2])], zip_=False) == [{"k": 1}, {"k": 2}]


@pytest.mark.parametrize(
    "args,message",
    [
        ("--set model.n_layers=2,3", "unknown key (did you mean 'n_layer'?)"),
        ("--set model.n_layer=two,3", "variant n_layer=two: model.n_layer"),
        ("--set model.n_layer=", "has no values"),
        ("--set model.n_layer=2 --budget 1e-9s", "less than one step takes"),
        ("--set model.n_layer=2 --budget 10", "less than one step's batch"),
    ],
)
def test_bad_sweeps_fail_before_anything_trains(tiny_config, tmp_path, capsys, args, message):
    rc = main(["sweep", str(tiny_config), *shlex.split(args)])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and message in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # nothing was written, nothing trained


class Done:
    """A finished process, for a launcher that trains in this process."""

    def __init__(self, rc: int):
        self.rc = rc

    def poll(self) -> int:
        return self.rc

    def wait(self) -> int:
        return self.rc


def test_sweep_runs_resumes_and_compares(tiny_config, tmp_path, monkeypatch, capsys):
    launched, fail = [], {"n_layer=2,d_model=32"}

    def fake_launch(cmd, log, device):  # `littlelm train ...` in this process
        name = json.loads(next(c for c in cmd if c.startswith("run.name=")).split("=", 1)[1])
        launched.append(name)
        if name in fail:  # as if the sweep was killed while this variant trained
            return Done(1)
        return Done(main(cmd[3:]))

    monkeypatch.setattr(sweep, "launch", fake_launch)
    opts = SweepOptions(
        str(tiny_config),
        overrides=["train.max_steps=3", "eval.every=0"],
        sets=["model.n_layer=1,2", "model.d_model=32"],
        budget="600",  # tokens: 4 steps of 128, capped at 3 by train.max_steps
        price_per_hour=2.0,
    )
    with pytest.raises(SweepError, match=r"1 variant\(s\) did not finish: n_layer=2,d_model=32"):
        run_sweep(opts)
    assert len(launched) == 2
    launched.clear()
    fail.clear()
    sweep_dir = run_sweep(opts)  # the finished three are skipped
    assert launched == ["n_layer=2,d_model=32"]
    assert "already finished, skipped" in capsys.readouterr().out
    path, table = write_sweep_report(sweep_dir)
    assert table.count("| finished |") == 2 and "n_layer=1,d_model=32" in table
    assert {p.name for p in path.parent.glob("*.png")} == {
        "loss_vs_time.png",
        "loss_vs_tokens.png",
        "loss_vs_dollars.png",
    }
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    assert manifest["variants"][0]["name"] == "n_layer=1,d_model=32"
    with pytest.raises(SweepError, match="holds another sweep"):
        run_sweep(SweepOptions(str(tiny_config), sets=["model.n_layer=1,3"]))


def test_pool_runs_side_by_side_on_free_devices():
    class Job:
        def __init__(self, name):
            self.name, self.log = name, f"{name}.log"

        def done(self):
            return self.name != "bad"

        def summary(self, rc):
            return f"{self.name} {rc}"

    class Proc:
        def __init__(self, ticks):
            self.ticks = ticks

        def poll(self):
            self.ticks -= 1
            return 0 if self.ticks <= 0 else None

    placed = []

    def start(job, device):
        placed.append((job.name, device))
        return Proc(2 if job.name == "a" else 1)

    failed = Pool(["0", "1"], start, say=lambda _: None).run(
        [Job("a"), Job("b"), Job("bad")], poll=0
    )
    assert placed == [("a", "0"), ("b", "1"), ("bad", "1")]  # b's device freed first
    assert failed == ["bad (exit 0; log: bad.log)"]


def test_report_of_a_sweep_dir_through_the_cli(tiny_config, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "sweep.json").write_text(
        json.dumps({"base": "x", "variants": [{"name": "a", "seed": None}]})
    )
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "has logged a step yet" in capsys.readouterr().err


def test_sweep_config_file(tmp_path, corpus):
    write_config(tmp_path / "t.yaml", tiny_tree(corpus, tmp_path / "runs"))
    sweep_dir, jobs = sweep.plan_sweep(
        SweepOptions(str(tmp_path / "t.yaml"), sets=["model.n_layer=1"], budget="30m")
    )
    assert sweep_dir == tmp_path / "runs" / "sweep-t"
    assert 'train.budget={"hours": 0.5}' in jobs[0].command
    assert jobs[0].run_dir == sweep_dir / "n_layer=1"


# Issue 36 (items 5-9): a sweep under careless input


def in_process(monkeypatch, launched=None):
    """Variants train in this process (`littlelm train ...` through main)."""

    def fake_launch(cmd, log, device):
        if launched is not None:
            launched.append(cmd)
        return Done(main(cmd[3:]))

    monkeypatch.setattr(sweep, "launch", fake_launch)


def test_budget_replaces_max_steps_of_the_base(tmp_path, corpus):
    tree = tiny_tree(corpus, tmp_path / "runs")
    del tree["train"]["max_steps"]  # the --budget is what ends each variant
    base = write_config(tmp_path / "t.yaml", tree)
    _, jobs = sweep.plan_sweep(SweepOptions(str(base), sets=["model.n_layer=1,2"], budget="3s"))
    assert [j.run_dir.name for j in jobs] == ["n_layer=1", "n_layer=2"]
    assert jobs[0].shared == [f"train.budget={json.dumps({'hours': 3 * (1 / 3600)})}"]


def test_changed_sweep_is_refused_not_mislabelled(tiny_config, tmp_path, monkeypatch, capsys):
    launched = []
    in_process(monkeypatch, launched)
    opts = SweepOptions(
        str(tiny_config),
        overrides=["train.max_steps=2", "eval.every=0"],
        sets=["model.n_layer=1"],
        budget="256",  # tokens: 2 steps of 128
    )
    sweep_dir = run_sweep(opts)
    manifest = (sweep_dir / "sweep.json").read_text()
    assert len(launched) == 1
    changed = [
        SweepOptions(**{**opts.__dict__, "budget": "384"}),
        SweepOptions(**{**opts.__dict__, "overrides": ["train.max_steps=2", "model.d_model=64"]}),
    ]
    for other, what in zip(changed, ["shared settings", "shared settings"], strict=True):
        with pytest.raises(SweepError, match=f"holds another sweep; it differs in its {what}"):
            run_sweep(other)
        assert len(launched) == 1  # nothing trained, nothing labelled with the new settings
        assert (sweep_dir / "sweep.json").read_text() == manifest
    run_sweep(opts)  # the same arguments resume (here: skip) it
    assert "already finished, skipped" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text,why",
    [
        ('{"base": "x", "variants": [{"name": "n_la', "JSONDecodeError"),
        ("[1, 2]", "expected a JSON object, found list"),
        ('{"base": "x", "variants": ["a"]}', "a variant without a name"),
        ('{"base": "x", "variants": [{"name": "a"}]}', "has no 'overrides' list"),
        ('{"variants": []}', "no 'base' config path"),
    ],
)
def test_edited_or_truncated_manifest_is_a_clear_error(tiny_config, tmp_path, capsys, text, why):
    sweep_dir = tmp_path / "runs" / "sweep-tiny"
    sweep_dir.mkdir(parents=True)
    (sweep_dir / "sweep.json").write_text(text)
    rc = main(["sweep", str(tiny_config), "--set", "model.n_layer=1"])
    err = capsys.readouterr().err
    assert rc == 2 and "is not a sweep manifest" in err and why in err, err
    assert "Traceback" not in err
    assert (sweep_dir / "sweep.json").read_text() == text  # left as it was
    assert sorted(p.name for p in sweep_dir.iterdir()) == [".sweep.lock", "sweep.json"]


def test_variant_killed_before_its_end_record_completes(tiny_config, monkeypatch, capsys):
    in_process(monkeypatch)
    opts = SweepOptions(
        str(tiny_config), overrides=["train.max_steps=2", "eval.every=0"], sets=["model.n_layer=1"]
    )
    sweep_dir = run_sweep(opts)
    metrics = sweep_dir / "n_layer=1" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    end = json.loads(lines[-1])
    assert end["kind"] == "end"
    metrics.write_text("\n".join(lines[:-1]) + "\n")  # SIGKILL after the final save
    run_sweep(opts)  # completes: train appends the end record, the sweep sees it finished
    out = capsys.readouterr().out
    assert "variant n_layer=1: finished" in out
    again = json.loads(metrics.read_text().splitlines()[-1])
    assert again["kind"] == "end" and again["completed_on_resume"]
    assert (again["step"], again["tokens"]) == (end["step"], end["tokens"])
    run_sweep(opts)
    assert "already finished, skipped" in capsys.readouterr().out


def test_long_variant_names_are_shortened_and_unique(tmp_path, corpus, monkeypatch):
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    paths = [deep / f"{c * 120}.txt" for c in "ab"]
    for p in paths:
        p.write_text(corpus.read_text())
    base = write_config(tmp_path / "t.yaml", tiny_tree(corpus, tmp_path / "runs"))
    opts = SweepOptions(
        str(base),
        overrides=["train.max_steps=1", "eval.every=0"],
        sets=[f"data.sources.text.path={paths[0]},{paths[1]}"],
        seeds=2,
    )
    sweep_dir, jobs = sweep.plan_sweep(opts)
    names = [j.name for j in jobs]
    assert len(set(names)) == 4 and all(len(n.encode()) <= 200 for n in names)
    assert names[0].endswith(",seed=0") and "~" in names[0]
    assert jobs[0].variant.group == jobs[1].variant.group != jobs[2].variant.group
    in_process(monkeypatch)
    run_sweep(SweepOptions(**{**opts.__dict__, "seeds": 1}))  # trains: no File name too long
    assert len(list(sweep_dir.glob("*/metrics.jsonl"))) == 2


@pytest.mark.parametrize(
    "args,message",
    [
        ("--name ../escape", "--name '../escape': the sweep's directory is run.out_dir/NAME"),
        ("--name /tmp/abs", "must be one directory name"),
        (f"--name {'n' * 300}", "at most 200 bytes"),
        ("--devices abc", "--devices 'abc': expected GPU indices"),
        ("--devices 0,0", "--devices names GPU 0 twice"),
        ("--devices 0,", "expected GPU indices"),
    ],
)
def test_sweep_names_and_devices_are_checked(tiny_config, tmp_path, capsys, args, message):
    rc = main(["sweep", str(tiny_config), "--set", "model.n_layer=1", *shlex.split(args)])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "tiny.yaml"]


def test_a_base_that_includes_a_packaged_config_plans(tmp_path):
    # read_base read the file without packaged includes: "include: file not found: .../demo"
    # where `littlelm train BASE.yaml` trains it
    base = write_config(
        tmp_path / "b.yaml",
        {
            "include": ["demo"],
            "run": {"out_dir": str(tmp_path / "runs")},
            "train": {"max_steps": 2},
        },
    )
    sweep_dir, jobs = sweep.plan_sweep(
        SweepOptions(str(base), sets=["model.n_layer=1,2"], budget="30m")
    )
    assert [j.run_dir.name for j in jobs] == ["n_layer=1", "n_layer=2"]
    assert sweep_dir == tmp_path / "runs" / "sweep-b"


@pytest.mark.slow  # three processes start
def test_a_second_identical_sweep_is_refused_at_once_and_the_first_is_untouched(tiny_config):
    """Two `littlelm sweep` processes with the same arguments in one directory: the second
    exits 2 at once, naming the first's pid, starts nothing and writes nothing into the
    first's logs; the first trains on. (Both ran the same variants, appended to one log and
    reported them failed.)"""
    import os
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-m", "littlelm", "sweep", str(tiny_config)]
    cmd += ["--set", "model.n_layer=1", "train.max_steps=100000000", "eval.every=0"]
    cmd += ["checkpoint.every=0", "train.log_every=1000"]  # trains until it is stopped
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        sweep_dir = tiny_config.parent / "runs" / "sweep-tiny"
        log = sweep_dir / "logs" / "n_layer=1.log"
        while not log.is_file():  # the first holds the lock and has started its variant
            assert first.poll() is None, first.stdout.read().decode()
            time.sleep(0.1)
        manifest = (sweep_dir / "sweep.json").read_bytes()
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"in use by another `littlelm sweep` (pid {first.pid})" in second.stderr
        assert "nothing was started" in second.stderr and "Traceback" not in second.stderr
        assert "training" not in second.stdout  # it launched no variant
        assert first.poll() is None  # the first trains on
        assert (sweep_dir / "sweep.json").read_bytes() == manifest
        assert "in use by another" not in log.read_text()
    finally:
        first.send_signal(signal.SIGTERM)  # the sweep forwards it: the variant saves and stops
        out = first.communicate(timeout=120)[0].decode()
    assert "stopped by SIGTERM" in out and out.count("variant n_layer=1: training") == 1
