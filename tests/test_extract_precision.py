"""``pathtwt extract --precision auto`` on bf16 hardware: bf16 autocast guarded by a
first-tiles comparison with fp32, falling back to fp32 (and saying so) below the bar."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import pathtwt.features.extract as extract
from pathtwt.models.registry import create_backbone


@pytest.fixture(scope="module")
def job(shared_slides, tmp_path_factory):
    from pathtwt.io.h5 import write_coords

    root = tmp_path_factory.mktemp("precision")
    xy = np.array([[600 + 112 * i, 900 + 112 * j] for i in range(3) for j in range(2)])
    attrs = dict(patch_size=56, patch_size_level0=112, target_mpp=1.0, level0_mpp=0.499, read_level=0,
                 level0_width=2220, level0_height=2967, target_magnification=10.0, status="ok",
                 slide_path=str(shared_slides / "CMU-1-Small-Region.svs"))
    write_coords(root / "coords.h5", xy, np.ones(len(xy)), attrs)
    return root, extract.ExtractJob(shared_slides / "CMU-1-Small-Region.svs", root / "coords.h5", root / "fp32.h5")


def _features(path):
    with h5py.File(path, "r") as h5:
        return h5["features"][()], dict(h5.attrs)


def _run(job, backbone, out, **kw):
    j = extract.ExtractJob(job.slide, job.coords, out)
    extract.extract_many([j], backbone, batch_size=4, workers=0, progress=False, **kw)
    return _features(out)


@pytest.mark.parametrize("bar,kept", [(-1.0, True), (1.01, False)], ids=["kept", "fell-back"])
def test_bf16_autocast_is_checked_on_the_first_batch(job, monkeypatch, bar, kept):
    root, fp32_job = job
    backbone = create_backbone("vit-s14-tiny", pretrained=False, init_seed=2, precision="fp32")
    ref, ref_attrs = _run(fp32_job, backbone, root / "fp32.h5")
    assert ref_attrs["precision"] == "fp32" and "precision_check" not in ref_attrs
    monkeypatch.setattr("pathtwt.models.bf16_guard.BF16_MIN_COSINE", bar)
    feats, attrs = _run(fp32_job, backbone, root / f"auto-{kept}.h5", bf16_autocast=True)
    if kept:
        assert attrs["precision"] == "bf16-autocast" and attrs["precision_check"].startswith("bf16 autocast kept")
        assert not np.array_equal(feats, ref)  # computed in bf16
        cos = torch.nn.functional.cosine_similarity(torch.from_numpy(feats), torch.from_numpy(ref), dim=1)
        assert float(cos.min()) > 0.98
    else:
        assert attrs["precision"] == "fp32" and attrs["precision_check"].startswith("fell back to fp32")
        assert np.array_equal(feats, ref)  # exactly the fp32 numbers
