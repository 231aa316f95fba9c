"""`littlelm eval`, `littlelm eval-bundle` and the `core` training callback, end to end."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest
import yaml

import littlelm.model.generate as generate
from conftest import make_corpus, tiny_tree, write_config
from littlelm.cli import main
from littlelm.errors import EvalError
from littlelm.eval.bundle import download_bundle
from littlelm.load import load_model
from littlelm.progress import Progress
from littlelm.schema import load_run
from littlelm.train.trainer import Trainer


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A tiny byte-level run (32-token context) trained for 3 steps."""
    tmp = tmp_path_factory.mktemp("trained")
    tree = tiny_tree(make_corpus(tmp / "corpus.txt"), tmp / "runs", train={"max_steps": 3})
    tree["eval"]["every"] = 0
    Trainer(load_run(write_config(tmp / "run.yaml", tree)), progress=Progress(io.StringIO())).fit()
    return tmp / "runs" / "tiny"


def test_eval_prints_table_warns_and_writes_decisions(trained_run, task_dir, tmp_path, capsys):
    out = tmp_path / "res.json"
    code = main(
        [
            *("eval", str(trained_run), "--bundle", str(task_dir), "--max-per-task", "5"),
            *("--out", str(out), "--precision", "fp32"),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    for label in ("mc_words", "schema_subjects", "lm_sums"):
        assert label in captured.out
    assert "mean centered" in captured.out and "CORE needs all 22" in captured.out
    # a 32-token model cannot hold these prompts: the report says so, per task
    assert (
        "warning: mc_words: 100.0% of prompts exceed the model's 32-token context" in captured.err
    )
    doc = json.loads(out.read_text())
    assert [len(t["decisions"]) for t in doc["tasks"]] == [5, 5, 5]
    assert doc["tasks"][0]["truncation"]["share"] == 1.0 and doc["core"] is None


def test_eval_subset_and_drop_shots(trained_run, task_dir, capsys):
    code = main(
        [
            *("eval", str(trained_run), "--bundle", str(task_dir), "--tasks", "lm_sums"),
            *("--max-per-task", "3", "--truncation", "drop_shots"),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0 and "lm_sums" in captured.out and "mc_words" not in captured.out
    assert "lost" in captured.out  # whole examples were dropped to fit


@pytest.mark.parametrize(
    "edit, args, expected",
    [
        (None, ["--tasks", "mc_word"], "did you mean 'mc_words'"),
        (None, ["--bundle", "/nonexistent/dir"], "eval directory not found"),
        ("mc.jsonl", [], "mc.jsonl:2: not valid JSON"),
        ("empty", [], "no items (the file is empty)"),
        (None, ["--include", "my_tasks"], "--include applies only with --harness TASKS"),
        (None, ["--num-fewshot", "0"], "for your own tasks.yaml and JSONL files use --bundle DIR"),
    ],
    ids=["unknown-task", "missing-bundle", "malformed-line", "empty-file", "include", "fewshot"],
)
def test_eval_user_errors(trained_run, task_dir, capsys, edit, args, expected):
    if edit == "mc.jsonl":
        lines = (task_dir / "mc.jsonl").read_text().splitlines()
        lines[1] = lines[1][:-5]
        (task_dir / "mc.jsonl").write_text("\n".join(lines) + "\n")
    elif edit == "empty":
        (task_dir / "schema.jsonl").write_text("")
    bundle = [] if "--bundle" in args else ["--bundle", str(task_dir)]
    code = main(["eval", str(trained_run), *bundle, *args])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and expected in err and "Traceback" not in err


def test_max_per_task_below_num_fewshot_is_fine(trained_run, task_dir, capsys):
    """Examples come from the whole file, so 1 item with 4-shot prompts works."""
    code = main(["eval", str(trained_run), "--bundle", str(task_dir), "--max-per-task", "1"])
    assert code == 0 and "lm_sums" in capsys.readouterr().out


def test_core_callback_records_and_prints_table(tmp_path, corpus, task_dir):
    tree = tiny_tree(
        corpus,
        tmp_path / "runs",
        eval={"every": 0},
        checkpoint={"every": 0},
    )
    tree["callbacks"] = [
        {"name": "core", "every": 3, "bundle": str(task_dir), "max_per_task": 4},
        {
            "name": "core",
            "bundle": str(task_dir),
            "tasks": ["schema_subjects"],
            "max_per_task": 2,
            "truncation": "drop_shots",
        },
    ]
    log = io.StringIO()
    Trainer(load_run(write_config(tmp_path / "run.yaml", tree)), progress=Progress(log)).fit()
    records = [json.loads(line) for line in (tmp_path / "runs/tiny/metrics.jsonl").open()]
    icl = [r for r in records if r["kind"] == "icl"]
    assert [r["step"] for r in icl] == [3, 6, 6]
    assert set(icl[0]) >= {"mean_centered", "task_acc", "task_centered", "task_truncated_share"}
    assert set(icl[0]["task_acc"]) == {"mc_words", "schema_subjects", "lm_sums"}
    assert icl[0]["task_truncated_share"]["mc_words"] == 1.0 and icl[0]["core"] is None
    assert list(icl[2]["task_acc"]) == ["schema_subjects"]
    text = log.getvalue()
    assert "in-context evaluation at step 6" in text and "lm_sums" in text


def test_core_callback_with_a_wrong_bundle_fails_before_training(tmp_path, corpus):
    tree = tiny_tree(corpus, tmp_path / "runs")
    tree["callbacks"] = [{"name": "core", "bundle": str(tmp_path / "nope")}]
    trainer = Trainer(
        load_run(write_config(tmp_path / "run.yaml", tree)), progress=Progress(io.StringIO())
    )
    with pytest.raises(EvalError, match="eval directory not found"):
        trainer.fit()
    assert trainer.step == 0


def make_zip(path, files: dict[str, str]) -> str:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_bundle_download_checks_sha_and_unpacks(tmp_path, task_dir):
    archive = tmp_path / "eval_bundle.zip"
    files = {"eval_bundle/core.yaml": "icl_tasks: []\n"}
    files.update(
        {f"eval_bundle/eval_data/{p.name}": p.read_text() for p in task_dir.glob("*.jsonl")}
    )
    sha = make_zip(archive, files)
    dest = tmp_path / "cache" / "eval_bundle"
    with pytest.raises(EvalError, match="does not match the expected"):
        download_bundle(dest, archive.as_uri(), "0" * 64, log=lambda m: None)
    assert not dest.exists() and list(dest.parent.iterdir()) == []  # nothing half-written
    assert download_bundle(dest, archive.as_uri(), sha, log=lambda m: None) == dest
    assert (dest / "eval_data" / "mc.jsonl").read_text() == (task_dir / "mc.jsonl").read_text()
    from littlelm.eval.tasks import CORE_TASKS, resolve_bundle

    assert resolve_bundle(dest) == (CORE_TASKS, dest / "eval_data")


def test_bundle_download_failures_are_named(tmp_path):
    bad = tmp_path / "bad.zip"
    bad.write_text("not a zip")
    with pytest.raises(EvalError, match="not a valid zip"):
        download_bundle(tmp_path / "a", bad.as_uri(), None, log=lambda m: None)
    evil = tmp_path / "evil.zip"
    make_zip(evil, {"../escape.txt": "x"})
    with pytest.raises(EvalError, match="outside the bundle"):
        download_bundle(tmp_path / "b", evil.as_uri(), None, log=lambda m: None)
    assert not (tmp_path / "escape.txt").exists()
    with pytest.raises(EvalError, match="could not download"):
        download_bundle(
            tmp_path / "c", (tmp_path / "missing.zip").as_uri(), None, log=lambda m: None
        )


def test_eval_bundle_cli_keeps_an_existing_bundle(tmp_path, capsys):
    dest = tmp_path / "eb"
    dest.mkdir()
    assert main(["eval-bundle", "--dest", str(dest), "--url", "file:///nonexistent.zip"]) == 0
    assert "already exists" in capsys.readouterr().out
    code = main(["eval-bundle", "--dest", str(dest), "--url", "file:///nonexistent.zip", "--force"])
    assert code == 2 and "could not download" in capsys.readouterr().err and dest.is_dir()


def test_sample_warns_when_the_prompt_does_not_fit(trained_run, capsys):
    code = main(["sample", str(trained_run), "--prompt", "the " * 20, "--max-tokens", "5"])
    captured = capsys.readouterr()
    assert code == 0 and "does not fit the 32-token context" in captured.err
    assert main(["sample", str(trained_run), "--top-k", "-1"]) == 2


def test_packaged_core_list_loads_from_yaml():
    from littlelm.eval.tasks import CORE_TASKS

    assert len(yaml.safe_load(CORE_TASKS.read_text())["tasks"]) == 22


def test_icl_records_reach_the_tensorboard_logger(tmp_path, task_dir):
    """The loggers get the icl numbers as eval/<field> (a stand-in writer; no tensorboard here)."""
    from littlelm.eval.callback import publish
    from littlelm.train.loggers import TensorBoardLogger, scalars

    class Writer:
        def __init__(self):
            self.seen = {}

        def add_scalar(self, tag, value, step):
            self.seen[tag] = (value, step)

        def flush(self):
            pass

    tb = TensorBoardLogger.__new__(TensorBoardLogger)
    tb.writer = Writer()

    from types import SimpleNamespace

    record = {"kind": "icl", "step": 7, "mean_centered": 0.1, "task_acc": {"mc_words": 0.5}}
    publish(SimpleNamespace(step=7, callbacks=[tb], is_main=False), record)
    assert tb.writer.seen == {}  # under torchrun only rank 0 writes
    publish(SimpleNamespace(step=7, callbacks=[tb], is_main=True), record)
    assert tb.writer.seen == {"eval/mean_centered": (0.1, 7), "eval/task_acc.mc_words": (0.5, 7)}
    assert scalars({"task_acc": {"a": 1.0}}, "eval") == {"eval/task_acc.a": 1.0}


@pytest.mark.parametrize("bundle", [["--bundle", "/nonexistent/dir"], []])
def test_eval_on_a_missing_checkpoint_names_the_checkpoint_first(tmp_path, capsys, bundle):
    """Issue 24.10: a wrong checkpoint path was reported as a missing eval bundle."""
    code = main(["eval", str(tmp_path / "no-such-run"), *bundle])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and "no-such-run" in err, err
    assert "bundle" not in err and "eval directory" not in err and "Traceback" not in err


def test_sample_reads_special_token_text_in_its_prompt_as_text(monkeypatch, capsys):
    """`sample --prompt` quoting chat tokens gives the model text, not control tokens (an SFT
    checkpoint whose tokenizer has them: the old-runs fixture's, read in place)."""
    step = Path(__file__).parent / "fixtures/old_runs/runs/sft/checkpoints/step_000006"
    _, tok, _ = load_model(step, "cpu")
    specials = {tok.special_id(t) for t in ("<|bos|>", "<|user|>", "<|end|>", "<|assistant|>")}
    assert None not in specials
    prompts, real = [], generate.generate
    monkeypatch.setattr(
        generate,
        "generate",
        lambda model, ids, *a, **k: prompts.append(ids) or real(model, ids, *a, **k),
    )
    prompt = "<|user|>hi<|end|><|assistant|>"
    assert main(["sample", str(step), "--prompt", prompt, "--max-tokens", "2"]) == 0
    assert capsys.readouterr().out.startswith(prompt)
    assert prompts == [[tok.bos_id, *tok.encode(prompt)]]
    assert not specials & set(prompts[0][1:])
