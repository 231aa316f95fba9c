"""RL's reward functions (train/rl.py), chosen by `rl.reward`: a name below, or `module:function`
for one's own. A reward function takes the model's reply (text, the end token left out) and the
prompt's reference answer (text) and returns a number; 1 means correct (what `rl_pass1` counts).

    exact     1 when the reply's answer equals the reference's, else 0: the answer is what
              follows the last `####` (else the whole reply), trimmed, commas of numbers
              dropped: what `littlelm eval --chat` scores (data/chat.py `extract`)
    numeric   1 when that answer is a number equal to the reference's number (so "46.0" and
              "46" agree), else 0; a reply whose answer is not a number scores 0

The model's text is only parsed (strings, numbers), never executed; a `module:function` is
imported by name (importlib), never eval'd.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable

from littlelm.data.chat import extract
from littlelm.errors import ConfigError, TrainingError

Reward = Callable[[str, str], float]
NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")  # what float() reads, no inf/nan
SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")  # module.path:function


def exact(reply: str, answer: str) -> float:
    return float(extract(reply) == extract(answer))


def number(text: str) -> float | None:
    """The number `text` holds (all of it, after extract), or None when it is not one."""
    text = extract(text)
    return float(text) if NUMBER.fullmatch(text) else None


def numeric(reply: str, answer: str) -> float:
    got, want = number(reply), number(answer)
    return float(got is not None and want is not None and got == want)


BUILT_IN: dict[str, Reward] = {"exact": exact, "numeric": numeric}


def check_spec(spec: str) -> str:
    """`spec` if it names a built-in reward or has the form module:function, else ValueError
    (the config's validator turns it into a message)."""
    if spec in BUILT_IN or SPEC.fullmatch(spec):
        return spec
    raise ValueError(
        f"{spec!r} is neither a built-in reward ({', '.join(BUILT_IN)}) nor a Python function "
        "path module:function (e.g. my_rewards:score)"
    )


def reward_function(spec: str) -> Reward:
    """The reward `spec` names: a built-in, or `module:function` imported from the Python path."""
    if spec in BUILT_IN:
        return BUILT_IN[spec]
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(
            [
                f"rl.reward: cannot import module {module_name!r} ({e}); put the directory that "
                "holds it on PYTHONPATH (or install it), or use a built-in reward: "
                + ", ".join(BUILT_IN)
            ]
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(
            [f"rl.reward: module {module_name!r} has no function {attr!r} (reply, answer) -> float"]
        )
    return fn


def score(fn: Reward, spec: str, reply: str, answer: str) -> float:
    """fn(reply, answer) checked to be a finite number (a bool counts as 0 or 1)."""
    value = fn(reply, answer)
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TrainingError(
            f"rl.reward {spec!r} returned {value!r} for the reply {reply[:80]!r}; a reward "
            "function returns a finite number (1 = correct)"
        )
    return float(value)
