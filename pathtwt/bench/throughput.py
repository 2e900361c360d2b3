"""Throughput measurements of the data path and the model on this machine: the model alone
on tiles already on the device, each JPEG decoder alone, the readers alone (extraction with
a model that costs nothing), and extraction end to end, each in steady state; and peak
memory. ``pathtwt bench`` and benchmarks/device_check.py both measure with these."""

from __future__ import annotations

import resource
from pathlib import Path
from typing import Any, Callable

import numpy as np

GiB = 2**30
NOT_RECORDED = "not recorded"
# the model of the readers-alone rate: a 1-layer, 32-wide ViT, whose forward costs next to nothing
NEAR_FREE_BACKBONE = "vit-s14-tiny"


def synchronizer(device: str) -> Callable[[], None]:
    """What waits for the device's queued work before a clock is read."""
    import torch

    if str(device).startswith("cuda"):
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def reset_peak_memory(device: str) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: str) -> float:
    """The GPU's peak allocation since :func:`reset_peak_memory`
    (``torch.cuda.max_memory_allocated``); on a CPU the process's peak RSS so far."""
    import torch

    if str(device).startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / GiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def model_only_rate(backbone, batch: int, min_time_s: float, *, bf16_autocast: bool | None = None,
                    **timing: Any) -> float:
    """tiles/s of normalising uint8 tiles already on the device and embedding them
    (:func:`pathtwt.models.embedding.embed_tiles`), in the precision extraction runs the
    backbone in: its weights' dtype, under bf16 autocast with the weights cast once when
    ``bf16_autocast`` (default: the backbone's own)."""
    import torch

    from pathtwt.bench.timing import seconds_per_call
    from pathtwt.models.bf16_guard import AutoPrecision
    from pathtwt.models.embedding import embed_tiles

    device = backbone.device
    autocast = backbone.bf16_autocast if bf16_autocast is None else bf16_autocast
    size = backbone.spec.input_size
    x = torch.randint(0, 256, (batch, size, size, 3), dtype=torch.uint8, device=device)
    prefix = backbone.spec.num_prefix_tokens
    with torch.inference_mode(), AutoPrecision(bf16=autocast).job_context(device, backbone.model):
        return batch / seconds_per_call(
            lambda: embed_tiles(backbone.model, backbone.transform.normalise_batch(x, device), prefix), min_time_s,
            sync=synchronizer(device), **timing)


def decode_record(paths: list[Path]) -> dict[str, Any]:
    """What the features files ``paths`` record of where their native tiles were decoded
    (per-slide attrs ``natives_decoded_device``, ``natives_decoded_host``, ``decode_fallback``)
    and of the precision that ran, summed over the files; "not recorded" where absent."""
    import h5py

    device = host = 0
    recorded = bool(paths)
    fallbacks, precisions = [], []
    for path in paths:
        with h5py.File(path, "r") as h5:
            attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in h5.attrs.items()}
        if "natives_decoded_device" in attrs and "natives_decoded_host" in attrs:
            device += int(attrs["natives_decoded_device"])
            host += int(attrs["natives_decoded_host"])
        else:
            recorded = False
        if str(attrs.get("decode_fallback", "")):
            fallbacks.append(f"{path.stem}: {attrs['decode_fallback']}")
        precisions.append(str(attrs.get("precision", NOT_RECORDED)))
    return {"natives_device": device if recorded else NOT_RECORDED, "natives_host": host if recorded else NOT_RECORDED,
            "fallback": "; ".join(fallbacks) if recorded or fallbacks else NOT_RECORDED,
            "precision": ", ".join(sorted(set(precisions))) or NOT_RECORDED}


def extraction_rate(backbone, slide: Path, coords: Path, folder: Path, *, small: int = 1, large: int = 3,
                    warmup: bool = True, **options: Any) -> tuple[float, dict[str, Any]]:
    """Steady-state tiles/s of pathtwt's extraction (``extract_many`` with ``options``: the
    batch size, readers, decode as a job gets them): a job of ``large`` copies of the slide
    less a job of ``small`` (the readers' start, the first batches and the last writes
    cancel; :func:`pathtwt.bench.timing.steady_state`), and what the large job's features
    files record (:func:`decode_record`)."""
    from pathtwt.bench.timing import steady_state
    from pathtwt.features.extract import extract_many
    from pathtwt.features.jobs import ExtractJob
    from pathtwt.io.h5 import count_coords

    n = count_coords(coords)
    options = {"progress": False, **options}

    def job(count: int) -> dict[str, Any]:
        jobs = [ExtractJob(slide, coords, folder / f".bench-{slide.stem}-{count}-{i}.h5") for i in range(count)]
        try:
            extract_many(jobs, backbone, **options)
            return decode_record([j.out for j in jobs])
        finally:
            for j in jobs:
                j.out.unlink(missing_ok=True)

    steady = steady_state(job, small, large, warmup=warmup, sync=synchronizer(backbone.device))
    return steady.rate(n), steady.large_result


def near_free_backbone(device: str):
    """The readers-alone rate's model: :data:`NEAR_FREE_BACKBONE`, random weights, fp32."""
    from pathtwt.models.registry import create_backbone

    return create_backbone(NEAR_FREE_BACKBONE, pretrained=False, device=device, precision="fp32")


def decoder_rates(slide: Path, device: str, on_gpu: bool, min_time_s: float = 0.0) -> list[dict[str, Any]]:
    """Native tiles/s of each JPEG decoder alone over every native tile of ``slide``'s
    level 0 (complete JPEG streams, batches of 256): the GPU decoders installed here
    (``on_gpu``; one that cannot decode on this GPU is a row saying why) or, on a CPU, the
    host decoder the device path falls back to; then libjpeg-turbo on one core (tifffile).
    Each row: name, tiles_per_s (None when it cannot run), note, and the decoder's facts."""
    import time

    import tifffile

    from pathtwt.bench.timing import seconds_per_call
    from pathtwt.features.gpu_decoders import GpuDecoderUnavailable, decoder_names, make_decoder
    from pathtwt.wsi.jpeg_streams import tile_streams
    from pathtwt.wsi.native_tiles import decode_native_tiles

    rows: list[dict[str, Any]] = []
    with tifffile.TiffFile(slide) as tif:
        page = tif.pages[0]
        indices = list(range(len(page.dataoffsets)))
        streams = tile_streams(page, indices)
        for name in decoder_names(on_gpu=on_gpu):
            row: dict[str, Any] = {"name": name, "tiles_per_s": None, "note": "", "facts": {}}
            try:
                decoder = make_decoder(name, device)
                refused: list[bool] = []

                def all_streams() -> None:
                    refused.clear()
                    for i in range(0, len(streams), 256):
                        refused.extend(t is None for t in decoder(streams[i:i + 256]))

                row["tiles_per_s"] = len(streams) / seconds_per_call(all_streams, min_time_s,
                                                                     sync=synchronizer(device))
                row["facts"] = {"refused": sum(refused), "upsampling": decoder.reference.__name__,
                                "decodes_rgb": decoder.decodes_rgb}
                row["note"] = f"{len(streams)} native tiles of {page.tilewidth} px, {sum(refused)} refused; {decoder!r}"
            except GpuDecoderUnavailable as exc:
                row["note"] = f"unavailable: {exc}"
            rows.append(row)
        began = time.perf_counter()
        decode_native_tiles(page, indices)
        rows.append({"name": "libjpeg-turbo, one core", "tiles_per_s": len(indices) / (time.perf_counter() - began),
                     "note": f"{len(indices)} native tiles of {page.tilewidth} px", "facts": {}})
    return rows


def first_tiles(coords: Path, out: Path, n: int) -> Path:
    """A coordinates file of the first ``n`` tiles of ``coords`` (all of them if fewer)."""
    from pathtwt.io.h5 import read_coords, write_coords

    xy, tissue, attrs = read_coords(coords)
    write_coords(out, np.asarray(xy[:n]), np.asarray(tissue[:n]), attrs)
    return out
