"""Every example command in every `--help` and in README.md and docs/*.md is run: the cheap ones
for real (`list`, `config show`, `--help`, `--version`), the others parsed by littlelm's own
command line and their configs validated as the verb would (the config with the same overrides,
each sweep variant, the named GPUs); verbs that read a run or checkpoint are parsed only.
Placeholder file names (run.yaml, big.yaml, ...) stand for the packaged demo config, so their
overrides are checked against the real schema. Usage lines (`littlelm plan RUN.yaml [--gpu
NAME ...]`) are checked for their verb and options."""

from __future__ import annotations

import inspect
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from cyclopts import CycloptsError

from conftest import APP, verbs
from littlelm.cli import is_verb, main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGED = {p.stem for p in (ROOT / "littlelm" / "configs").rglob("*.yaml")}
PLACEHOLDER = re.compile(r"^(\[.*|.*\.\.\..*|[A-Z][A-Z_]*([./].*)?)$")  # RUN, DIR/LABEL, [--x]


def parse(argv: list[str]) -> tuple[Any, dict[str, Any]]:
    """The function a command line runs and its arguments by name; a bad line raises."""
    fn, bound, _ = APP.parse_args(argv, exit_on_error=False, print_error=False, verbose=False)
    return fn, bound.arguments


def help_examples() -> list[tuple[str, str]]:
    out = []
    for path, app in verbs():
        text = app.default_command.__doc__ if app.default_command else app.help
        lines = [x.strip() for x in (text or "").splitlines()]
        cmds = [c.strip() for x in lines for c in re.split(r"\s&&\s", x)]
        cmds = [c for c in cmds if c.startswith("littlelm ")]
        out += [(f"help {' '.join(path) or 'littlelm'} #{i}", c) for i, c in enumerate(cmds)]
    return out


def doc_examples() -> list[tuple[str, str]]:
    """(where, command): lines of fenced code blocks that run littlelm, and inline code spans
    that do."""
    out = []
    for doc in DOCS:
        fenced, pending = False, ""
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            where = f"{doc.relative_to(ROOT)}:{n}"
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                text = pending + line.strip()
                if text.endswith("\\"):  # a continued line
                    pending = text[:-1] + " "
                    continue
                pending = ""
                for part in re.split(r"\s&&\s", text):
                    part = part.strip().removeprefix(".venv/bin/")
                    if part.startswith("littlelm "):
                        out.append((where, part))
            else:  # inline: a usage mention unless it sets an override
                out += [(where + "*", m) for m in re.findall(r"`(littlelm [^`]*)`", line)]
    return out


EXAMPLES = help_examples() + doc_examples()


def words_of(command: str) -> list[str]:
    """The argv of a shell line, without its comment and redirections."""
    words = shlex.split(command, comments=True)
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
        elif w in ("<", ">", "2>", ">>"):
            skip = True
        else:
            out.append(w)
    assert out[0] == "littlelm", command
    return out[1:]


def resolve_config(word: str) -> str:
    """A packaged config or a file of this repository as it is; a placeholder file: the demo."""
    if word in PACKAGED or (ROOT / word).is_file():
        return str(ROOT / word) if (ROOT / word).is_file() else word
    return "demo"


def check_usage(argv: list[str]) -> None:
    """A usage line: its verb exists and takes every option it names."""
    apps = dict(verbs())
    path: tuple[str, ...] = ()
    for w in argv:
        if (*path, w) in apps:
            path = (*path, w)
    if argv[0] in ("VERB", "--help", "--version", "--install-completion"):
        return
    assert path, f"no verb in {argv}"
    app = apps[path]
    options = {"--help", "-h"}
    if app.default_command is not None:
        options |= {n for a in app.assemble_argument_collection() for n in a.names}
    named = {w.strip("[]").split("=")[0] for w in argv if w.strip("[").startswith("--")}
    assert named <= options, f"`littlelm {' '.join(path)}` has no {sorted(named - options)}"


def check_example(argv: list[str], capsys) -> None:
    if argv and argv[0] == "VERB":  # `littlelm VERB --help`: every verb's help
        for path, _ in verbs():
            if path:
                check_example([*path, "--help"], capsys)
        return
    fn, args = parse(argv)
    if not is_verb(fn):  # --help, --version
        assert main(argv) == 0, capsys.readouterr().err
        return
    from littlelm.cli_args import split_config
    from littlelm.errors import DataError
    from littlelm.plan.cost import load_catalog
    from littlelm.schema import load_data_config, load_run
    from littlelm.sweep import SweepOptions, plan_sweep

    verb = fn.__name__
    config, overrides = split_config(args.get("config", "demo"), args.get("overrides", ()))
    if verb == "list_":  # cheap: run them
        assert main(["list"]) == 0
    elif verb == "show":
        flat = ["--flat"] if args.get("flat") else []
        assert main(["config", "show", resolve_config(config), *overrides, *flat]) == 0
    elif verb == "grow":
        load_run(resolve_config(args["to"]), [f"grow.parent={args['parent']}", *overrides])
    elif verb == "prepare":
        load_data_config(resolve_config(config), overrides)
    elif verb == "sweep":
        devices = args["devices"].split(",") if args.get("devices") else None
        opts = SweepOptions(resolve_config(config), overrides, args.get("set") or [])
        opts.zip, opts.budget, opts.seeds = args.get("zip", False), args.get("budget"), args.get("seeds", 1)  # fmt: skip
        opts.devices, opts.name, opts.price_per_hour = devices, args.get("name"), args.get("price_per_hour")  # fmt: skip
        plan_sweep(opts)  # every variant's config checked; nothing runs
    elif "overrides" in inspect.signature(fn).parameters:  # train, plan, bench
        world = args.get("nproc") or args.get("devices") or 1
        stages = [config]
        if verb == "plan":  # `plan A.yaml B.yaml k=v`: a pipeline's stages, each with the overrides
            stages += [o for o in overrides if "=" not in o]
            overrides = [o for o in overrides if "=" in o]
        for stage in stages:
            try:
                load_run(resolve_config(stage), overrides, world_size=world)
            except DataError:  # a tokenizer an earlier step makes (sft_demo's runs/demo)
                load_run(resolve_config(stage), [*overrides, "model.vocab_size=4096"], world_size=world)  # fmt: skip
        if verb == "plan":
            load_catalog(args.get("gpus") or []).select(args.get("gpu"))


@pytest.mark.parametrize("where, command", EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_every_documented_example_runs_or_validates(where, command, capsys, monkeypatch, tmp_path):
    # a budget's one-step check probes the CPU's peak: minutes on a busy machine, and no part
    # of what an example says
    monkeypatch.setattr("littlelm.train.device.probe_matmul", lambda *a, **k: 1e12)
    monkeypatch.chdir(tmp_path)  # relative outputs land in the test's directory
    argv = words_of(command)
    if (
        (where.endswith("*") and "=" not in command)
        or tuple(argv) in dict(verbs())
        or any(PLACEHOLDER.match(w) for w in argv if not w.startswith("--") or "[" in w)
    ):
        check_usage(argv)
    else:
        check_example(argv, capsys)


def test_the_examples_are_found():
    """The collection itself: each source contributes, and the train help's override example
    is among them (it once named `optim.lr`, which no config has)."""
    wheres = {w.split(":")[0].split(" #")[0] for w, _ in EXAMPLES}
    assert {"README.md", "docs/interop.md", "help train", "help littlelm"} <= wheres
    assert any("optimizer.lr=" in c for w, c in EXAMPLES if w.startswith("help train"))
    assert len(EXAMPLES) > 100


def test_a_bad_override_in_an_example_fails(capsys, monkeypatch, tmp_path):
    from littlelm.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="did you mean 'optimizer'"):
        check_example(words_of("littlelm train run.yaml train.max_steps=500 optim.lr=3e-3"), capsys)
    with pytest.raises(CycloptsError):  # an option the verb lacks
        check_example(words_of("littlelm plan demo --gpus-per-node 8"), capsys)
    with pytest.raises(AssertionError):
        check_usage(words_of("littlelm plan RUN.yaml [--gpu-count N]"))
