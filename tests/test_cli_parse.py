"""The command line's parsing: overrides anywhere, --version, help, `list`, shell completion."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from littlelm import __version__
from littlelm.cli import build_app, main
from littlelm.config import first_sentence


def parse(argv: list[str]):
    return build_app().parse_args(argv, exit_on_error=False, print_error=False, verbose=False)[1]


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
        (["train", "a=1", "--nproc", "2", "b=2"], ["a=1", "b=2"]),  # a leading override: demo
        (["plan", "demo", "--json", "model.n_layer=4"], ["demo", "model.n_layer=4"]),
        (["bench", "demo", "--steps", "2", "train.seq_len=8"], ["demo", "train.seq_len=8"]),
        (["config", "show", "demo", "--flat", "a=1"], ["demo", "a=1"]),
        (["data", "prepare", "demo", "--workers", "1", "a=1"], ["demo", "a=1"]),
        (["sweep", "demo", "--set", "a=1,2", "b=3", "--zip", "c=4"], ["demo", "b=3", "c=4"]),
    ],
)
def test_overrides_accepted_after_options(argv, items):
    from littlelm.cli_args import split_config

    args = parse(argv).args
    assert list(args) == items
    assert split_config(args[0], args[1:]) == (("demo", items) if "=" in items[0] else (items[0], items[1:]))  # fmt: skip


def test_grow_overrides_after_options():
    args = parse(["grow", "runs/a", "--to", "big.yaml", "a=1"])
    assert args.args == ("runs/a", "a=1") and args.kwargs == {"to": "big.yaml"}
    args = parse(["grow", "runs/a", "b=2", "--to", "big.yaml", "a=1"])
    assert args.args == ("runs/a", "b=2", "a=1") and args.kwargs == {"to": "big.yaml"}


@pytest.mark.parametrize(
    "argv, word",
    [
        (["train", "demo", "--bogus", "1"], "--bogus"),
        (["plan", "demo", "--json", "--chrt=x.png"], "--chrt=x.png. Did you mean --chart?"),
        (["list", "a=1"], "'a=1'"),
        (["train", "demo", "a=1", "steps"], "'steps' is not an override"),
        (["eval", "runs/x", "--warn-share", "2"], "--warn-share. Must be <= 1"),
        (["plan", "demo", "--tokens", "0"], "--tokens. Must be >= 1"),
        (["trian"], 'Did you mean "train"?'),
    ],
)
def test_a_bad_command_line_is_one_clear_line(argv, word, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and word in err and err.count("\n") == 1, err
    assert ("(see `littlelm --help`)" if argv == ["trian"] else f"(see `littlelm {argv[0]} --help`)") in err  # fmt: skip
    assert "Traceback" not in err
    if argv[0] in ("train", "plan") and "Unknown option" in err:  # these take overrides
        assert "overrides are written key=value" in err


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"littlelm {__version__}"


def test_help_shows_examples_and_defaults(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line per option
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "--resume never train.max_steps=5" in out
    assert "[default: auto]" in out and "[default: None]" not in out
    assert main(["eval", "--help"]) == 0
    out = capsys.readouterr().out
    assert "[default: 16384]" in out and "[choices: crop, drop_shots] [default: crop]" in out
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "littlelm --install-completion" in out
    assert main([]) == 0 and "Usage: littlelm COMMAND" in capsys.readouterr().out


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


def test_completion_script_completes_verbs_options_and_configs(tmp_path):
    """`littlelm --install-completion` writes bash's script; bash, running it, offers the verbs,
    a verb's options, and the packaged configs (these by calling `littlelm __complete`)."""
    bash = shutil.which("bash")
    assert bash, "bash is needed to run the completion script"
    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    bin_dir.mkdir()
    home.mkdir()
    exe = bin_dir / "littlelm"  # what `pip install` puts on PATH
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} -m littlelm "$@"\n')
    exe.chmod(0o755)
    env = {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    script = tmp_path / "littlelm.bash"
    done = subprocess.run(
        [exe, "--install-completion", "--shell", "bash", "--output", script],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and script.is_file(), done.stderr
    assert str(script) in (home / ".bashrc").read_text()  # sourced by every new shell

    def complete(line: str) -> set[str]:
        words = line.split(" ")
        probe = (
            f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
            f"COMP_LINE='{line}'; COMP_POINT={len(line)}; _littlelm; printf '%s\\n' \"${{COMPREPLY[@]}}\""
        )
        done = subprocess.run([bash, "-c", probe], env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        return set(done.stdout.split())

    assert "train" in complete("littlelm tr")
    assert {"--resume", "--nproc"} <= complete("littlelm train --")
    assert {"--gpu", "--json", "--price-per-hour"} <= complete("littlelm plan demo --")
    assert "demo" in complete("littlelm train de")
    assert "shakespeare_char" in complete("littlelm plan sh")


def test_train_with_override_after_resume(tiny_config, tmp_path, capsys):
    assert main(["train", str(tiny_config), "--resume", "never", "train.max_steps=2"]) == 0
    assert "done: 2 steps" in capsys.readouterr().out


def test_repeated_eval_task_is_scored_once():
    from littlelm.eval.run import parse_labels

    assert parse_labels("copa,copa, piqa,copa") == ["copa", "piqa"]


def test_export_refuses_a_gguf_type_the_exporter_lacks(tmp_path, capsys):
    from littlelm.interop.gguf_export import TYPES

    argv = ["export", str(tmp_path), "--gguf", str(tmp_path / "m.gguf"), "--gguf-type", "q8"]
    assert main(argv) == 2
    assert (
        f"--gguf-type q8: GGUF weights are stored as {' or '.join(TYPES)}"
        in capsys.readouterr().err
    )


def test_each_verbs_line_in_the_list_is_its_docstrings_first_line():
    """cli.py registers the verbs by import path and so gives their lines in `littlelm --help`
    itself (cyclopts cannot read a docstring it has not imported): each is its docstring's."""
    import importlib

    from littlelm.cli import CONFIG_VERBS, DATA_VERBS, VERBS

    for path, line in [*VERBS, *CONFIG_VERBS, *DATA_VERBS]:
        module, name = path.split(":")
        doc = getattr(importlib.import_module(module), name).__doc__
        assert doc.splitlines()[0] == line, f"{path}: cli.py's line is not its docstring's"


def test_help_imports_only_the_verb_it_shows():
    """`littlelm --help` imports no verb's module, `littlelm train --help` only train's, neither
    torch: in a fresh process, as a user's shell (or tab completion) starts one."""
    probe = (
        "import sys; from littlelm.cli import main; main(sys.argv[1:]); "
        "print(sorted(m for m in sys.modules if m.endswith('verbs') or m == 'torch'))"
    )
    run = [sys.executable, "-c", probe]
    top = subprocess.run([*run, "--help"], capture_output=True, text=True, timeout=120)
    assert "Train (or resume) a run." in top.stdout and top.stdout.endswith("[]\n"), top.stderr
    verb = subprocess.run([*run, "train", "--help"], capture_output=True, text=True, timeout=120)
    assert "examples:" in verb.stdout and verb.stdout.endswith("['littlelm.verbs']\n"), verb.stderr
