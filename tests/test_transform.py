"""The tile transform is timm's data config: read back with resolve_model_data_config, and
the numpy fast path agrees with timm's create_transform pipeline on real tiles."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from pathtwt.models.registry import create_backbone, get_spec
from pathtwt.models.transform import TileTransform


@pytest.fixture(scope="module")
def vit_s():
    return create_backbone("vit-s14-imgfocus", pretrained=False)


@pytest.mark.parametrize("name", ["h0-mini-tiny", "hibou-b-tiny", "vit-s14-tiny", "vit-s14-imgfocus"])
def test_models_carry_the_registry_preprocessing_as_timm_data_config(name):
    from timm.data import resolve_model_data_config

    bb = create_backbone(name, pretrained=False)
    spec = get_spec(name)
    config = resolve_model_data_config(bb.model)
    assert config["input_size"] == (3, spec.input_size, spec.input_size)
    assert config["mean"] == pytest.approx(spec.mean) and config["std"] == pytest.approx(spec.std)
    assert config["crop_pct"] == 1.0
    described = bb.transform.describe()
    assert described["input_size"] == spec.input_size and described["mean"] == pytest.approx(spec.mean)


def test_fast_path_numbers_unchanged_and_equal_to_timm_at_input_size(vit_s, shared_tiles):
    paths = sorted((shared_tiles / "nct-crc-he").glob("*.tif"))
    assert len(paths) == 9
    spec = vit_s.spec
    direct = TileTransform(spec.input_size, spec.mean, spec.std)  # built without timm, as before
    pipeline = vit_s.transform.timm_pipeline()
    for path in paths:
        image = Image.open(path).convert("RGB")
        ours = vit_s.transform(np.asarray(image))
        assert torch.equal(ours, direct(np.asarray(image)))
        theirs = pipeline(image)
        assert theirs.shape == ours.shape == (3, 224, 224)
        assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    batch = vit_s.transform.batch([np.asarray(Image.open(p).convert("RGB")) for p in paths[:3]])
    assert torch.allclose(batch[1], pipeline(Image.open(paths[1]).convert("RGB")), atol=1e-5)


def test_enlarging_agrees_with_timm_within_one_grey_level(vit_s, shared_tiles):
    pipeline = vit_s.transform.timm_pipeline()
    one_level = 1.0 / 255.0 / min(vit_s.spec.std) + 1e-5
    paths = sorted((shared_tiles / "kather2016").glob("*/*.tif"))[:6]
    for path in paths:
        image = Image.open(path).convert("RGB")
        assert image.size == (150, 150)  # enlarged to 224: OpenCV bilinear vs PIL bilinear
        diff = (vit_s.transform(np.asarray(image)) - pipeline(image)).abs()
        assert float(diff.max()) <= one_level
