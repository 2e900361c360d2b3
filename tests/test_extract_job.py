"""One extraction job over several slides: its reading workers start once for the job (not
once per slide), tiles reach the model as uint8 and are normalised there, and the features
equal those of the float32 path within fp32 rounding."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from pathtwt.features.extract import ExtractJob, extract_many
from pathtwt.io import h5 as h5io
from pathtwt.models.registry import create_backbone
from cmu_coords import CMU, GRID, write_cmu_coords


@pytest.fixture(scope="module")
def tiny():
    return create_backbone("h0-mini-tiny", pretrained=False, init_seed=5)


def _real_tiles(slide, n):
    from pathtwt.wsi.slides import open_slide

    with open_slide(slide) as s:
        return np.stack([s.read_tile(x, y, 448, 0, 224) for x, y in GRID[:n]])


def test_normalisation_on_the_device_equals_the_workers(shared_slides, tiny):
    tiles = _real_tiles(shared_slides / CMU, 6)
    transform = tiny.transform
    before = transform.batch(tiles)  # the float32 path: normalised in the reading process
    resized = torch.from_numpy(np.stack([transform.resize(t) for t in tiles]))  # what a worker sends: uint8
    assert resized.dtype == torch.uint8
    after = transform.normalise_batch(resized, "cpu")  # normalised where the model is
    assert after.dtype == torch.float32 and after.shape == before.shape and after.is_contiguous()
    # the same float32 constants, the same arithmetic: the same inputs
    assert torch.equal(after, before)
    with torch.inference_mode():
        old = tiny.embed_tiles(before).numpy()
        new = tiny.embed_tiles(after).numpy()
    assert np.abs(new - old).max() <= 1e-5
    # and the constants are the backbone's own (its spec's mean and std)
    assert transform.describe()["mean"] == list(tiny.spec.mean) and transform.describe()["std"] == list(tiny.spec.std)


def test_a_job_starts_its_readers_once_for_all_its_slides(tmp_path, shared_slides, tiny, monkeypatch):
    slide = shared_slides / CMU
    from pathtwt.features import reading

    starts = tmp_path / "starts"
    starts.mkdir()
    process = reading._reading_process

    def counted(worker, *args):  # runs in each reading process when it starts
        (starts / f"{os.getpid()}-{worker}").touch()
        process(worker, *args)

    monkeypatch.setattr(reading, "_reading_process", counted)
    sizes = [5, 0, 7, 3, 9]  # a slide without tissue among them
    jobs = []
    offset = 0
    for i, n in enumerate(sizes):
        xy = GRID[offset : offset + n]
        offset = (offset + n) % 10
        jobs.append(ExtractJob(slide, write_cmu_coords(tmp_path / f"c{i}.h5", slide, xy), tmp_path / f"f{i}.h5"))
    summaries = extract_many(jobs, tiny, batch_size=2, workers=2, progress=False)
    # two reading processes for the whole job (before: two more for every slide)
    assert len(list(starts.iterdir())) == 2
    assert [s["tiles"] for s in summaries] == sizes
    tiles = _real_tiles(slide, 20)
    for job, n in zip(jobs, sizes):
        feats, xy, attrs = h5io.read_features(job.out)
        assert feats.shape == (n, 128)
        want_xy = h5io.read_coords(job.coords)[0]
        assert np.array_equal(xy, want_xy)
        if n:
            rows = [GRID.index(tuple(p)) for p in want_xy]
            with torch.inference_mode():
                direct = tiny.embed_tiles(tiny.transform.batch(tiles[rows])).numpy()
            assert np.abs(feats - direct).max() <= 1e-5, job.out.name
        assert attrs["device"] == "cpu" and attrs["torch_version"] == torch.__version__
        assert "gpu_name" in attrs and "cuda_version" in attrs


def test_a_failing_slide_mid_job_leaves_the_others_whole(tmp_path, shared_slides, tiny, monkeypatch):
    from pathtwt.wsi.coords_tiles import TileGeometry

    slide = shared_slides / CMU
    good = [ExtractJob(slide, write_cmu_coords(tmp_path / f"c{i}.h5", slide, GRID[i : i + 4]), tmp_path / f"f{i}.h5")
            for i in range(3)]
    # one tile of the middle slide cannot be read (a damaged JPEG tile, say), found by a
    # worker after the slide passed its checks; the workers are forked with this patch
    read = TileGeometry.read_many

    def damaged(self, slide, xy, size=None):
        if any(tuple(map(int, p)) == (1344, 1792) for p in xy):
            raise OSError("damaged tile")
        return read(self, slide, xy, size)

    monkeypatch.setattr(TileGeometry, "read_many", damaged)
    bad_xy = [(0, 0), (1344, 1792), (448, 0), (0, 448), (448, 448)]
    bad = ExtractJob(slide, write_cmu_coords(tmp_path / "bad.h5", slide, bad_xy), tmp_path / "bad_f.h5")
    failures = tmp_path / "failures.tsv"
    summaries = extract_many([good[0], bad, good[1], good[2]], tiny, batch_size=2, workers=1, progress=False,
                             failures=failures)
    assert [s.get("tiles") for s in summaries] == [4, 0, 4, 4]
    assert "x=1344, y=1792" in summaries[1]["failed"]
    _feats, _xy, attrs = h5io.read_features(bad.out)
    assert attrs["status"] == "failed" and "x=1344, y=1792" in attrs["failure_reason"]
    assert "CMU-1-Small-Region" in failures.read_text()
    tiles = _real_tiles(slide, 8)
    for i, job in enumerate(good):
        feats, _xy, attrs = h5io.read_features(job.out)
        assert attrs["status"] == "ok"
        with torch.inference_mode():
            direct = tiny.embed_tiles(tiny.transform.batch(tiles[i : i + 4])).numpy()
        assert np.abs(feats - direct).max() <= 1e-5


def test_a_job_says_who_waited_for_whom(tmp_path, shared_slides, tiny, capsys):
    slide = shared_slides / CMU
    jobs = [ExtractJob(slide, write_cmu_coords(tmp_path / f"c{i}.h5", slide, GRID[i: i + 5]), tmp_path / f"f{i}.h5")
            for i in range(2)]
    extract_many(jobs, tiny, batch_size=2, workers=1, progress=False)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("extract: ")]
    assert len(lines) == 1 and "the model waited for tiles" in lines[0] and "1 reading process(es) waited" in lines[0]
    for job in jobs:
        _feats, _xy, attrs = h5io.read_features(job.out)
        assert 0.0 <= attrs["model_waited_share"] <= 1.0 and 0.0 <= attrs["readers_waited_share"] <= 1.0
        assert attrs["reading_workers"] == 1


def test_readers_on_a_gpu_are_the_jobs_cores_less_one(monkeypatch):
    monkeypatch.setattr("pathtwt.devices.available_cores", lambda: 32)
    from pathtwt.devices import reading_workers

    assert reading_workers("cuda:0") == 31  # no cap: a GPU embeds faster than 4 readers read
    assert reading_workers("cpu") == 4  # the forward passes share the cores
    monkeypatch.setattr("pathtwt.devices.available_cores", lambda: 1)
    assert reading_workers("cuda") == 1


def test_the_slides_timings_add_up_to_the_jobs_wall_time(tmp_path, shared_slides, tiny):
    """Slides overlap in a job (their checks and reads run ahead), so each features file's
    extract_seconds is the job's wall time spent on that slide's batches: summed over the
    job they make its wall time, never more (the report's tiles/s divides by that sum)."""
    import time

    import h5py

    slide = shared_slides / CMU
    jobs = [ExtractJob(slide, write_cmu_coords(tmp_path / f"c{i}.h5", slide, GRID[:8]), tmp_path / f"f{i}.h5")
            for i in range(4)]
    began = time.perf_counter()
    extract_many(jobs, tiny, batch_size=2, workers=1, progress=False)
    wall = time.perf_counter() - began
    seconds = [float(h5py.File(job.out, "r").attrs["extract_seconds"]) for job in jobs]
    assert all(s > 0 for s in seconds) and sum(seconds) <= wall
