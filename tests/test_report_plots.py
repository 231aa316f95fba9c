"""Report plots a new user reads: lone points, a grown run beside its parent, a single source's
mix; and the session count when a logger failed to start."""

from __future__ import annotations

import json

from test_report import check_markdown, synthetic_run

from littlelm.report import write_report
from littlelm.report.figures import render_figures
from littlelm.report.runs import load_run_dir


def _records(path, records):
    with open(path / "metrics.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def _lines(figs, key):
    return [ln for f in figs if f.key == key for ax in f.figure.axes for ln in ax.get_lines()]


def test_a_series_of_one_point_draws_the_point(tmp_path):
    run_dir = tmp_path / "one"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("run: {name: one}\n")
    _records(
        run_dir,
        [
            {"kind": "start", "step": 0, "tokens": 0, "time": 1.0},
            {"kind": "train", "step": 10, "tokens": 1000, "loss": 3.0, "grad_norm": 0.5},
        ],
    )
    figs = render_figures([load_run_dir(run_dir)], tmp_path / "figs")
    for key in ("loss", "grad_norm"):
        (line,) = _lines(figs, key)
        assert len(line.get_xdata()) == 1 and line.get_marker() == "o", key
    # a longer series keeps its plain line, except a point isolated between gaps
    figs = render_figures([load_run_dir(synthetic_run(tmp_path / "a", "a"))], tmp_path / "f2")
    train = next(ln for ln in _lines(figs, "loss") if ln.get_label() == "train loss")
    assert train.get_marker() in ("None", None, "")


def _grown(tmp_path, parent_tokens=4000, parent_step=40):
    run_dir = synthetic_run(tmp_path / "b", "b", loss_scale=0.8)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    start = json.loads(lines[0])
    start["grown_from"] = {"checkpoint": "runs/a/step_40", "step": parent_step}
    start["grown_from"]["tokens"] = parent_tokens
    (run_dir / "metrics.jsonl").write_text("\n".join([json.dumps(start), *lines[1:]]) + "\n")
    return run_dir


def test_grown_run_continues_its_parents_token_axis(tmp_path):
    a = synthetic_run(tmp_path / "a", "a")
    b = _grown(tmp_path)
    figs = render_figures([load_run_dir(a), load_run_dir(b)], tmp_path / "figs")
    by_label = {ln.get_label(): ln for ln in _lines(figs, "loss")}
    # tokens in thousands: the parent ends at 4.0, the grown run starts after it
    assert by_label["a train loss"].get_xdata()[-1] == 4.0
    assert by_label["b train loss"].get_xdata()[0] == 4.1
    assert min(by_label["b validation loss"].get_xdata()) == 6.0
    lr = [ln for ln in _lines(figs, "lr") if ln.get_label().startswith("b")]
    assert lr and all(min(ln.get_xdata()) > 4.0 for ln in lr)
    path = write_report([a, b], tmp_path / "rep")
    text, _ = check_markdown(path)
    assert "grown from runs/a/step_40: its curves continue the parent's, from 4,000" in text
    # alone, a grown run is drawn from its own start
    figs = render_figures([load_run_dir(b)], tmp_path / "alone")
    alone = next(ln for ln in _lines(figs, "loss") if ln.get_label() == "train loss")
    assert alone.get_xdata()[0] == 0.1


def test_lineage_start_adds_up_grown_parents(tmp_path):
    from littlelm.train.growth import lineage_start

    grand, parent = tmp_path / "grand", tmp_path / "parent"
    grand.mkdir()
    parent.mkdir()
    (grand / "state.json").write_text(json.dumps({"step": 4, "tokens": 2048}))
    state = {"step": 10, "tokens": 5120, "config": {"grow": {"parent": str(grand)}}}
    (parent / "state.json").write_text(json.dumps(state))
    assert lineage_start(parent) == {"checkpoint": str(parent), "step": 14, "tokens": 7168}
    assert lineage_start(tmp_path / "gone") is None


def test_single_source_mix_is_left_out(tmp_path):
    one = synthetic_run(tmp_path / "one", "one", extra=False)
    _records(one, [{"kind": "train", "step": 41, "tokens": 4100, "loss": 1.0, "mix": {"web": 1.0}}])
    two = synthetic_run(tmp_path / "two", "two", extra=False)
    _records(
        two,
        [{"kind": "train", "step": 41, "tokens": 4100, "loss": 1.0, "mix": {"a": 0.5, "b": 0.5}}],
    )
    labels = {
        ln.get_label()
        for f in render_figures([load_run_dir(one)], tmp_path / "f1")
        for ax in f.figure.axes
        for ln in ax.get_lines()
    }
    assert not any("mix" in label for label in labels)
    figs = render_figures([load_run_dir(two)], tmp_path / "f2")
    assert {"mix.a", "mix.b"} <= {ln.get_label() for ln in _lines(figs, "data")}
