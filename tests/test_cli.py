from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from littlelm.cli import main


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "littlelm", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_config_show_prints_resolved(tiny_config, capsys):
    assert main(["config", "show", str(tiny_config), "train.max_steps=9"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["train"]["max_steps"] == 9 and shown["model"]["vocab_size"] == 257


def test_config_show_flat(tiny_config, capsys):
    assert main(["config", "show", str(tiny_config), "--flat"]) == 0
    assert "model.n_layer: 2" in capsys.readouterr().out


def test_list_prints_every_registry(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in (
        "models:",
        "gpt",
        "optimizers:",
        "muon",
        "schedules:",
        "trapezoidal",
        "tokenizers:",
        "bpe",
        "datasets:",
        "python_stdlib",
        "callbacks:",
        "sample",
    ):
        assert word in out


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda t: "model:\n  n_layer: 2\n   bad: 3\n", "malformed YAML"),
        (lambda t: {**t, "modle": {}}, "modle ("),
        (lambda t: {**t, "train": {**t["train"], "max_steps": "ten"}}, "train.max_steps"),
        (lambda t: {**t, "schedule": {"name": "cosin"}}, "did you mean 'cosine'"),
        (
            lambda t: {
                **t,
                "data": {
                    **t["data"],
                    "sources": {"x": {"name": "text", "path": "/nonexistent/x.txt"}},
                },
            },
            "data.sources.x.path",
        ),
    ],
    ids=["malformed-yaml", "unknown-key", "wrong-type", "unknown-component", "missing-data-path"],
)
def test_user_errors_exit_nonzero_with_one_message(tiny_config, capsys, edit, expected):
    tree = yaml.safe_load(tiny_config.read_text())
    new = edit(tree)
    tiny_config.write_text(new if isinstance(new, str) else yaml.safe_dump(new))
    code = main(["train", str(tiny_config)])
    err = capsys.readouterr().err
    assert code != 0
    assert err.startswith("error: ") and expected in err and "Traceback" not in err


def test_cli_process_trains_and_samples(tiny_config, tmp_path):
    done = run_cli("train", tiny_config, "train.max_steps=2")
    assert done.returncode == 0, done.stderr
    assert "done: 2 steps" in done.stdout
    run_dir = tmp_path / "runs" / "tiny"
    sample = run_cli(
        "sample", run_dir, "--prompt", "the ", "--max-tokens", "20", "--temperature", "0"
    )
    assert sample.returncode == 0, sample.stderr
    again = run_cli(
        "sample", run_dir, "--prompt", "the ", "--max-tokens", "20", "--temperature", "0"
    )
    assert sample.stdout == again.stdout and sample.stdout.startswith("the ")


def test_cli_process_error_has_no_traceback(tmp_path):
    done = run_cli("train", tmp_path / "missing.yaml")
    assert (
        done.returncode == 2
        and "config file not found" in done.stderr
        and "Traceback" not in done.stderr
    )


# Every verb with --json: arguments that make it quick on the tiny config, and what its progress
# writes on the way (on stderr), if anything (issue 33 item 7).
JSON_VERBS = {
    "plan": (["--no-trace", "--gpu", "H100-SXM", "--device", "cpu"], ""),
    "bench": (["--steps", "1"], "prepare text: 100%"),  # the data is prepared first
}


def _verbs_with_json() -> set[str]:
    import inspect

    from conftest import verbs

    return {
        " ".join(path)
        for path, app in verbs()
        if app.default_command and "json" in inspect.signature(app.default_command).parameters
    }


def test_every_json_verb_is_checked_below():
    assert _verbs_with_json() == set(JSON_VERBS)  # a new --json verb joins JSON_VERBS


@pytest.mark.slow
@pytest.mark.parametrize("verb", sorted(JSON_VERBS))
def test_json_prints_one_document_on_stdout_and_progress_on_stderr(verb, tiny_config):
    import json

    args, progress = JSON_VERBS[verb]
    done = run_cli(verb, tiny_config, "--json", *args)  # in a fresh cache: nothing prepared yet
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)  # the whole of stdout is one JSON document
    assert isinstance(doc, dict) and doc
    assert progress in done.stderr
