"""Shared fixtures. Real files live in ../shared (never copied into the repository);
tests that need them skip with a reason when it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PATHTWT_SHARED", REPO.parent / "shared"))
SHARED_SLIDES = SHARED / "data" / "slides"
SHARED_TILES = SHARED / "data" / "tiles"
SHARED_VIT_S = SHARED / "weights" / "vit_s14_imgfocus.safetensors"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"real test data not available: {path} is absent (../shared is not checked out beside the repo)")
    return path


@pytest.fixture(scope="session")
def shared_slides() -> Path:
    return _need(SHARED_SLIDES)


@pytest.fixture(scope="session")
def shared_tiles() -> Path:
    return _need(SHARED_TILES)


@pytest.fixture(scope="session")
def vit_s_weights() -> Path:
    return _need(SHARED_VIT_S)


@pytest.fixture(autouse=True, scope="session")
def _few_threads():
    # The CI machine has 2 cores; keep torch from oversubscribing them.
    try:
        import torch
    except ImportError:  # pragma: no cover
        yield
        return
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    yield
