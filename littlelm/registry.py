"""The trainer's callbacks by name: the one open set of components. Every other component (model,
optimizer, schedule, tokenizer, data source) is a union of config classes that the schema names
(littlelm/config.py); this one cannot be.

Why: callbacks are the trainer's plug-in point and their code sits above the schema, in train/
(the loggers, the sampler) and eval/ (in-context evaluation during training), which import the
schema; the schema may not import them back (pyproject.toml's layers). So `callbacks:` is
validated against this table, and `littlelm.components.register_all()`, at the top of the
layers, fills it. The first lookup fills it when no entry point has (the package's `__init__`
hands `register_all` over with `fill_on_first_use`), so `Trainer(load_run("demo"))` works in a
fresh interpreter, and importing littlelm still fills nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from littlelm.config import ComponentConfig, component_name

CALLBACKS: dict[str, type[ComponentConfig]] = {}
_filler: Callable[[], None] | None = None  # register_all, called at the first lookup


def fill_on_first_use(fill: Callable[[], None]) -> None:
    """Call `fill()` (once) at the first lookup, when the table is still empty."""
    global _filler
    _filler = fill


def callback_classes() -> dict[str, type[ComponentConfig]]:
    """The callbacks' config classes by name (filled at the first call, if need be)."""
    global _filler
    if not CALLBACKS:
        fill, _filler = _filler, None  # cleared first: fill() registers, which must not recurse
        if fill is not None:
            fill()
    return CALLBACKS


def register_callback(cls: type[ComponentConfig]) -> None:
    """Add a callback's config class under its name; adding it again changes nothing, another
    class under a taken name is a bug."""
    name = component_name(cls)
    assert CALLBACKS.get(name, cls) is cls, f"callback {name!r} registered twice"
    CALLBACKS[name] = cls
