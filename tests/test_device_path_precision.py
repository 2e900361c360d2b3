"""The GPU path of a bf16 job, driven on a CPU through the whole loop: the job's forward
passes run under bf16 autocast (as on an H100 or H200), its tiles are cut, shrunk and
normalised in IEEE fp32 all the same, so the model is given exactly the pixels of an fp32
job."""

from __future__ import annotations

import numpy as np
import torch

import pathtwt.features.extract as extract
from pathtwt.io.h5 import write_coords
from pathtwt.models.registry import create_backbone
from cmu_coords import CMU


def test_a_bf16_jobs_model_is_given_the_fp32_jobs_pixels(shared_slides, tmp_path, monkeypatch):
    slide = shared_slides / CMU
    side = 75  # level pixels a tile, shrunk to the tiny model's 56: a fractional factor
    xy = np.array([[600 + side * i, 900 + side * j] for i in range(2) for j in range(2)])
    attrs = dict(patch_size=56, patch_size_level0=side, target_mpp=side * 0.499 / 56, level0_mpp=0.499, read_level=0,
                 level0_width=2220, level0_height=2967, target_magnification=10.0, status="ok", slide_path=str(slide))
    write_coords(tmp_path / "coords.h5", xy, np.ones(len(xy)), attrs)
    backbone = create_backbone("vit-s14-tiny", pretrained=False, init_seed=2, precision="fp32")
    given: list[tuple[bool, torch.Tensor]] = []
    forward = backbone.model.forward_features

    def recording(x):
        given.append((torch.is_autocast_enabled("cpu"), x.detach().clone()))
        return forward(x)

    monkeypatch.setattr(backbone.model, "forward_features", recording)
    monkeypatch.setattr("pathtwt.models.bf16_guard.BF16_MIN_COSINE", -1.0)  # bf16 kept, whatever its numbers
    inputs = {}
    for name, bf16 in (("fp32", False), ("bf16", True)):
        given.clear()
        job = extract.ExtractJob(slide, tmp_path / "coords.h5", tmp_path / f"{name}.h5")
        extract.extract_many([job], backbone, batch_size=2, workers=0, progress=False, gpu_decoder="host",
                             bf16_autocast=bf16)
        inputs[name] = [x for autocast, x in given if autocast == bf16][-2:]  # the job's two batches
    assert len(inputs["bf16"]) == len(inputs["fp32"]) == 2
    for a, b in zip(inputs["bf16"], inputs["fp32"]):
        assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b)
