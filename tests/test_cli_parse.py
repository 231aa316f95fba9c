"""The command line's parsing: overrides anywhere, --version, help, `list`, shell completion."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from littlelm import __version__
from littlelm.cli import main, parse_args
from littlelm.config import first_sentence


@pytest.mark.parametrize(
    "argv, items",
    [
        (["train", "demo", "--nproc", "2", "run.name=ddp"], ["demo", "run.name=ddp"]),
        (
            ["train", "demo", "--resume", "never", "train.max_steps=5"],
            ["demo", "train.max_steps=5"],
        ),
        (["train", "--nproc", "2", "demo", "a=1"], ["demo", "a=1"]),
        # order is kept, so a later override still wins
        (
            ["train", "x.yaml", "a=1", "--nproc", "2", "a=2", "--resume", "never", "a=3"],
            ["x.yaml", "a=1", "a=2", "a=3"],
        ),
        (["plan", "demo", "--json", "model.n_layer=4"], ["demo", "model.n_layer=4"]),
        (["bench", "demo", "--steps", "2", "train.seq_len=8"], ["demo", "train.seq_len=8"]),
        (["config", "show", "demo", "--flat", "a=1"], ["demo", "a=1"]),
        (["data", "prepare", "demo", "--workers", "1", "a=1"], ["demo", "a=1"]),
    ],
)
def test_overrides_accepted_after_options(argv, items):
    assert parse_args(argv).items == items


def test_grow_overrides_after_options():
    args = parse_args(["grow", "runs/a", "--to", "big.yaml", "a=1"])
    assert args.to == ["big.yaml", "a=1"]
    args = parse_args(["grow", "runs/a", "b=2", "--to", "big.yaml", "a=1"])
    assert args.to == ["big.yaml", "a=1", "b=2"]


@pytest.mark.parametrize(
    "argv, word",
    [
        (["train", "demo", "--bogus", "1"], "'--bogus'"),
        (["plan", "demo", "--json", "--chrt=x.png"], "'--chrt=x.png'"),
        (["list", "a=1"], "'a=1'"),
    ],
)
def test_unknown_option_is_a_clear_error(argv, word, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"unrecognized argument {word}" in err
    assert "--help" in err and "Traceback" not in err
    if argv[0] != "list":  # verbs that take overrides say how to write one
        assert "key=value" in err


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"littlelm {__version__}"


def test_help_shows_examples_and_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "examples:" in out and "--resume never train.max_steps=5" in out
    assert "(default: auto)" in out and "(default: None)" not in out
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 16384)" in out and "(default: crop)" in out
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "examples:" in out and "register-python-argcomplete littlelm" in out


def test_list_descriptions_are_whole_sentences(capsys):
    assert main(["list"]) == 0
    entries = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert entries and all(line.rstrip().endswith((".", ".)")) for line in entries), entries
    assert first_sentence("Shape of the GPT. Derived values\n are filled in by\n x.") == (
        "Shape of the GPT."
    )
    assert first_sentence("Parquet files (e.g. HF\n datasets), one column.\n\nMore.") == (
        "Parquet files (e.g. HF datasets), one column."
    )


def _complete(line: str) -> list[str]:
    """What bash completion offers for `line`, through argcomplete's protocol (fd 8)."""
    read, write = os.pipe()
    env = {
        **os.environ,
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_IFS": "\n",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "COMP_TYPE": "9",
    }
    subprocess.run(
        [sys.executable, "-m", "littlelm"],
        env=env,
        close_fds=False,  # keep fd 8, made by preexec_fn, open in the child
        preexec_fn=lambda: os.dup2(write, 8),
        timeout=60,
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(write)
    with os.fdopen(read) as f:
        return [w.strip() for w in f.read().split("\n") if w.strip()]


def test_shell_completion_offers_verbs_options_and_configs():
    assert "train" in _complete("littlelm tr")
    assert {"--resume", "--nproc"} <= set(_complete("littlelm train --"))
    assert "demo" in _complete("littlelm train de")


def test_train_with_override_after_resume(tiny_config, tmp_path, capsys):
    assert main(["train", str(tiny_config), "--resume", "never", "train.max_steps=2"]) == 0
    assert "done: 2 steps" in capsys.readouterr().out


def test_repeated_eval_task_is_scored_once():
    from littlelm.eval.run import parse_labels

    assert parse_labels("copa,copa, piqa,copa") == ["copa", "piqa"]


def test_export_gguf_types_are_the_exporters():
    # cli.py keeps its own copy so that parsing arguments does not import the exporter
    from littlelm.cli import TYPES_GGUF
    from littlelm.interop.gguf_export import TYPES

    assert TYPES_GGUF == TYPES
