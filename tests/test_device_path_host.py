"""What the GPU path costs the host, shown on PyTorch's meta device: every tensor operation
is dispatched and shaped, nothing is computed, and no value can be read back. A job runs
there from end to end, so the loop reads nothing back from the device per batch, and it
dispatches a bounded number of operations per batch however many native tiles lie under it."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pathtwt.features import gpu_decoders
from pathtwt.features.extract import extract_many
from pathtwt.features.jobs import ExtractJob
from pathtwt.io import h5 as h5io
from pathtwt.models.registry import create_backbone
from cmu_coords import CMU

CMU_TILE = 240  # the slide's native JPEG tiles


def _meta_backbone():
    """h0-mini-tiny's spec and transform, on the meta device, with a model that computes
    nothing (its tokens are zeros on the host)."""
    backbone = create_backbone("h0-mini-tiny", pretrained=False)
    spec = backbone.spec

    class NullModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1))

        def forward_features(self, x):
            return torch.zeros(len(x), 1 + spec.num_prefix_tokens + 1, spec.embed_dim)

    return dataclasses.replace(backbone, model=NullModel(), device="meta")


class Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _coords(path, slide, side: int):
    xy = [(x, y) for y in range(0, 2967 - side, side) for x in range(0, 2220 - side, side)][:16]
    attrs = dict(patch_size=224, patch_size_level0=side, target_mpp=side * 0.499 / 224, level0_mpp=0.499,
                 read_level=0, level0_width=2220, level0_height=2967, target_magnification=10, status="ok",
                 slide_path=str(slide))
    h5io.write_coords(path, np.array(xy, dtype=np.int64), np.ones(len(xy)), attrs)
    return path


def test_the_gpu_path_reads_nothing_back_and_its_operations_do_not_grow_with_native_tiles(tmp_path, shared_slides,
                                                                                          monkeypatch):
    released = []

    def stub(device):  # a decoder that decodes nothing: views of one meta tensor, as nvImageCodec's are wrapped
        def decode(streams):
            return list(torch.empty((len(streams), CMU_TILE, CMU_TILE, 3), dtype=torch.uint8, device=device).unbind(0))

        # nothing to check its pixels against; what it keeps for a job's streams is dropped when the job ends
        return gpu_decoders.BatchDecoder("stub", decode, is_host=True, release=released.append)

    monkeypatch.setitem(gpu_decoders.GPU_DECODERS, "stub", gpu_decoders.Entry(lambda: True, stub, False))
    backbone, slide = _meta_backbone(), shared_slides / CMU
    per_batch, natives = {}, {}
    for side in (300, 600):  # the same shrinks, 1-4 or 4-9 native tiles under each tile
        coords = _coords(tmp_path / f"c{side}.h5", slide, side)
        counts = []
        for copies in (1, 1, 3):  # a warm-up, then the steady state: 3 slides less 1, 2 batches each
            counted = Ops()
            with counted:
                extract_many([ExtractJob(slide, coords, tmp_path / f"f{side}-{i}.h5") for i in range(copies)], backbone,
                             batch_size=8, workers=0, progress=False, gpu_decoder="stub")
            counts.append(counted.count)
        per_batch[side] = (counts[2] - counts[1]) / 4
        natives[side] = h5io.read_features(tmp_path / f"f{side}-0.h5")[2]["natives_decoded_device"] / 2
    assert released == [False] * 6  # once per job, its buffers only (nothing ran out of memory)
    assert natives[600] >= 2 * natives[300]
    assert max(per_batch.values()) <= 64 and per_batch[600] == per_batch[300], (per_batch, natives)
    print("operations per batch", per_batch)
