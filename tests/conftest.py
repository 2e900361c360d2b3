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
SHARED_BACH = SHARED / "data" / "bach" / "images"
# the shipped configs name ../shared as it lies beside the checkout: true where that is SHARED
SHARED_BESIDE_REPO = SHARED.exists() and SHARED.resolve() == (REPO.parent / "shared").resolve()


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
def shared_bach() -> Path:
    return _need(SHARED_BACH)


@pytest.fixture(scope="session")
def vit_s_weights() -> Path:
    return _need(SHARED_VIT_S)


@pytest.fixture(autouse=True, scope="session")
def _few_threads():
    # The CI machine has 2 cores; keep torch from oversubscribing them: each pytest-xdist
    # worker (pyproject's addopts) computes on its share of them.
    try:
        import torch
    except ImportError:  # pragma: no cover
        yield
        return
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1) // workers))
    yield


@pytest.fixture(autouse=True, scope="session")
def _slide_checks_cached_apart(tmp_path_factory):
    # `pathtwt check-config` keeps what it read of each slide in a cache folder (by default
    # in the home folder); the tests' own, shared by their subprocesses
    os.environ["PATHTWT_CACHE_DIR"] = str(tmp_path_factory.mktemp("pathtwt-cache"))
    yield


# The files whose tests take longest on the 2-core CI machine (minutes each: planning the
# paper's 12,000-job study, the SLURM cluster, real-image benchmarks and probes, killed and
# resumed runs). pytest-xdist hands out whole files in collection order, so these go
# first and the light files fill in around them: the two workers then finish together
# instead of one running the last long file alone.
LONGEST_FIRST = ("test_profiles.py", "test_slurm.py", "test_benchmark_suite.py", "test_probe.py",
                 "test_distill_scale.py", "test_fault_injection.py", "test_device_check.py", "test_slide_names.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept otherwise


@pytest.fixture(autouse=True)
def _device_decided_per_test():
    # pathtwt.devices.use_device decides once per process; a test is a process of its own
    yield
    from pathtwt import devices

    devices._DECIDED.clear()
