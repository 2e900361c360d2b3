"""Faults in an extraction job, each one line and no features file that looks finished: a
forward pass out of GPU memory (halved, said once, the job goes on), a reading process that
dies, shared memory the system refuses; and the loop's own contracts: the weights cast once
give plain autocast's numbers, the job's closing line names its bound consistently, a slide
that fails its checks mid-job leaves the others whole."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch

from pathtwt.errors import PathtwtError
from pathtwt.features.extract import extract_many
from pathtwt.features.jobs import ExtractJob
from pathtwt.io import h5 as h5io
from pathtwt.models.registry import create_backbone
from cmu_coords import CMU, GRID, write_cmu_coords


@pytest.fixture(scope="module")
def tiny():
    return create_backbone("h0-mini-tiny", pretrained=False, init_seed=5)


def test_a_forward_pass_out_of_gpu_memory_is_halved_said_once_and_the_job_goes_on(tmp_path, shared_slides, tiny,
                                                                                   capsys):
    slide = shared_slides / CMU
    coords = write_cmu_coords(tmp_path / "c.h5", slide, GRID[:10])
    extract_many([ExtractJob(slide, coords, tmp_path / "whole.h5")], tiny, batch_size=8, workers=0, progress=False)
    capsys.readouterr()
    forward = tiny.model.forward_features

    def small_memory(x):  # a GPU that holds 3 tiles' activations at a time
        if len(x) > 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return forward(x)

    tiny.model.forward_features = small_memory
    try:
        extract_many([ExtractJob(slide, coords, tmp_path / "halved.h5")], tiny, batch_size=8, workers=0,
                     progress=False)
    finally:
        del tiny.model.forward_features
    lines = [line for line in capsys.readouterr().err.splitlines() if "out of memory" in line]
    assert len(lines) == 1 and "going on with 2 tiles per pass" in lines[0] and "--batch-size 2" in lines[0]
    whole, halved = h5io.read_features(tmp_path / "whole.h5"), h5io.read_features(tmp_path / "halved.h5")
    assert np.abs(whole[0] - halved[0]).max() <= 1e-5
    assert halved[2]["forward_batch"] == 2 and whole[2]["forward_batch"] == 8


def test_a_reading_process_that_dies_stops_the_job_in_one_line_naming_the_slide(tmp_path, shared_slides, tiny,
                                                                                 monkeypatch):
    from pathtwt.features import reading

    slide = shared_slides / CMU
    jobs = [ExtractJob(slide, write_cmu_coords(tmp_path / f"c{i}.h5", slide, GRID[:6]), tmp_path / f"f{i}.h5")
            for i in range(3)]
    band = reading.BatchReader.band

    def killed_on_the_second_slide(self, read, band_, slots):
        if read.number == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # the system's out-of-memory killer, say
        yield from band(self, read, band_, slots)

    monkeypatch.setattr(reading.BatchReader, "band", killed_on_the_second_slide)
    with pytest.raises(PathtwtError) as err:
        extract_many(jobs, tiny, batch_size=2, workers=1, progress=False)
    line = str(err.value)
    assert "\n" not in line and "reading process 0 died (signal 9)" in line and str(slide) in line
    assert "lower --workers or --batch-size" in line
    assert not (tmp_path / "f1.h5").exists() and not (tmp_path / "f2.h5").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_shared_memory_the_system_refuses_is_one_line(tmp_path, shared_slides, tiny, monkeypatch):
    import mmap

    from pathtwt.features import ring

    real = mmap.mmap

    def refused(fileno, length, *args, **kwargs):
        if length > 10_000:  # the ring (the per-slide mode table is a few bytes)
            raise OSError(12, "Cannot allocate memory")
        return real(fileno, length, *args, **kwargs)

    monkeypatch.setattr(ring.mmap, "mmap", refused)
    line = _refused_in_one_line(tmp_path, shared_slides, tiny, GRID[:4])
    assert "shared memory for the tile ring" in line and "MiB" in line and "lower --batch-size or --workers" in line


@pytest.mark.parametrize("name", ["vit-s14-tiny", "h0-mini-tiny"])
def test_weights_cast_once_give_plain_autocasts_numbers(name):
    from pathtwt.models.bf16_guard import AutoPrecision
    from pathtwt.models.embedding import embed_tiles

    backbone = create_backbone(name, pretrained=False, init_seed=2)
    size = backbone.spec.input_size
    x = torch.randn(3, 3, size, size)
    params = {n: (p, p.dtype) for n, p in backbone.model.named_parameters()}
    with torch.inference_mode():
        with AutoPrecision(bf16=True).context("cpu", backbone.model):
            each = embed_tiles(backbone.model, x, backbone.spec.num_prefix_tokens)
        with AutoPrecision(bf16=True).job_context("cpu", backbone.model):
            cast = {p.dtype for p in backbone.model.parameters()}
            once = embed_tiles(backbone.model, x, backbone.spec.num_prefix_tokens)
    assert torch.bfloat16 in cast  # the linear layers' weights were bf16 inside the job
    assert torch.equal(each, once)
    assert {n: (p, p.dtype) for n, p in backbone.model.named_parameters()} == params  # and are fp32 again


def test_the_closing_line_names_the_bound_consistently_in_process(tmp_path, shared_slides, tiny, capsys):
    slide = shared_slides / CMU
    job = ExtractJob(slide, write_cmu_coords(tmp_path / "c.h5", slide, GRID[:3]), tmp_path / "f.h5")
    extract_many([job], tiny, batch_size=4, workers=0, progress=False)
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("extract: ")]
    assert "tiles read in this process" in line
    reading, model = (int(part.split("%")[0].split()[-1]) for part in line.split(" and the model ")[0:2])
    bound = line.rsplit("bound by ", 1)[1]
    assert bound == ("reading" if reading > model else "the model")


def test_a_slide_that_fails_its_checks_mid_job_leaves_the_others_whole(tmp_path, shared_slides, tiny):
    slide = shared_slides / CMU
    jobs = [ExtractJob(slide, write_cmu_coords(tmp_path / f"c{i}.h5", slide, GRID[i:i + 3]), tmp_path / f"f{i}.h5")
            for i in range(3)]
    missing = ExtractJob(tmp_path / "gone.svs", jobs[1].coords, tmp_path / "f_gone.h5")
    failures = tmp_path / "failures.tsv"
    summaries = extract_many([jobs[0], missing, jobs[2]], tiny, batch_size=2, workers=1, progress=False,
                             failures=failures)
    assert [s.get("tiles") for s in summaries] == [3, 0, 3]
    assert "slide file not found" in summaries[1]["failed"] and "gone" in failures.read_text()
    assert h5io.read_features(tmp_path / "f_gone.h5")[2]["status"] == "failed"
    assert h5io.read_features(tmp_path / "f2.h5")[0].shape == (3, 128)


def test_queues_the_system_cannot_make_are_one_line(tmp_path, shared_slides, tiny, monkeypatch):
    import multiprocessing

    context = multiprocessing.get_context("fork")

    def no_shm(*args, **kwargs):  # a container without a writable /dev/shm
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(type(context), "Queue", no_shm)
    line = _refused_in_one_line(tmp_path, shared_slides, tiny, GRID[:8])
    assert "/dev/shm must be a writable tmpfs" in line and "--workers 0" in line


def _refused_in_one_line(tmp_path, shared_slides, tiny, xy) -> str:
    """The one line a job with a reading process stops with, and no features file."""
    slide = shared_slides / CMU
    with pytest.raises(PathtwtError) as err:
        extract_many([ExtractJob(slide, write_cmu_coords(tmp_path / "c.h5", slide, xy), tmp_path / "f.h5")], tiny,
                     batch_size=2, workers=1, progress=False)
    assert "\n" not in str(err.value) and not (tmp_path / "f.h5").exists()
    return str(err.value)


def test_out_of_memory_in_the_cut_halves_the_batch_said_once_and_the_features_do_not_change(
        tmp_path, shared_slides, tiny, capsys, monkeypatch):
    """The GPU path (the host decoder standing in) runs out of memory while cutting: the
    batch is halved until it fits, said once, and the rows equal an uninterrupted run's."""
    from pathtwt.features import device_tiles

    slide = shared_slides / CMU
    coords = write_cmu_coords(tmp_path / "c.h5", slide, GRID[:10])
    extract_many([ExtractJob(slide, coords, tmp_path / "whole.h5")], tiny, batch_size=8, workers=1, progress=False,
                 gpu_decoder="host")
    capsys.readouterr()
    cut = device_tiles.cut

    def small_memory(stack, axes, lut):  # a GPU that holds 3 cut tiles at a time
        if axes.shape[1] > 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB")
        return cut(stack, axes, lut)

    monkeypatch.setattr(device_tiles, "cut", small_memory)
    extract_many([ExtractJob(slide, coords, tmp_path / "halved.h5")], tiny, batch_size=8, workers=1, progress=False,
                 gpu_decoder="host")
    lines = [line for line in capsys.readouterr().err.splitlines() if "out of memory" in line]
    assert len(lines) == 1 and "cutting and shrinking the tiles; going on with 2 tiles per pass" in lines[0]
    assert "--batch-size 2" in lines[0]
    whole, halved = h5io.read_features(tmp_path / "whole.h5"), h5io.read_features(tmp_path / "halved.h5")
    assert np.abs(whole[0] - halved[0]).max() <= 1e-5 and np.array_equal(whole[1], halved[1])
    assert halved[2]["forward_batch"] == 2 and halved[2]["status"] == "ok"
