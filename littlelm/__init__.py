"""littlelm: train small decoder-only language models from one YAML file."""

from littlelm import registry as _registry

__version__ = "0.1.0"


def _register_all() -> None:
    from littlelm.components import register_all  # deferred: importing littlelm stays cheap

    register_all()


# The Python API stands alone: `load_model(RUN)`, `load_run("demo")` or `Trainer(cfg)` in a fresh
# interpreter fill the registries at their first lookup, as the CLI's explicit call does.
_registry.fill_on_first_use(_register_all)
