from __future__ import annotations

import json
import os
import re

import pytest
import yaml
from markdown_it import MarkdownIt
from PIL import Image

from conftest import tiny_tree, write_config
from littlelm.cli import main
from littlelm.report import write_report
from littlelm.report.figures import render_figures
from littlelm.report.runs import ReportError, load_run_dir
from littlelm.report.summary import facts
from littlelm.schema import load_run
from littlelm.train.trainer import Trainer

UNIT = re.compile(r"\(.+\)$")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A real 6-step run (trained once for this module), with eval, checkpoints and a sample."""
    from conftest import make_corpus

    tmp = tmp_path_factory.mktemp("report")
    tree = tiny_tree(
        make_corpus(tmp / "corpus.txt"),
        tmp / "runs",
        data={"cache_dir": str(tmp / "cache")},
    )
    tree["callbacks"] = [{"name": "sample", "max_tokens": 8}]
    cfg = load_run(write_config(tmp / "tiny.yaml", tree))
    Trainer(cfg, resume="never").fit()
    return cfg.run_dir()


def check_markdown(path):
    """The report parses as Markdown; every image it shows exists and is a readable PNG;
    every table row has as many cells as its header."""
    text = path.read_text()
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    images = [
        child.attrs["src"]
        for t in tokens
        if t.type == "inline"
        for child in t.children or []
        if child.type == "image"
    ]
    assert images, "the report shows no plots"
    for src in images:
        check_png(path.parent / src)
    cells, header = 0, None
    for t in tokens:
        if t.type == "tr_open":
            cells = 0
        elif t.type in ("th_open", "td_open"):
            cells += 1
        elif t.type == "tr_close":
            header = cells if header is None else header
            assert cells == header
        elif t.type == "table_close":
            header = None
    assert text.count("```") % 2 == 0
    return text, images


def check_png(path):
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        assert im.format == "PNG" and im.width >= 600 and im.height >= 300


def check_axes(fig_files):
    """Every visible axis is labelled with a unit: '... (unit)'."""
    for f in fig_files:
        axes = [ax for ax in f.figure.axes if ax.get_visible()]
        assert axes, f.key
        for ax in axes:
            assert UNIT.search(ax.get_ylabel()), (f.key, ax.get_ylabel())
        assert any(UNIT.search(ax.get_xlabel()) for ax in axes), f.key


def test_report_of_a_tiny_run(tiny_run, tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["report", str(tiny_run), "--out", str(out), "--price-per-hour", "3"]) == 0
    assert "report.md" in capsys.readouterr().out
    text, images = check_markdown(out / "report.md")
    assert {"loss.png", "bpb.png", "lr.png", "throughput.png", "grad_norm.png"} <= set(images)
    for heading in ("## Summary", "## Model", "## Plots", "## Evaluations", "## Configuration"):
        assert heading in text
    assert "| status | finished |" in text
    assert "cost at $3/hour" in text and "per billion tokens" in text
    assert "1 session(s)" in text  # wall time from the start record and record times
    assert "## Last sample" in text
    run = load_run_dir(tiny_run)
    params = run.last("start")["params"]
    assert f"{params['total']:,}" in text
    assert yaml.safe_load((tiny_run / "config.yaml").read_text())["run"]["name"] == "tiny"


def test_default_out_is_inside_the_run(tiny_run):
    path = write_report([tiny_run])
    assert path == tiny_run / "report" / "report.md" and path.is_file()


def test_every_axis_has_a_unit(tiny_run, tmp_path):
    figs = render_figures([load_run_dir(tiny_run)], tmp_path)
    # the data panel: the trainer logs the realised mixture and the packer's crop rate
    assert [f.key for f in figs] == ["loss", "bpb", "lr", "throughput", "grad_norm", "data"]
    check_axes(figs)


def synthetic_run(path, name, loss_scale=1.0, extra=True):
    """A run directory written by hand: fields the trainer may add later, broken lines,
    non-finite values, a repeated evaluation and a record kind nobody planned for."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(
        yaml.safe_dump({"run": {"name": name}, "train": {"batch_tokens": 100, "max_steps": 40}})
    )
    lines = [json.dumps({"kind": "start", "step": 0, "tokens": 0, "time": 1000.0})]
    for step in range(1, 41):
        rec = {"kind": "train", "step": step, "tokens": 100 * step, "time": 1000.0 + step}
        rec.update(loss=loss_scale * (5 - step / 10), lr_mult=1.0, tok_per_s=50.0, train_time=step)
        if extra:
            rec.update(
                grad_norm=1 / step,
                peak_mem_gib=1.5,
                reserved_mem_gib=2.0,
                crop_rate=0.1,
                mixture={"web": 0.7, "code": 0.3},
                mystery=step % 3,
            )
        if step == 7:
            rec["loss"] = None  # a NaN loss, as JSONLLogger stores it
        lines.append(json.dumps(rec))
        if step % 20 == 0:
            ev = {"kind": "eval", "step": step, "tokens": 100 * step, "val_loss": 4.0 - step / 40}
            ev.update(val_bpb=1.5, eval_time=2.0, time=1000.5 + step)
            if extra:
                ev["core"] = 0.1 * step / 20
            lines.append(json.dumps(ev))
    lines.append(lines[-1])  # the last evaluation written twice (a finished run started again)
    lines.append('{"kind": "train", "step": 41, "loss"')  # cut short by a crash
    if extra:
        lines.append(json.dumps({"kind": "probe", "step": 40, "tokens": 4000, "acc_at_1": 0.5}))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


def test_report_is_robust_to_extra_and_missing_fields(tmp_path):
    run_dir = synthetic_run(tmp_path / "a", "a")
    run = load_run_dir(run_dir)
    assert [e["step"] for e in run.records["eval"]] == [20, 40]
    assert any("1 line(s) that are not JSON" in n for n in run.notes)
    figs = render_figures([run], tmp_path / "figs")
    keys = [f.key for f in figs]
    assert keys == [
        "loss",
        "bpb",
        "lr",
        "throughput",
        "grad_norm",
        "memory",
        "data",
        "evals",
        "other",
        "probe",
    ]
    check_axes(figs)
    by_key = {f.key: f.figure for f in figs}
    memory = by_key["memory"].axes[0]
    assert memory.get_ylabel() == "memory (GiB)"
    assert {ln.get_label() for ln in memory.get_lines()} == {"peak_mem_gib", "reserved_mem_gib"}
    labels = {ln.get_label() for ax in by_key["data"].axes for ln in ax.get_lines()}
    assert {"mixture.web", "mixture.code"} <= labels
    assert "(unit not recorded)" in by_key["other"].axes[0].get_ylabel()  # 'mystery' says so
    notes = [t.get_text() for t in by_key["loss"].axes[0].texts]
    assert any("non-finite at 1 logged step" in n for n in notes)
    path = write_report([run_dir], tmp_path / "rep", price_per_hour=1.0)
    text, _ = check_markdown(path)
    assert "core (centered accuracy)" in text  # the eval table has the new score, with its unit
    assert "40 s" in text  # wall time from the record times: 1 session, 40 seconds


def test_rollbacks_to_one_checkpoint_are_each_shown_once(tmp_path):
    """Two rollbacks to step 20 (from steps 26 and 31) are two events; the first written twice
    (a crash after it, replayed on resume) is one."""
    run_dir = synthetic_run(tmp_path / "a", "a")
    first = {"kind": "rollback", "step": 20, "tokens": 2000, "failed_at": 26, "rollbacks": 1}
    second = {**first, "failed_at": 31, "rollbacks": 2}
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in (first, first, second))
    run = load_run_dir(run_dir)
    assert [r["failed_at"] for r in run.records["rollback"]] == [26, 31]
    figs = {f.key: f.figure for f in render_figures([run], tmp_path / "figs")}
    (line,) = figs["guard"].axes[0].get_lines()
    assert list(line.get_ydata()) == [26, 31]


def test_old_runs_without_new_fields(tmp_path):
    run_dir = synthetic_run(tmp_path / "old", "old", extra=False)
    path = write_report([run_dir], tmp_path / "rep")
    text, images = check_markdown(path)
    assert "not logged by this run: MFU, gradient norm" in text
    assert "grad_norm.png" not in images and "pass --price-per-hour" in text


def test_comparison_puts_runs_on_the_same_plots(tmp_path):
    a = synthetic_run(tmp_path / "a", "a")
    b = synthetic_run(tmp_path / "b", "b", loss_scale=0.9)
    cfg = yaml.safe_load((b / "config.yaml").read_text())
    cfg["train"]["max_steps"] = 50
    (b / "config.yaml").write_text(yaml.safe_dump(cfg))
    figs = render_figures([load_run_dir(a), load_run_dir(b)], tmp_path)
    loss = figs[0].figure.axes[0]
    assert {ln.get_label() for ln in loss.get_lines()} == {
        "a train loss",
        "a validation loss",
        "b train loss",
        "b validation loss",
    }
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["report", str(a), str(b)]) == 0
    finally:
        os.chdir(cwd)
    text, _ = check_markdown(tmp_path / "report-a-vs-b" / "report.md")
    assert "# Run comparison: a, b" in text
    assert "| `train.max_steps` | 40 | 50 |" in text


def test_wall_time_sums_sessions(tmp_path):
    run = load_run_dir(synthetic_run(tmp_path / "a", "a"))
    # a second session, resumed at step 20 an hour later, ran 15 more seconds
    run.records["start"].append({"kind": "start", "step": 20, "time": 5000.0})
    run.records["train"].append({"kind": "train", "step": 41, "tokens": 4100, "time": 5015.0})
    f = facts(run, price_per_hour=36.0)
    assert f.wall_time == pytest.approx(40.5 + 15.0)
    assert f.cost == pytest.approx(36.0 * 55.5 / 3600)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "nope", "run directory not found"),
        (lambda p: p, "has no metrics.jsonl"),
    ],
)
def test_report_errors(tmp_path, capsys, make, message):
    assert main(["report", str(make(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_report_refuses_empty_metrics(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"kind": "start", "step": 0}\n')
    with pytest.raises(ReportError, match="no train or eval records"):
        load_run_dir(tmp_path)


def test_unwritable_output_names_the_fix(tmp_path):
    run_dir = synthetic_run(tmp_path / "a", "a")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ReportError, match="pass --out DIR"):
        write_report([run_dir], blocker / "sub")
