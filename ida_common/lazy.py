"""Package attributes imported on first use (PEP 562), for packages whose public names pull in torch.

``python -m PKG.tool --help`` imports ``PKG/__init__.py`` first; when that imports every public name eagerly, a
help text or a one-line argument error waits for torch and transformers (seconds). A package lists such names
with the module that defines each, and binds what :func:`lazy_attributes` returns:

    __getattr__, __dir__ = lazy_attributes(__name__, {"load_model": "ida_eval.loader"})

The first access imports the module and keeps the value in the package, so later accesses are plain lookups.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, table: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: each name of ``table`` (name -> module) imported on first use."""

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(table[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__
