"""The GPU paths of distillation, wired up on a CPU: the process group a GPU run joins and
the device its reductions run on (a mocked torch.cuda, spies on torch.distributed, two
real gloo ranks), torchrun ranks without a rendezvous address, slide handles in forked
reading workers (the real CMU SVS and a BACH JPEG), uint8 tiles augmented and normalised
on the training device, the reading workers a GPU job starts, and a GPU out-of-memory
error as one line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from pathtwt.compress import ranks

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def clean_ranks(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    yield
    monkeypatch.setattr(ranks, "_device", "cpu")


# ---- finding 1: the process group and the device of its reductions ----------------------

def test_a_gpu_rank_joins_plain_nccl_and_reduces_on_its_gpu(monkeypatch, clean_ranks):
    """Under torchrun on a 2-GPU node, rank 1 takes cuda:1 and joins plain ``nccl`` (no gloo
    half to connect: every collective of the run is on the rank's GPU), and its loop's
    reductions run on cuda:1, which NCCL serves."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29511")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    chosen, joined = [], []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: joined.append(backend))
    assert ranks.init_from_env("cuda") == "cuda:1"
    assert chosen == [1] and len(joined) == 1
    assert joined == ["nccl"]
    assert ranks.collective_device() == torch.device("cuda:1")


def test_a_cpu_rank_joins_gloo_and_reduces_on_the_cpu(monkeypatch, clean_ranks):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29512")
    joined = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: joined.append(backend))
    assert ranks.init_from_env("cpu") == "cpu" and joined == ["gloo"]
    assert ranks.collective_device() == torch.device("cpu")


def test_all_mean_hands_all_reduce_a_tensor_on_the_collective_device(monkeypatch, clean_ranks):
    """What distill's per-step and bf16-check reductions pass to all_reduce is a copy on
    :func:`ranks.collective_device` (cuda:LOCAL_RANK on a GPU run, above), whatever device
    the values were built on; the mean comes back on the caller's device."""
    seen = []

    def spy(tensor, *args, **kwargs):
        seen.append((tensor.device, tensor.dtype))
        tensor.mul_(2)  # two ranks holding the same values

    monkeypatch.setattr(ranks, "world_size", lambda: 2)
    monkeypatch.setattr(dist, "all_reduce", spy)
    values = torch.tensor([1.5, 3.0], dtype=torch.float64)
    out = ranks.all_mean(values)
    assert seen == [(ranks.collective_device(), torch.float64)]
    assert torch.equal(out, values) and out.device == values.device
    assert torch.equal(values, torch.tensor([1.5, 3.0], dtype=torch.float64))  # the caller's tensor untouched


RANK_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    from pathtwt.compress import ranks
    seen = []
    real = dist.all_reduce
    def spy(tensor, *a, **k):
        seen.append([str(tensor.device), str(dist.get_backend())])
        return real(tensor, *a, **k)
    dist.all_reduce = spy
    device = ranks.init_from_env("cpu")
    mean = ranks.all_mean(torch.tensor([float(ranks.rank()), 10.0], dtype=torch.float64))
    print(json.dumps({"rank": ranks.rank(), "device": device, "mean": mean.tolist(), "seen": seen}))
    ranks.shutdown()
""")


def test_two_gloo_ranks_average_through_all_mean(tmp_path):
    """Two real ranks (gloo, as a CPU run): the reduction reaches all_reduce on the CPU,
    served by gloo, and averages across the ranks."""
    from rank_faults import two_gloo_ranks

    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    import json

    results = []
    for code, out, err in two_gloo_ranks(script):
        assert code == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    for res in results:
        assert res["device"] == "cpu" and res["mean"] == [0.5, 10.0]
        assert res["seen"] == [["cpu", "gloo"]]


def test_ranks_without_a_rendezvous_address_stop_in_one_line(monkeypatch, clean_ranks, capsys):
    from pathtwt.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: pytest.fail("joined without an address"))
    code = main(["compress", "--backbone", "vit-s14-tiny", "--random-init", "--calibration", "none.h5",
                 "--depth", "2", "--out", "out", "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "\n" not in err
    assert "WORLD_SIZE=2" in err and "MASTER_ADDR and MASTER_PORT not set" in err and "torchrun" in err


# ---- finding 6: slide handles in forked reading workers ---------------------------------

def _cmu_coords(folder: Path, slides: Path) -> list[Path]:
    from pathtwt.io.h5 import write_coords

    out = []
    for name, (x0, y0) in {"cmu-a": (600, 900), "cmu-b": (1200, 1600)}.items():
        xy = np.array([[x0 + 112 * i, y0 + 112 * j] for i in range(4) for j in range(3)])
        attrs = dict(patch_size=64, patch_size_level0=128, target_mpp=1.0, level0_mpp=0.499, read_level=0,
                     level0_width=2220, level0_height=2967, target_magnification=10.0, status="ok",
                     slide_path=str(slides / "CMU-1-Small-Region.svs"))
        write_coords(folder / f"{name}.h5", xy, np.ones(len(xy)), attrs)
        out.append(folder / f"{name}.h5")
    return out


class _ReadWithHandles(torch.utils.data.Dataset):
    """A tile of ``source`` and the ids of the slide handles this process read it with."""

    def __init__(self, source):
        self.source = source

    def __len__(self):
        return len(self.source)

    def __getitem__(self, i):
        tile = self.source.read(i)
        return i, tile, {id(h) for h in self.source._open.values()}


def test_forked_workers_read_with_their_own_handles_the_same_pixels(shared_slides, tmp_path):
    """As in a streamed distillation: the main process reads the first tiles (loss
    normalisation, bf16 check) and keeps its handles open, then reading workers are forked.
    Each worker reads through handles it opened itself, and three workers return every
    tile's pixels exactly as one process reads them (real SVS and JPEG)."""
    from pathtwt.cli import main
    from pathtwt.compress.training_tiles import SlideTiles, cv2_pool_stopped

    bach = Path(shared_slides).parent / "bach" / "images" / "b005.jpeg"
    if not bach.exists():
        pytest.skip(f"real test data not available: {bach} is absent")
    files = _cmu_coords(tmp_path, Path(shared_slides))
    assert main(["tile", str(bach), "--out", str(tmp_path / "b005.h5"), "--tile-size", "64", "--slide-mpp", "0.42"]) == 0
    source = SlideTiles([*files, tmp_path / "b005.h5"])
    reference = [source.read(i).copy() for i in range(len(source))]  # one process, handles left open
    parent_handles = {id(h) for h in source._open.values()}
    assert len(parent_handles) == 3
    order = np.random.default_rng(0).permutation(len(source)).tolist()
    batches = torch.utils.data.DataLoader(_ReadWithHandles(source), batch_size=4, sampler=order, num_workers=3,
                                          multiprocessing_context="fork", collate_fn=list)
    seen = 0
    with cv2_pool_stopped():
        for batch in batches:
            for i, tile, handles in batch:
                assert not parent_handles & handles, "a worker read through its parent's handle"
                assert np.array_equal(tile, reference[i]), f"tile {i} differs from a single-process read"
                seen += 1
    assert seen == len(source)
    assert {id(h) for h in source._open.values()} == parent_handles  # the parent's handles untouched
    source.close()
    assert not source._open


# ---- finding 7: uint8 tiles, augmentation and normalisation on the device ---------------

@pytest.fixture(scope="module")
def transform():
    from pathtwt.models.transform import TileTransform

    return TileTransform(input_size=56, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def test_workers_hand_over_uint8_and_the_device_input_is_the_per_tile_transform(transform):
    """Without augmentation the batch normalised on the device equals the backbone's
    per-tile transform bit for bit (so runs without augmentation train on the same
    numbers as before); the workers' tiles are uint8, resized to the input size."""
    from pathtwt.compress.training_tiles import ArrayTiles, TrainingItems

    tiles = np.random.default_rng(1).integers(0, 256, size=(5, 64, 64, 3), dtype=np.uint8)
    items = TrainingItems(ArrayTiles(tiles), transform, augment=False, seed=0)
    got = [items[(p, i)] for p, i in enumerate([3, 0, 4])]
    assert all(t.dtype == torch.uint8 and t.shape == (3, 56, 56) and e == "" for _, _, t, e in got)
    x = items.to_model_input(torch.tensor([p for p, *_ in got]), torch.stack([t for _, _, t, _ in got]), "cpu")
    expected = torch.stack([transform(tiles[i]) for i in (3, 0, 4)])
    assert x.dtype == torch.float32 and torch.equal(x, expected)


def test_batch_augmentation_is_per_tile_and_seeded():
    """A tile's augmentation depends on its seed alone, not on the batch it is in (so not
    on the rank or the resumption), differs between seeds, and stays a bounded colour
    change of the tile."""
    from pathtwt.compress.augment import BatchAugmenter

    tiles = torch.from_numpy(np.random.default_rng(2).integers(30, 220, size=(6, 3, 32, 32), dtype=np.uint8))
    seeds = [11, 12, 13, 14, 15, 16]
    aug = BatchAugmenter()
    whole = aug(tiles, seeds)
    assert whole.dtype == torch.float32 and whole.shape == tiles.shape
    assert float(whole.min()) >= 0 and float(whole.max()) <= 255
    for k in (0, 3, 5):
        alone = aug(tiles[k : k + 1], seeds[k : k + 1])[0]
        assert torch.allclose(alone, whole[k], atol=1e-3), k
    assert torch.equal(aug(tiles, seeds), whole)
    again = aug(tiles, [s + 100 for s in seeds])
    assert not torch.allclose(again, whole)
    change = (whole - tiles.float()).abs().mean(dim=(1, 2, 3))
    assert bool((change > 0.5).all()) and bool((change < 60).all())
    draws = aug.draw(seeds)
    assert draws.blur.dtype == torch.bool and sorted(draws.order[0].tolist()) == [0, 1, 2, 3]


def test_the_distillation_loop_augments_the_batch_it_moved_to_the_device(monkeypatch):
    """distill hands the augmenter the uint8 batch after its move to the training device,
    with one seed per stream position."""
    from pathtwt.compress import augment
    from pathtwt.compress.distill import DeepSupervision, DistillOptions, distill
    from pathtwt.compress.student import clone_layers, stitch_student
    from pathtwt.models.registry import create_backbone

    calls = []
    real = augment.BatchAugmenter.__call__

    def spy(self, tiles, seeds):
        calls.append((tiles.dtype, tiles.device, len(seeds)))
        return real(self, tiles, seeds)

    monkeypatch.setattr(augment.BatchAugmenter, "__call__", spy)
    teacher = create_backbone("vit-s14-tiny", pretrained=False, init_seed=1, precision="fp32")
    student = stitch_student(teacher.model, clone_layers(teacher.model, [5, 11]), spec=teacher.spec)
    tiles = np.random.default_rng(0).integers(0, 256, size=(4, 56, 56, 3), dtype=np.uint8)
    run = distill(student, teacher.model, tiles, transform=teacher.transform, objective=DeepSupervision([6, 12]),
                  options=DistillOptions(steps=2, batch_size=2, augment=True, progress=False))
    assert run.completed and calls == [(torch.uint8, torch.device("cpu"), 2)] * 2


def test_reading_workers_come_from_the_jobs_cores(monkeypatch):
    from pathtwt.compress import training_tiles
    from pathtwt.devices import reading_workers as extraction_readers

    monkeypatch.setattr("pathtwt.devices.available_cores", lambda: 32)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert training_tiles.default_workers("cuda:0", streaming=True) == training_tiles.GPU_FEEDERS
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun, 4 GPUs of the node
    assert training_tiles.default_workers("cuda:1", streaming=True) == 7
    monkeypatch.setattr("pathtwt.devices.available_cores", lambda: 4)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert training_tiles.default_workers("cuda", streaming=True) == 3
    assert training_tiles.default_workers("cuda", streaming=False) == 0  # tiles in memory
    assert training_tiles.default_workers("cpu", streaming=True) == extraction_readers()  # CPU: as before


# ---- finding 10: a GPU out-of-memory error --------------------------------------------

OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB "
       "is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use.\nIf reserved but unallocated "
       "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


@pytest.mark.parametrize("command, argv, flags", [
    ("compress", ["--backbone", "vit-s14-tiny", "--calibration", "c.h5", "--out", "o"], ["--batch-size", "--accumulate"]),
    ("extract", ["--backbone", "vit-s14-tiny"], ["--batch-size"]),
    ("train-mil", ["--features", "f", "--labels", "l.csv", "--protocol", "grading", "--out", "o"], ["--max-instances"]),
])
def test_out_of_memory_is_one_line_naming_the_options_to_lower(monkeypatch, capsys, command, argv, flags):
    import importlib

    from pathtwt.cli import COMMANDS, main

    module = importlib.import_module(f"pathtwt.cli.{COMMANDS[command]}")

    def run(args):
        raise torch.cuda.OutOfMemoryError(OOM)

    monkeypatch.setattr(module, "run", run)
    assert main([command, *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"pathtwt {command}: error: the GPU ran out of memory")
    assert "Tried to allocate 2.00 GiB" in err and "Including non-PyTorch" not in err
    assert all(flag in err for flag in flags)


def test_other_runtime_errors_keep_their_traceback(monkeypatch):
    from pathtwt.cli import main

    monkeypatch.setattr("pathtwt.cli.extract.run", lambda args: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        main(["extract", "--backbone", "vit-s14-tiny"])


def test_each_gpu_rule_names_its_device_section_once():
    """GPU_RULE_DEVICES (common.smk) is the one place saying which config section's
    `device` a GPU rule runs on; the rules read it through get_rule_device, by their name."""
    import ast
    import re

    rules = REPO / "workflow" / "rules"
    common = (rules / "common.smk").read_text()
    table = ast.literal_eval(re.search(r"GPU_RULE_DEVICES = (\{.*?\n\})", common, re.S).group(1))
    text = "\n".join(p.read_text() for p in rules.glob("*.smk"))
    assert not re.search(r'config\["(compress|extract|mil)"\]\["device"\],', text)
    named = set(re.findall(r'device=get_rule_device\("(\w+)"\)', text))
    # the two analyses of the loop are named by an f-string
    named |= {"analyze_intrinsic_dim", "analyze_stability"} if 'get_rule_device(f"analyze_' in text else set()
    # train_mil_fold is `use rule train_mil`: it inherits the params
    assert named | {"train_mil_fold"} == set(table)
