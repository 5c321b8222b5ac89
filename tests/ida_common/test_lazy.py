"""ida_common.lazy: a package's attributes imported on first use, then kept."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest


def test_an_attribute_is_imported_on_first_use_and_then_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "lazypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from ida_common.lazy import lazy_attributes\n"
        "EAGER = 1\n"
        "__getattr__, __dir__ = lazy_attributes(__name__, {'heavy': 'lazypkg.slow'})\n"
    )
    (pkg / "slow.py").write_text("heavy = object()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lazypkg", raising=False)
    monkeypatch.delitem(sys.modules, "lazypkg.slow", raising=False)
    mod = importlib.import_module("lazypkg")
    assert "lazypkg.slow" not in sys.modules and {"EAGER", "heavy"} <= set(dir(mod))
    value = mod.heavy
    assert "lazypkg.slow" in sys.modules and value is sys.modules["lazypkg.slow"].heavy
    assert vars(mod)["heavy"] is value  # kept: the next access is a plain lookup
    from lazypkg import heavy  # noqa: E402 - `from` imports go through the same hook

    assert heavy is value
    with pytest.raises(AttributeError, match="module 'lazypkg' has no attribute 'missing'"):
        _ = mod.missing
