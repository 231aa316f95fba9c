"""Named validation sets (eval.sets): each logged as its own series, and plotted by the report."""

from __future__ import annotations

import json

import pytest

from conftest import make_corpus, tiny_tree, write_config
from littlelm.errors import ConfigError
from littlelm.report import write_report
from littlelm.report.figures import render_figures
from littlelm.report.runs import load_run_dir
from littlelm.schema import load_run
from littlelm.train.trainer import Trainer


def two_source_tree(tmp_path, **eval_section):
    tree = tiny_tree(make_corpus(tmp_path / "a.txt"), tmp_path / "runs", eval=eval_section)
    b = tmp_path / "b.txt"  # another distribution: the same words shouted, other documents
    b.write_text(make_corpus(tmp_path / "b0.txt", docs=80, seed=3).read_text().upper())
    tree["data"]["sources"] = {
        "a": {"name": "text", "path": str(tmp_path / "a.txt"), "split": "paragraph"},
        "b": {"name": "text", "path": str(b), "split": "paragraph", "weight": 3.0},
    }
    return tree


def evals(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "eval"]


def test_two_named_sets_are_logged_and_plotted(tmp_path):
    tree = two_source_tree(tmp_path, sets={"old": ["a"], "new": "b"}, max_tokens=4096)
    cfg = load_run(write_config(tmp_path / "run.yaml", tree))
    assert cfg.eval.sets == {"old": ["a"], "new": ["b"]}  # one label alone is a list of one
    Trainer(cfg, resume="never").fit()
    records = evals(cfg.run_dir())
    assert [r["step"] for r in records] == [3, 6]
    for r in records:
        sets = r["val_sets"]
        assert set(sets) == {"old", "new"}
        old, new = sets["old"], sets["new"]
        assert old["tokens"] > 0 and new["tokens"] > 0
        assert old["tokens"] + new["tokens"] == r["val_tokens"]  # the sets split the whole
        whole = (old["loss"] * old["tokens"] + new["loss"] * new["tokens"]) / r["val_tokens"]
        assert whole == pytest.approx(r["val_loss"], rel=1e-9)  # val_loss is still the whole
        assert abs(old["loss"] - new["loss"]) > 1e-3  # two different distributions
    # the report draws each set as its own line on the validation panels
    figs = {f.key: f.figure for f in render_figures([load_run_dir(cfg.run_dir())], tmp_path)}
    loss_lines = {ln.get_label() for ax in figs["loss"].axes for ln in ax.get_lines()}
    assert {"validation loss, old", "validation loss, new", "validation loss"} <= loss_lines
    bpb_lines = {ln.get_label() for ax in figs["bpb"].axes for ln in ax.get_lines()}
    assert {"validation bits per byte, old", "validation bits per byte, new"} <= bpb_lines
    text = write_report([cfg.run_dir()], out=tmp_path / "report").read_text()
    assert "val_sets.old.loss (nats/token)" in text and "val_sets.new.bpb (bits/byte)" in text
    assert "val_sets.old.tokens" not in text  # a count, not a metric


def test_without_sets_the_record_is_unchanged(tmp_path):
    cfg = load_run(write_config(tmp_path / "run.yaml", two_source_tree(tmp_path)))
    Trainer(cfg, resume="never").fit()
    for r in evals(cfg.run_dir()):
        assert "val_sets" not in r and {"val_loss", "val_bpb", "val_tokens"} <= set(r)


@pytest.mark.parametrize(
    "sets, message",
    [
        ({"old": ["a", "c"]}, "eval.sets.old: no data source 'c'; sources: a, b"),
        ({"old.x": ["a"]}, "set name 'old.x': use letters, digits"),
        ({"old": []}, "set 'old' lists no data source"),
    ],
)
def test_bad_sets_are_refused_with_the_fix(tmp_path, sets, message):
    path = write_config(tmp_path / "run.yaml", two_source_tree(tmp_path, sets=sets))
    with pytest.raises(ConfigError) as info:
        load_run(path)
    assert message in str(info.value)
