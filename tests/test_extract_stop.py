"""A job that stops early (its model raised) ends with its own error alone: the feeder
thread that prepares the next slides is let finish the slide in hand and prepares no more,
so it neither reads on after the job has ended nor hands bands to the readers' closed
queues (a traceback of its own after the job's error)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import pathtwt.features.extract as extract
from pathtwt.io.h5 import write_coords
from pathtwt.models.registry import create_backbone
from cmu_coords import CMU


def test_a_job_that_stops_early_leaves_no_feeder_behind(shared_slides, tmp_path, monkeypatch):
    slide = shared_slides / CMU
    side = 56
    xy = np.array([[600 + side * i, 900] for i in range(4)])
    attrs = dict(patch_size=56, patch_size_level0=side, target_mpp=0.499, level0_mpp=0.499, read_level=0,
                 level0_width=2220, level0_height=2967, target_magnification=20.0, status="ok", slide_path=str(slide))
    write_coords(tmp_path / "coords.h5", xy, np.ones(len(xy)), attrs)
    jobs = [extract.ExtractJob(slide, tmp_path / "coords.h5", tmp_path / f"out{i}.h5") for i in range(6)]
    prepared: list[int] = []
    real_prepare = extract.prepare_slide

    def slow_prepare(job, *args, **kwargs):
        prepared.append(jobs.index(job))
        if len(prepared) > 1:
            time.sleep(0.5)  # a slide check in flight when the job stops
        return real_prepare(job, *args, **kwargs)

    backbone = create_backbone("vit-s14-tiny", pretrained=False, init_seed=2, precision="fp32")

    def failing(x):
        raise RuntimeError("the model failed")

    monkeypatch.setattr(extract, "prepare_slide", slow_prepare)
    monkeypatch.setattr(backbone.model, "forward_features", failing)
    thread_errors: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)
    with pytest.raises(RuntimeError, match="the model failed"):
        extract.extract_many(jobs, backbone, batch_size=2, workers=1, progress=False, gpu_decoder="host")
    feeders = [t for t in threading.enumerate() if t.name == "pathtwt-slide-feeder"]
    assert not feeders, "the feeder outlived the job"
    assert not thread_errors, [str(e.exc_value) for e in thread_errors]
    assert len(prepared) < len(jobs)  # it stopped preparing: the slides after the one in hand were not read
    assert not any(job.out.exists() for job in jobs)  # nothing half-written looks finished
