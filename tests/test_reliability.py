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
