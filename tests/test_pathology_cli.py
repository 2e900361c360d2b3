"""Every stage accepts any registered model: discover -> compress (TWT, a few steps) ->
extract through the CLI, on the tiny doubles of two families: UNI's ViT-L/16 (GELU MLP,
LayerScale, no registers, position embedding on CLS) and H-optimus-0's ViT-g/14 (packed
SwiGLU, 4 registers without position embeddings), with real H&E tiles and a real slide."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from pathtwt.cli import main
from pathtwt.models.registry import create_backbone, get_spec


def _coords_file(slides, path, patch: int):
    from pathtwt.io.h5 import write_coords

    xy = np.array([[600 + 2 * patch * i, 900 + 2 * patch * j] for i in range(3) for j in range(2)])
    attrs = dict(patch_size=patch, patch_size_level0=2 * patch, target_mpp=1.0, level0_mpp=0.499, read_level=0,
                 level0_width=2220, level0_height=2967, target_magnification=10.0, status="ok",
                 slide_path=str(slides / "CMU-1-Small-Region.svs"))
    write_coords(path, xy, np.ones(len(xy)), attrs)
    return path


@pytest.mark.parametrize("backbone", ["uni-tiny", "h-optimus-0-tiny"])
def test_discover_compress_extract_on_a_pathology_encoder(backbone, shared_tiles, shared_slides, tmp_path):
    import timm

    spec = get_spec(backbone)
    common = ["--backbone", backbone, "--random-init", "--calibration", str(shared_tiles),
              "--n-tiles", "24", "--batch-size", "8", "--device", "cpu"]
    assert main(["discover", *common, "--depth", "6", "--out", str(tmp_path / "plan")]) == 0
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert plan["backbone"] == backbone and len(plan["blocks"]) == 6 and plan["num_layers"] == 12

    twt = tmp_path / "models" / "twt-6"
    assert main(["compress", *common, "--method", "twt", "--plan", str(tmp_path / "plan" / "plan.json"),
                 "--steps", "3", "--audition-steps", "1", "--no-progress", "--out", str(twt)]) == 0
    meta = json.loads((twt / "model.json").read_text())
    assert meta["name"] == f"{backbone}/twt-6" and meta["timm_kwargs"]["depth"] == 6 and meta["layer_patches"] == {}
    assert meta["num_prefix_tokens"] == spec.num_prefix_tokens and meta["licence"] == spec.licence
    assert meta["timm_kwargs"]["patch_size"] == spec.timm_kwargs["patch_size"]

    # the variant folder in timm's hub format loads with timm alone and equals pathtwt's load
    plain = timm.create_model(f"local-dir:{twt}", pretrained=True).eval()
    variant = create_backbone(str(twt))
    x = torch.randn(2, 3, spec.input_size, spec.input_size)
    with torch.no_grad():
        assert torch.equal(plain.forward_features(x), variant.model.forward_features(x))
    assert f"| depth | 6 of {spec.depth} |" in (twt / "README.md").read_text()

    coords = _coords_file(shared_slides, tmp_path / "coords" / "CMU-1-Small-Region.h5", patch=spec.input_size)
    for recipe, width in (("cls+mean", 128), ("cls", 64)):
        feats = tmp_path / "features" / recipe / "CMU-1-Small-Region.h5"
        assert main(["extract", str(shared_slides / "CMU-1-Small-Region.svs"), "--coords", str(coords),
                     "--out", str(feats), "--backbone", str(twt), "--embedding", recipe, "--device", "cpu",
                     "--workers", "0", "--no-progress"]) == 0
        with h5py.File(feats, "r") as h5:
            assert h5["features"].shape == (6, width) and np.isfinite(h5["features"][:]).all()
            assert h5.attrs["base_backbone"] == backbone and h5.attrs["embedding_recipe"] == recipe


@pytest.mark.parametrize("method", ["truncation", "raptor", "wdpruning", "nose", "linear", "subset"])
def test_every_comparison_method_runs_on_virchow2_tiny(method, shared_tiles, tmp_path, capsys):
    """Virchow2's family: packed SwiGLU, 4 registers that do carry position embeddings."""
    out = tmp_path / method
    goal = [] if method == "nose" else ["--depth", "6"]
    if method == "subset":
        goal += ["--option", "search_budget=13", "--option", "search_steps=1"]  # the smallest search
    assert main(["compress", "--backbone", "virchow2-tiny", "--random-init", "--calibration", str(shared_tiles),
                 "--n-tiles", "8", "--batch-size", "4", "--device", "cpu", "--steps", "1", "--no-progress",
                 "--method", method, *goal, "--out", str(out)]) == 0
    # the training budget is announced by the methods that train, not by the closed-form one
    assert ("distillation: " in capsys.readouterr().out) == (method != "linear")
    meta = json.loads((out / "model.json").read_text())
    assert meta["base_backbone"] == "virchow2-tiny" and meta["num_prefix_tokens"] == 5
    variant = create_backbone(str(out))
    x = torch.randn(1, 3, 56, 56)
    with torch.no_grad():
        assert variant.embed_tiles(x).shape == (1, 128)
    assert (out / "README.md").is_file()
    assert (out / "config.json").is_file() == (not meta["layer_patches"])
