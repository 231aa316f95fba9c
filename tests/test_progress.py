from __future__ import annotations

import io
import re

from littlelm.console import Console, progress_line
from littlelm.progress import Progress, printable
from littlelm.schema import load_run
from littlelm.train.trainer import Trainer

# Any C0/C1 control character except newline (tab is allowed too).
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_stream_gets_plain_lines():
    out = io.StringIO()
    p = Progress(out)
    line = progress_line(
        {"step": 3, "loss": 2.5, "lr_mult": 1.0, "tok_per_s": 1234.0, "eta_s": 61, "mfu": None},
        10,
    )
    p.update(line)
    p.update(line)
    p.message("sample:\n\x1b[31mred\x1b[0m\rover\x07written\tdone")
    text = out.getvalue()
    assert not CONTROL.search(text)
    assert text.count(line + "\n") == 2
    assert "\\x1b[31mred" in text and "\\rover\\x07written\tdone" in text


def test_terminal_rewrites_the_line_in_place():
    out = Terminal()
    p = Progress(out)
    p.update("step 1")
    p.update("step 2")
    p.message("eval")
    assert out.getvalue() == "\r\x1b[2Kstep 1\r\x1b[2Kstep 2\neval\n"


def test_printable_keeps_text_and_escapes_controls():
    assert printable("déf ×\tok\n") == "déf ×\tok\n"
    assert printable("a\x1b[2Kb\x9bc") == "a\\x1b[2Kb\\x9bc"


def test_training_log_in_a_file_has_no_control_characters(tiny_config, monkeypatch):
    """The whole start-up (summary, rich's group table), progress, evals and a generated sample,
    with FORCE_COLOR set (rich would otherwise write colour codes into the file)."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    out = io.StringIO()
    cfg = load_run(tiny_config, ["train.max_steps=3", "eval.every=2", "callbacks=[{name: sample}]"])
    Trainer(cfg, resume="never", progress=Progress(out), callbacks=(Console(),)).fit()
    text = out.getvalue()
    assert "parameter groups" in text and "step 3/3" in text and "--- sample" in text
    assert "gnorm" in text
    assert not CONTROL.search(text), repr(CONTROL.search(text))
