"""Optional packages, imported only when a configured feature needs them.

    wandb = require("wandb", extra="logging", feature="the wandb callback")

A missing package is a `DependencyError` that names the pip command installing it, raised when
the run is built, before any data is prepared.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from littlelm.errors import DependencyError


def require(module: str, extra: str, feature: str, package: str | None = None) -> ModuleType:
    """Import `module`, or raise a DependencyError naming `pip install 'littlelm[extra]'`."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pkg = package or module.split(".")[0]
        raise DependencyError(
            f"{feature} needs the {pkg} package, which is not installed ({e}); "
            f"install it with: pip install -e '.[{extra}]' in a clone of littlelm (pip install "
            f"'littlelm[{extra}]' where a package index has littlelm, or pip install {pkg})"
        ) from e
