"""The one distil -> measure -> export route (pathtwt.compress.pipeline) for every method:
one model.json schema, and a budget sized on the tiles the run actually trains on (a
training source other than the fit tiles, as --train-coords attaches, included)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from pathtwt.compress.calibration import CalibrationSet
from pathtwt.compress.pipeline import EXPORT_KEYS, ROUTE_KEYS, CompressOptions
from pathtwt.compress.registry import get_method, known_methods
from pathtwt.compress.training_tiles import ArrayTiles
from pathtwt.models.registry import create_backbone

# what each method needs to run on the 12-layer tiny backbone in a few steps
SETTINGS = {
    "twt": dict(depth=3, audition_steps=1),
    "truncation": dict(depth=3),
    "wdpruning": dict(depth=3, extra={"probe_hidden": 16}),
    "subset": dict(depth=3, extra={"search_budget": 13, "search_steps": 0}),
    "nose": dict(),
    "raptor": dict(depth=3),
    "linear": dict(depth=3),
}
TRAINS = {"twt", "truncation", "wdpruning", "subset", "nose", "raptor"}


def _tiles(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 56, 56, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def teacher():
    return create_backbone("vit-s14-tiny", pretrained=False, init_seed=3)


@pytest.fixture(scope="module")
def calib():
    # a training source three times the fit split: an epoch of it is 6 steps of 4 tiles,
    # an epoch of the fit tiles would be 2, so a budget sized on the wrong one shows
    base = CalibrationSet(fit=_tiles(8, 1), select=_tiles(4, 2), report=_tiles(4, 3), patch_size=56, seed=0)
    return dataclasses.replace(base, training=ArrayTiles(_tiles(24, 4)))


@pytest.fixture(scope="module")
def exported(teacher, calib, tmp_path_factory):
    root = tmp_path_factory.mktemp("route")
    metas = {}
    for method in known_methods():
        kw = SETTINGS[method]
        options = CompressOptions.from_flat(out=root / method, epochs=1.0, batch_size=4, progress=False, augment=False, **kw)
        folder = get_method(method)(teacher, calib, options)
        metas[method] = json.loads((folder / "model.json").read_text())
    return metas


def test_every_method_is_covered():
    assert set(SETTINGS) == set(known_methods())


def test_every_model_json_has_the_shared_keys_in_the_same_places(exported):
    shared = set(EXPORT_KEYS) | set(ROUTE_KEYS)
    for method, meta in exported.items():
        assert shared <= set(meta), f"{method}: lacks {sorted(shared - set(meta))}"
        assert meta["method"] == method
    # ... and the shared records have one shape whatever the method
    for key in ("budget", "distillation", "fidelity", "provenance"):
        shapes = {method: sorted(meta[key]) for method, meta in exported.items()}
        assert len({tuple(s) for s in shapes.values()}) == 1, f"{key}: {shapes}"
    shapes = {method: sorted(meta["budget"]["run"]) for method, meta in exported.items()}
    assert len({tuple(s) for s in shapes.values()}) == 1, shapes
    # the architecture part (models.registry.variant_metadata) is the same set of keys for all
    common = set.intersection(*(set(meta) for meta in exported.values()))
    assert {"format", "timm_name", "timm_kwargs", "input_size", "embed_dim"} <= common
    # the depth once, where timm reads it
    assert all("depth" not in meta and "depth" in meta["timm_kwargs"] for meta in exported.values())


def test_the_budget_is_the_steps_the_run_took_on_its_training_source(exported, calib):
    n = len(calib.training_tiles())
    assert n == 24 and len(calib.fit) == 8
    for method, meta in exported.items():
        run, distilled = meta["budget"]["run"], meta["distillation"]
        if method in TRAINS:
            assert run["resolved_steps"] == 6, method  # one epoch of 24 tiles, 4 a step
            assert distilled["steps"] == run["resolved_steps"], method
            assert distilled["training"] == {"source": "in-memory calibration tiles", "tiles": 24}, method
        else:  # closed form: fitted on the fit tiles, no optimiser step
            assert run["resolved_steps"] == 0 and run["unit"] is None and distilled["steps"] == 0
            assert distilled["training"]["tiles"] == len(calib.fit)
    stages = exported["raptor"]["stages"]
    assert stages["stage1_steps"] + stages["stage2_steps"] == exported["raptor"]["distillation"]["steps"]


def test_a_method_cannot_overwrite_a_shared_record(teacher, calib, tmp_path):
    from pathtwt.compress.pipeline import export_variant
    from pathtwt.compress.methods.truncation import truncated_student

    options = CompressOptions.from_flat(out=tmp_path / "x", steps=1, batch_size=4, progress=False)
    with pytest.raises(ValueError, match="budget"):
        export_variant(truncated_student(teacher, 2), teacher, calib, options, method="truncation", run=None,
                       extra={"budget": {}})
    with pytest.raises(ValueError, match="params"):
        export_variant(truncated_student(teacher, 2), teacher, calib, options, method="truncation", run=None,
                       extra={"params": 1})


def test_the_calibration_set_is_frozen(calib):
    with pytest.raises(dataclasses.FrozenInstanceError):
        calib.training = None


def test_compress_discovers_through_the_one_discovery_function(teacher, calib, tmp_path, monkeypatch):
    from pathtwt.compress import discovery
    from pathtwt.compress.pipeline import resolve_plan

    real, calls = discovery.discover, []
    monkeypatch.setattr(discovery, "discover", lambda *a, **k: calls.append(k) or real(*a, **k))
    plan = resolve_plan(teacher, calib, CompressOptions.from_flat(out=tmp_path, depth=3, batch_size=4, tokens="cls"))
    assert len(calls) == 1 and calls[0]["depth"] == 3 and calls[0]["tokens"] == "cls"
    direct = real(teacher, calib, depth=3, tokens="cls", batch_size=4, device="cpu").plan()
    assert plan == direct and plan["num_layers"] == 12 and len(plan["blocks"]) == 3
