"""Shared test fixtures: where the MBXP data lives (../shared/mbxp beside the checkout)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def mbxp_dir() -> Path | None:
    """The MBXP Python data directory, or None when it is not on this machine.

    ``IDA_MBXP_DIR`` overrides; otherwise ``../shared/mbxp`` beside the repository root.
    """
    env = os.environ.get("IDA_MBXP_DIR")
    candidates = [Path(env)] if env else []
    candidates.append(REPO_ROOT.parent / "shared" / "mbxp")
    for c in candidates:
        if (c / "mbpp_release_v1.jsonl").is_file():
            return c
    return None


@pytest.fixture(scope="session")
def mbxp_problems_file() -> Path:
    d = mbxp_dir()
    if d is None:
        pytest.skip("MBXP data not found (set IDA_MBXP_DIR or place it at ../shared/mbxp)")
    return d / "mbpp_release_v1.jsonl"
