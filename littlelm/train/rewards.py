"""RL's reward functions (train/rl.py), chosen by `rl.reward`: a name below, or `module:function`
for one's own. A reward function takes the model's reply (text, the end token left out) and the
prompt's reference answer (text) and returns a number; 1 means correct (what `rl_pass1` counts).

    exact     1 when the reply's answer equals the reference's, else 0: the answer is what
              follows the last `####` (else the whole reply), trimmed, commas of numbers
              dropped: what `littlelm eval --chat` scores (data/chat.py `extract`)
    numeric   1 when that answer is a number equal to the reference's number (so "46.0" and
              "46" agree), else 0; a reply whose answer is not a number scores 0

The model's text is only parsed (strings, numbers), never executed; a `module:function` is
imported by name (importlib), never eval'd. It must be one's own: a module of Python's standard
library (`os:system`, `subprocess:run`) is refused when the config is read, and a function that
cannot be called as function(reply, answer) when the run starts. It returns a real number (int,
float, bool, or a numpy scalar of those).

Each call has `rl.reward_timeout` seconds (a SIGALRM timer: the main thread, as training is):
past it the run stops with the function and the reply named. SIGTERM or SIGINT during a call
interrupts it (a hung function would otherwise never let the step end): the step is left out
and the run saves its checkpoint and exits as on any stop (train/signals.py).

Two forms of `module:function` (`rl.reward_form`, default auto):

    pair      function(reply, answer) -> float: one call per reply (the built-ins' form)
    batched   function(prompts, completions, **kwargs) -> list[float]: TRL's reward_funcs form,
              one call per step with every reply of the step, called by keyword: `prompts[i]`
              the i-th reply's prompt as messages, `completions[i]` its reply as
              [{"role": "assistant", "content": text}] (TRL's conversational form), and one
              keyword per other column of the prompt rows (`answer`, and any other key of the
              JSONL row but question and messages), a list holding each reply's row value

`auto` picks batched when the function has a parameter named `completions`, else pair; the
timeout then covers the one call of the step.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import math
import numbers
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator

import numpy as np

from littlelm.data.chat import extract
from littlelm.errors import ConfigError, TrainingError
from littlelm.train.objective import StepInterrupted

Reward = Callable[..., float]  # pair: (reply, answer); batched: a list (train/rl.py calls)
FORMS = ("auto", "pair", "batched")
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
    """`spec` if it names a built-in reward or has the form module:function of a module outside
    the standard library, else ValueError (the config's validator turns it into a message)."""
    if spec in BUILT_IN:
        return spec
    if SPEC.fullmatch(spec):
        top = spec.split(":")[0].split(".")[0]
        if top in sys.stdlib_module_names or top in sys.builtin_module_names:
            raise ValueError(
                f"{spec!r} is a function of Python's standard library ({top}), not a reward "
                "function: write one in your own module, my_rewards.py: def score(reply, "
                "answer) -> float, and give rl.reward: my_rewards:score"
            )
        return spec
    raise ValueError(
        f"{spec!r} is neither a built-in reward ({', '.join(BUILT_IN)}) nor a Python function "
        "path module:function (e.g. my_rewards:score)"
    )


def reward_function(spec: str, form: str = "auto", columns: tuple[str, ...] = ()):
    """(the reward `spec` names, its form: pair or batched): a built-in (pair), or
    `module:function` imported from the Python path, checked to take the calls its form makes
    (`columns`: the keywords a batched function is given besides prompts and completions)."""
    if spec in BUILT_IN:
        if form == "batched":
            raise ConfigError(
                [f"rl.reward: {spec} is a built-in reward of the pair form; drop rl.reward_form"]
            )
        return BUILT_IN[spec], "pair"
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
    try:
        signature = inspect.signature(fn)
    except ValueError:  # a C function without a signature: its first call tells
        return fn, "batched" if form == "batched" else "pair"
    if form == "auto":
        form = "batched" if "completions" in signature.parameters else "pair"
    try:  # else it would fail at its first call, mid-step
        if form == "batched":
            signature.bind(prompts=[], completions=[], **{c: [] for c in columns})
        else:
            signature.bind("reply", "answer")
    except TypeError as e:
        if form == "batched":
            keywords = ", ".join(("prompts", "completions", *columns))
            want = (
                f"called as {attr}({keywords}) by keyword ({e}); a batched reward function "
                "(TRL's form) takes def f(prompts, completions, **kwargs) -> list[float]"
            )
        else:
            want = (
                f"called as {attr}(reply, answer) ({e}); a reward function takes the reply's "
                "text and the reference answer and returns a number, or (TRL's batched form) "
                "def f(prompts, completions, **kwargs) -> list[float]"
            )
        raise ConfigError(
            [f"rl.reward: {spec} ({form} form, rl.reward_form) cannot be {want}"]
        ) from None
    return fn, form


class RewardTimeout(Exception):
    pass


class RewardStopped(StepInterrupted):
    """SIGTERM or SIGINT arrived during a reward call: the call was interrupted."""


def score(fn: Reward, spec: str, reply: str, answer: str, timeout: float | None = None) -> float:
    """fn(reply, answer), within `timeout` seconds (None: no limit), checked to be a finite
    real number (a bool counts as 0 or 1). Raises TrainingError, or RewardStopped."""
    try:
        with _deadline(timeout):
            value = fn(reply, answer)
    except RewardTimeout:
        raise TrainingError(
            f"rl.reward {spec!r} did not return within rl.reward_timeout = {timeout:g} s for the "
            f"reply {reply[:80]!r}; fix the function (an endless loop, a call that waits), or "
            "raise rl.reward_timeout"
        ) from None
    return checked(value, spec, reply)


def score_batch(
    fn, spec: str, prompts: list, replies: list[str], columns: dict, timeout: float | None = None
) -> list[float]:
    """A batched reward function's scores of `replies` (TRL's call: prompts, completions as
    assistant messages, `columns` by keyword), one call within `timeout` seconds; each a finite
    real number. Raises TrainingError, or RewardStopped."""
    completions = [[{"role": "assistant", "content": r}] for r in replies]
    try:
        with _deadline(timeout):
            values = fn(prompts=prompts, completions=completions, **columns)
    except RewardTimeout:
        raise TrainingError(
            f"rl.reward {spec!r} did not return within rl.reward_timeout = {timeout:g} s for "
            f"the step's {len(replies)} replies (one batched call); fix the function (an endless "
            "loop, a call that waits), or raise rl.reward_timeout"
        ) from None
    got = f"{len(values)} values" if isinstance(values, (list, tuple)) else repr(values)[:80]
    if not isinstance(values, (list, tuple)) or len(values) != len(replies):
        raise TrainingError(
            f"rl.reward {spec!r} (batched form) returned {got} for {len(replies)} completions; a "
            "batched reward function returns a list with one number per completion (or declare "
            "rl.reward_form: pair for f(reply, answer) -> float)"
        )
    return [checked(v, spec, r) for v, r in zip(values, replies)]


def checked(value, spec: str, reply: str) -> float:
    """A reward function's `value` as a float: a finite real number (a bool counts as 0 or 1;
    numpy's scalars are numbers too), else TrainingError."""
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise TrainingError(
            f"rl.reward {spec!r} returned {value!r} for the reply {reply[:80]!r}; a reward "
            "function returns a finite number (1 = correct)"
        )
    return float(value)


@contextlib.contextmanager
def _deadline(timeout: float | None) -> Iterator[None]:
    """RewardTimeout after `timeout` seconds; RewardStopped on SIGTERM/SIGINT, after the
    handler in place (the trainer's StopSignals) has recorded the stop. Outside the main thread
    (where signals cannot be handled) the call runs unguarded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def on_alarm(signum, frame):
        raise RewardTimeout

    def on_stop(signum, frame):
        handler = previous[signum]
        if callable(handler):
            handler(signum, frame)  # records the stop (a second Ctrl-C raises here)
        raise RewardStopped(f"{signal.Signals(signum).name} received during a reward call")

    old_alarm = signal.signal(signal.SIGALRM, on_alarm)
    for sig, handler in previous.items():
        if callable(handler):  # else the default action (end the process) already stops it
            signal.signal(sig, on_stop)
    if timeout is not None:
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_alarm)
        for sig, handler in previous.items():
            if callable(handler):
                signal.signal(sig, handler)
