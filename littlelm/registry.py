"""Registries: components picked by short name from YAML.

    MODELS = Registry("model")
    MODELS.register("gpt", config=GPTConfig)(GPT)      # in littlelm/components.py's table

    cls = MODELS.get("gpt")             # unknown names raise ConfigError listing the known ones
    cfg_cls = MODELS.config_class("gpt")

Each entry pairs a builder (class or function) with the typed config its YAML section is
validated against. Importing a component's module registers nothing; every component is
registered by `littlelm.components.register_all()`, from one table. The first lookup in an
empty registry calls it (the package's `__init__` hands it over with `fill_on_first_use`, so
this bottom layer imports nothing above it): `load_model(RUN)` or `Trainer(load_run("demo"))`
work in a fresh interpreter, and importing littlelm still registers nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from littlelm.errors import ConfigError, did_you_mean

T = TypeVar("T")

_filler: Callable[[], None] | None = None  # register_all, called at the first lookup


def fill_on_first_use(fill: Callable[[], None]) -> None:
    """Call `fill()` (once) before the first lookup in any registry that is still empty."""
    global _filler
    _filler = fill


def _fill() -> None:
    global _filler
    fill, _filler = _filler, None  # cleared first: fill() registers, which must not recurse
    if fill is not None:
        fill()


@dataclass(frozen=True)
class Entry:
    name: str
    builder: Any
    config: type | None
    doc: str


class Registry:
    """A named table of components of one kind (model, optimizer, schedule, ...)."""

    all: dict[str, Registry] = {}  # noqa: RUF012  (class-level index of every registry)

    def __init__(self, kind: str):
        assert kind not in Registry.all, f"registry {kind!r} defined twice"
        self.kind = kind
        self._entries: dict[str, Entry] = {}
        Registry.all[kind] = self

    def register(self, name: str, config: type | None = None) -> Callable[[T], T]:
        """`register(name, config)(builder)`: registering the same pair again changes nothing
        (so that `register_all()` may run twice); another builder under a taken name is a bug."""

        def decorate(obj: T) -> T:
            old = self._entries.get(name)
            if old is not None and (old.builder, old.config) == (obj, config):
                return obj
            assert old is None, f"{self.kind} {name!r} registered twice"
            own = config.__dict__.get("__doc__") if config is not None else None
            doc = own or getattr(obj, "__doc__", None) or ""
            self._entries[name] = Entry(name, obj, config, first_sentence(doc))
            return obj

        return decorate

    def _filled(self) -> dict[str, Entry]:
        if not self._entries:
            _fill()
        return self._entries

    def entry(self, name: str) -> Entry:
        if name not in self._filled():
            raise ConfigError(
                [
                    f"unknown {self.kind} {name!r}{did_you_mean(name, self._entries)}; "
                    f"known: {self.known()}"
                ]
            )
        return self._entries[name]

    def get(self, name: str) -> Any:
        return self.entry(name).builder

    def config_class(self, name: str) -> type | None:
        return self.entry(name).config

    def known(self) -> str:
        """The registered names, or how to fill the registry when it is empty."""
        if not self._filled():
            return "none (call littlelm.components.register_all() first; the CLI does)"
        return ", ".join(self.names())

    def names(self) -> list[str]:
        return sorted(self._filled())

    def entries(self) -> list[Entry]:
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name: str) -> bool:
        return name in self._filled()


def first_sentence(doc: str) -> str:
    """The docstring's first sentence, its lines joined (`littlelm list` shows it whole)."""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    end = re.search(r"(?<!e\.g)(?<!i\.e)\. ", paragraph)  # a full stop, not an "e.g."
    return paragraph[: end.start() + 1] if end else paragraph


MODELS = Registry("model")
OPTIMIZERS = Registry("optimizer")
SCHEDULES = Registry("schedule")
TOKENIZERS = Registry("tokenizer")
DATASETS = Registry("dataset")
CALLBACKS = Registry("callback")
