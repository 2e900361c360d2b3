"""Distillation at scale, in miniature: tiles streamed from the real shared slides'
coords, the epoch order and its sharding, held-out slides kept out of training,
checkpoints that hold only tensors and plain values, and data-parallel runs with 2 gloo
processes (torchrun) against 1 process, killed with SIGKILL and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from pathtwt.cli import main
from pathtwt.compress.distill import CHECKPOINT_FORMAT, load_checkpoint
from pathtwt.compress.training_tiles import (EpochOrder, MicroBatches, Sharding, SlideTiles, TrainingItems,
                                             cv2_pool_stopped, loader, with_streamed_training)
from pathtwt.errors import ConfigError, PathtwtError

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).parent / "torchrun"
# 1 vs 2 ranks differ only in the float summation order of the gradient all-reduce (fp32)
RANKS_ATOL = 1e-4
# origins of three "slides" (separate coords files) over the real CMU-1-Small-Region.svs
REGIONS = {"cmu-a": (600, 900), "cmu-b": (1200, 1600), "cmu-c": (200, 2000)}


def _coords(slides: Path, folder: Path) -> Path:
    from pathtwt.io.h5 import write_coords

    folder.mkdir(parents=True, exist_ok=True)
    for name, (x0, y0) in REGIONS.items():
        xy = np.array([[x0 + 112 * i, y0 + 112 * j] for i in range(3) for j in range(2)])
        attrs = dict(patch_size=64, patch_size_level0=128, target_mpp=1.0, level0_mpp=0.499, read_level=0,
                     level0_width=2220, level0_height=2967, target_magnification=10.0, status="ok",
                     slide_path=str(slides / "CMU-1-Small-Region.svs"))
        write_coords(folder / f"{name}.h5", xy, np.ones(len(xy)), attrs)
    return folder


@pytest.fixture(scope="module")
def workdir(shared_slides, tmp_path_factory):
    """Coords of three slides, a calibration file holding out one whole slide, a plan."""
    root = tmp_path_factory.mktemp("scale")
    coords = _coords(shared_slides, root / "coords")
    assert main(["calibrate", "--coords", str(coords), "--out", str(root / "calib.h5"), "--n-tiles", "12",
                 "--holdout", "0.3", "--holdout-by", "slide", "--patch-size", "56"]) == 0
    (root / "plan.json").write_text(json.dumps({"blocks": [[1, 6], [7, 12]]}))
    return root


def _calib():
    from pathtwt.compress.calibration import CalibrationSet

    empty = np.zeros((0, 56, 56, 3), np.uint8)
    return CalibrationSet(fit=empty, select=empty, report=empty, patch_size=56)


def test_held_out_slides_never_reach_training(workdir):
    import dataclasses

    calib = _calib()
    attached = with_streamed_training(calib, [workdir / "calib.h5"], [workdir / "coords"])
    streamed = attached.training
    assert calib.training is None and attached.training_tiles() is streamed  # the loaded set stays as it was
    with pytest.raises(dataclasses.FrozenInstanceError):
        attached.training = None
    with h5py.File(workdir / "calib.h5", "r") as h5:
        sources = [Path(s.decode() if isinstance(s, bytes) else s).stem for s in h5["sources"][()]]
        split, index, origins = h5["split"][()], h5["source_index"][()], h5["origins"][()]
    held = {(sources[i], int(x), int(y)) for i, (x, y), s in zip(index, origins, split) if s != 0}
    assert held and len({h[0] for h in held}) == 1  # one whole slide held out
    assert streamed.describe()["excluded_slides"] == sorted({h[0] for h in held})
    trained = set()
    for i in range(len(streamed)):
        s, x, y = streamed.locate(i)
        trained.add((Path(streamed.entries[s].coords_file).stem, x, y))
    assert len(trained) == len(streamed) == 12  # the two other slides, every tile
    assert not trained & held
    assert not {t[0] for t in trained} & {h[0] for h in held}


def test_streaming_needs_calibration_files(workdir):
    with pytest.raises(ConfigError, match="needs --calibration calibration files"):
        with_streamed_training(_calib(), [workdir / "coords"], [workdir / "coords"])


@pytest.mark.parametrize("world", [1, 2])
def test_a_streamed_epoch_reads_every_training_tile_once(workdir, world):
    import pathtwt.models.registry as registry

    source = SlideTiles(sorted((workdir / "coords").glob("*.h5")))
    n = len(source)
    transform = registry.create_backbone("vit-s14-tiny", pretrained=False).transform
    items = TrainingItems(source, transform, augment=True, seed=4)
    order = EpochOrder(n, seed=4)
    batch = 6
    seen, tensors = [], {}
    for rank in range(world):
        sampler = MicroBatches(order, Sharding(batch, world, rank), 0, 2 * n // batch)  # two epochs
        with cv2_pool_stopped():
            batches = list(loader(items, sampler, workers=1, pin_memory=False))
        for pos, idx, tiles, errors in batches:
            assert not any(errors) and tiles.dtype == torch.uint8 and tiles.shape[1:] == (3, 56, 56)
            x = items.to_model_input(pos, tiles, "cpu")  # augmented by position, normalised
            seen += idx.tolist()
            for i, t in zip(idx.tolist(), x):
                tensors.setdefault(i, []).append(t)
    assert len(seen) == 2 * n
    assert sorted(seen) == sorted(2 * list(range(n)))  # each tile once per epoch, across ranks
    # the tile at each position is read and augmented the same, whichever rank draws it
    positions = [p for m in range(2 * n // batch) for p in Sharding(batch).positions(m)]
    assert [int(order.tiles(p, 1)[0]) for p in positions[:n]] == order.permutation(0).tolist()
    assert any(not torch.equal(a, b) for a, b in (v for v in tensors.values()))  # two epochs, two augmentations


def test_batch_not_divisible_by_ranks_is_one_clear_error():
    with pytest.raises(ConfigError, match="--batch-size 5 is not divisible by the 2 ranks"):
        Sharding(5, 2, 0)


def test_checkpoint_with_a_pickled_object_is_refused(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.save({"format": CHECKPOINT_FORMAT, "step": 1, "history": [], "sampler": {"position": 4},
                "evil": Path("/etc/passwd")}, path)  # any non-plain object is a pickled class
    with pytest.raises(PathtwtError) as info:
        load_checkpoint(path)
    assert "refused" in str(info.value) and "\n" not in str(info.value)
    torch.save({"format": CHECKPOINT_FORMAT, "step": 1, "rng": torch.zeros(3), "sampler": {"position": 4}}, path)
    assert load_checkpoint(path)["step"] == 1  # tensors and plain values load


# ---- data parallel, end to end through the CLI ----------------------------------------

STEPS = 40


def _compress_cmd(workdir: Path, out: Path, ranks: int, workers: int) -> list[str]:
    launcher = [str(TORCHRUN), "--standalone", f"--nproc-per-node={ranks}", "-m", "pathtwt"] if ranks > 1 else [
        sys.executable, "-m", "pathtwt"]
    return [*launcher, "compress", "--backbone", "vit-s14-tiny", "--random-init", "--calibration", str(workdir / "calib.h5"),
            "--plan", str(workdir / "plan.json"), "--train-coords", str(workdir / "coords"), "--steps", str(STEPS),
            "--batch-size", "4", "--accumulate", "2", "--audition-steps", "0", "--device", "cpu", "--precision", "fp32",
            "--workers", str(workers), "--checkpoint-every", "3", "--no-progress", "--out", str(out)]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _run(cmd: list[str]) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return res.stdout


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def reference_runs(workdir):
    one, two = workdir / "one", workdir / "two"
    out = _run(_compress_cmd(workdir, one, 1, workers=1))
    assert f"{STEPS} optimiser steps of 8 tiles (4 x 2 accumulated, 1 rank(s) x 4)" in out
    out = _run(_compress_cmd(workdir, two, 2, workers=0))
    assert "2 rank(s) x 2" in out and out.count("vit-s14-tiny/twt-2") == 1  # rank 0 alone reports
    return one, two


def test_two_gloo_ranks_match_one_process(reference_runs):
    one, two = reference_runs
    a, b = _weights(one), _weights(two)
    assert _max_diff(a, b) <= RANKS_ATOL
    meta = json.loads((one / "model.json").read_text())
    assert meta["distillation"]["steps"] == STEPS
    assert meta["fidelity"]["final"] != meta["fidelity"]["initial"]  # it trained
    training = meta["distillation"]["training"]
    assert training["tiles"] == 12 and training["slides"] == 2 and len(training["excluded_slides"]) == 1
    assert not (one / "checkpoint.pt").exists() and not (two / "checkpoint.pt").exists()


def test_sigkilled_two_rank_run_resumes_with_two_or_one_ranks(workdir, reference_runs):
    one, two = reference_runs
    killed = workdir / "killed"
    proc = subprocess.Popen(_compress_cmd(workdir, killed, 2, workers=0), env=_env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = killed / "checkpoint.pt"
    try:
        end = time.monotonic() + 240
        while not ckpt.exists() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        # torchrun starts each rank in its own session: kill the ranks and torchrun at once
        for pid in [*_descendants(proc.pid), proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    assert ckpt.exists() and not (killed / "model.safetensors").exists(), "the run ended before it could be killed"
    state = load_checkpoint(ckpt)
    step = int(state["step"])
    assert 0 < step < STEPS and state["sampler"]["position"] == step * 8
    saved = ckpt.read_bytes()

    _run(_compress_cmd(workdir, killed, 2, workers=0))  # resumed with 2 ranks
    assert _max_diff(_weights(killed), _weights(two)) <= 1e-6
    meta = json.loads((killed / "model.json").read_text())
    assert meta["distillation"]["resumed_from"] == step

    again = workdir / "again"
    again.mkdir()
    (again / "checkpoint.pt").write_bytes(saved)
    _run(_compress_cmd(workdir, again, 1, workers=1))  # the same checkpoint resumed by 1 process
    assert _max_diff(_weights(again), _weights(one)) <= RANKS_ATOL
    assert json.loads((again / "model.json").read_text())["distillation"]["resumed_from"] == step


def test_holdout_by_slide_holds_out_whole_slides_near_the_share():
    from pathtwt.compress.calibration import _split_by_source

    index = np.repeat([0, 1, 2], 8)
    for seed in range(5):
        split = _split_by_source(index, 0.3, np.random.default_rng(seed))
        held = set(index[split != 0].tolist())
        assert len(held) == 1 and all((split[index == s] != 0).all() for s in held)  # whole slides
        # one held-out slide: its tiles are shared out between select (1) and report (2)
        assert set(split[split != 0].tolist()) == {1, 2}
    split = _split_by_source(np.repeat([0, 1, 2, 3], 6), 0.5, np.random.default_rng(0))
    by_slide = {int(s): set(split[np.repeat([0, 1, 2, 3], 6) == s].tolist()) for s in range(4)}
    assert sorted(len(v) for v in by_slide.values()) == [1, 1, 1, 1]  # several: whole slides per part
    assert {next(iter(v)) for v in by_slide.values()} == {0, 1, 2}
    split = _split_by_source(np.repeat([0, 1], [3, 9]), 0.9, np.random.default_rng(0))
    assert 0 < (split != 0).sum() < len(split)  # never every slide
