"""Every call into a GPU library, checked on a CPU against the real library.

nvImageCodec's wheel (the test extra installs nvidia-nvimgcodec-cu13 without its nvJPEG
extension) imports without a GPU: its parameters are built by the same functions the
decoder uses, and the whole decoder (its Decoder keywords, CodeStream, DecodeParams,
decode(images=..., params=..., cuda_stream=...), the Images turned into tensors, their
buffers reused) runs on the library's CPU backend, against libjpeg. On this machine the
library refuses a decoder made of its GPU backends, which is how a GPU machine without
the nvJPEG extension is recognised. torchvision's decode_jpeg runs on the CPU with every
warning an error; torch's cudart binding is read for the calls the ring pin makes. A
decoder checks itself when it is made: stand-in decoders show what it concludes. How a
new decoder's calls are checked this way: docs/development.md."""

from __future__ import annotations

import logging
import os
import re
import sys
import tomllib
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from pathtwt.errors import PathtwtError
from pathtwt.features import gpu_decoders, jpeg_reference
from pathtwt.features.gpu_decoders import BatchDecoder, GpuDecoderUnavailable

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def nvimgcodec():
    try:
        from nvidia import nvimgcodec
    except ImportError:
        pytest.skip("the nvImageCodec wheel is not installed: pip install -e '.[test]' installs it")
    return nvimgcodec


@pytest.fixture(scope="module")
def streams(request):
    """Complete JPEG streams: 6 Aperio RGB tiles of the real SVS (Adobe marker added, as
    the device path ships them), two YCbCr 4:2:0 BACH images, the two test JPEGs."""
    import tifffile

    from conftest import SHARED_BACH, SHARED_SLIDES
    from pathtwt.wsi.jpeg_streams import tile_streams

    svs = SHARED_SLIDES / "CMU-1-Small-Region.svs"
    if not svs.is_file() or not SHARED_BACH.is_dir():
        pytest.skip(f"real test data not available: {svs} or {SHARED_BACH} is absent")
    with tifffile.TiffFile(svs) as tif:
        tiles = tile_streams(tif.pages[0], [0, 17, 40, 63, 90, 129])
    bach = [p.read_bytes() for p in sorted(SHARED_BACH.glob("*.jpeg"))[:2]]
    return {"svs": tiles, "bach": bach, "probes": list(jpeg_reference.probes())}


def _cpu_nvimgcodec(nvimgcodec, **kw):
    """The decoder nvImageCodec gives on a GPU, made with its CPU backend instead."""
    return gpu_decoders._nvimgcodec(torch.device("cpu"), device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY,
                                    backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)], **kw)


# ---- nvImageCodec --------------------------------------------------------------------

def test_the_decode_parameters_and_backends_bind_to_the_real_library(nvimgcodec):
    params = gpu_decoders.nvimgcodec_params(nvimgcodec)
    assert isinstance(params, nvimgcodec.DecodeParams)
    assert params.color_spec == nvimgcodec.ColorSpec.SRGB  # ColorSpec.RGB went in 0.7
    assert params.sample_format == nvimgcodec.SampleFormat.I_RGB  # interleaved (h, w, 3)
    assert params.allow_any_depth is False and params.apply_exif_orientation is False
    backends = gpu_decoders.nvimgcodec_backends(nvimgcodec)
    kinds = nvimgcodec.BackendKind
    assert [b.backend_kind for b in backends] == [kinds.HW_GPU_ONLY, kinds.GPU_ONLY, kinds.HYBRID_CPU_GPU]
    assert kinds.CPU_ONLY not in {b.backend_kind for b in backends}  # never its CPU decoders
    # the keywords the decoder passes, as the library declares them
    declared = nvimgcodec.Decoder.__init__.__doc__
    for keyword in ("device_id", "max_num_cpu_threads", "backends", "options"):
        assert re.search(rf"\b{keyword}: ", declared), keyword
    batch = next(line for line in nvimgcodec.Decoder.decode.__doc__.splitlines() if "srcs:" in line)
    for keyword in ("images", "params", "cuda_stream"):
        assert f" {keyword}: " in batch.split("*", 1)[1], keyword  # keyword-only, after *
    assert nvimgcodec.__version__.startswith(gpu_decoders.NVIMGCODEC_SERIES + ".")


def test_the_whole_decoder_runs_on_the_real_librarys_cpu_backend(nvimgcodec, streams):
    """The decoder's calls on the library's libjpeg-turbo backend: told to upsample
    fancily, it gives libjpeg's own pixels for RGB (Adobe) and 4:2:0 streams, so the
    check picks the fancy reference and finds RGB JPEGs decoded as RGB; the second batch
    decodes into the first batch's Images, and the tensors handed out are the caller's."""
    decoder = _cpu_nvimgcodec(nvimgcodec)
    assert decoder.name == "nvimgcodec" and not decoder.is_host
    assert decoder.reference is jpeg_reference.fancy and decoder.decodes_rgb
    assert decoder.tolerance == jpeg_reference.TOLERANCE
    batch = streams["svs"] + streams["bach"][:1]
    first = decoder(batch)
    pooled = [id(image) for image in decoder_pool(decoder)]
    second = decoder(list(reversed(batch)))
    assert [id(image) for image in decoder_pool(decoder)] == pooled  # the same Images, decoded into again
    for s, a, b in zip(batch, first, reversed(second)):
        reference = jpeg_reference.fancy(s)
        assert a.dtype == torch.uint8 and a.shape == reference.shape
        assert np.array_equal(a.numpy(), reference) and np.array_equal(b.numpy(), reference)
    # decoded straight into the caller's rows (the batch's stack): libjpeg's pixels there too
    rows = torch.zeros((len(streams["svs"]), 240, 240, 3), dtype=torch.uint8)
    assert decoder.into(streams["svs"], rows) == [True] * len(streams["svs"])
    assert all(np.array_equal(r.numpy(), jpeg_reference.fancy(s)) for r, s in zip(rows, streams["svs"]))
    decoder.release()  # a job ends: the Images kept for its streams go
    assert decoder._decode.pools == {}
    # without the option its CPU backend upsamples plainly: the option is what reaches it
    plain = _cpu_nvimgcodec_with(nvimgcodec, ":fancy_upsampling=0")
    assert plain.reference is jpeg_reference.plain
    assert np.array_equal(plain(streams["bach"][1:])[0].numpy(), jpeg_reference.plain(streams["bach"][1]))


def decoder_pool(decoder: BatchDecoder) -> list:
    return decoder._decode.pools[0]  # a CPU's one "stream"


def _cpu_nvimgcodec_with(nvimgcodec, options):
    original = gpu_decoders.NVIMGCODEC_OPTIONS
    gpu_decoders.NVIMGCODEC_OPTIONS = options
    try:
        return _cpu_nvimgcodec(nvimgcodec)
    finally:
        gpu_decoders.NVIMGCODEC_OPTIONS = original


def test_without_a_gpu_backend_the_real_library_is_one_line_naming_the_install(nvimgcodec):
    """Its GPU backends only, where none loads (here: no nvJPEG extension, no GPU): the
    library makes no decoder, and that is said in one line with the pip command."""
    with pytest.raises(GpuDecoderUnavailable) as err:
        gpu_decoders._nvimgcodec(torch.device("cpu"), device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"nvImageCodec {nvimgcodec.__version__} decodes no JPEG on the GPU")
    assert "nvJPEG extension" in line and "pip install 'nvidia-nvimgcodec-cu13[nvjpeg]>=0.9,<0.10'" in line


def _stand_in_nvimgcodec(cuda_version: int):
    """An nvImageCodec whose GPU decoder is made but decodes nothing (a wheel whose nvJPEG
    extension fails to load on a GPU machine: its decode gives None per stream)."""

    class Decoder:
        def __init__(self, device_id=-1, max_num_cpu_threads=0, backends=None, options=""):
            pass

        def decode(self, srcs, *, images=None, params=None, cuda_stream=0):
            return [None] * len(srcs)

    real = sys.modules.get("nvidia.nvimgcodec")
    module = types.SimpleNamespace(Decoder=Decoder, CodeStream=lambda a: a, __version__="0.9.0",
                                   __cuda_version__=cuda_version)
    for name in ("DecodeParams", "ColorSpec", "SampleFormat", "Backend", "BackendKind"):
        setattr(module, name, getattr(real, name) if real else (lambda *a, **k: None))
    return module


@pytest.mark.parametrize("cuda_version, extra", [(12080, "cu12"), (13030, "cu13")])
def test_a_library_that_decodes_nothing_on_the_gpu_is_passed_over_by_auto(monkeypatch, caplog, cuda_version, extra,
                                                                          nvimgcodec):
    import nvidia

    from pathtwt.features import decoding

    monkeypatch.setattr(nvidia, "nvimgcodec", _stand_in_nvimgcodec(cuda_version))
    with pytest.raises(GpuDecoderUnavailable, match=rf"nvidia-nvimgcodec-{extra}\[nvjpeg\]"):
        gpu_decoders._nvimgcodec(torch.device("cpu"), device_id=0)
    # --decode auto on a CUDA machine: one warning, then the next decoder of the table
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.version.hip", None)
    table = dict(gpu_decoders.GPU_DECODERS)
    table["nvimgcodec"] = gpu_decoders.Entry(lambda: True, lambda d: gpu_decoders._nvimgcodec(d, device_id=0), True)
    table["torchvision"] = gpu_decoders.Entry(lambda: True, lambda d: gpu_decoders.make_decoder("host", d), True)
    monkeypatch.setattr(gpu_decoders, "GPU_DECODERS", table)
    monkeypatch.setattr(gpu_decoders, "_USABLE", {})
    with caplog.at_level(logging.WARNING, logger="pathtwt.features.gpu_decoders"):
        assert decoding.resolve_decode("auto", "cuda:0") == decoding.Decoding("gpu", "torchvision")
        assert decoding.resolve_decode("gpu", "cuda:0") == decoding.Decoding("gpu", "torchvision")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "\n" not in lines[0], lines  # said once per process, not per resolve
    assert f"nvidia-nvimgcodec-{extra}[nvjpeg]" in lines[0] and "next decoder" in lines[0]


def test_each_decoder_is_made_once_per_device_and_the_jobs_use_the_one_resolving_made(monkeypatch):
    """Resolving --decode makes (and so checks) the decoder; the jobs on that device use
    that decoder, not a second one; one that cannot decode is tried once and says so again."""
    from pathtwt.features import decoding

    made = []

    def counted(device):
        made.append(str(device))
        return gpu_decoders._host(device)

    def unavailable(device):
        made.append("unavailable")
        raise GpuDecoderUnavailable("stand-in decodes no JPEG here; pip install stand-in")

    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.version.hip", None)
    monkeypatch.setattr(gpu_decoders, "GPU_DECODERS", {"unavailable": gpu_decoders.Entry(lambda: True, unavailable, True),
                                                      "counted": gpu_decoders.Entry(lambda: True, counted, True)})
    monkeypatch.setattr(gpu_decoders, "_USABLE", {})
    assert decoding.resolve_decode("auto", "cuda:0") == decoding.Decoding("gpu", "counted")
    decoder = gpu_decoders.shared_decoder("counted", "cuda:0")
    assert gpu_decoders.shared_decoder("counted", "cuda:0") is decoder
    assert decoding.resolve_decode("gpu", "cuda:0") == decoding.Decoding("gpu", "counted")
    assert made == ["unavailable", "cuda:0"]
    with pytest.raises(GpuDecoderUnavailable, match=r"^stand-in decodes no JPEG here; pip install stand-in$"):
        gpu_decoders.shared_decoder("unavailable", "cuda:0")
    assert gpu_decoders.shared_decoder("counted", "cuda:1") is not decoder
    assert made == ["unavailable", "cuda:0", "cuda:1"]


# ---- torchvision ---------------------------------------------------------------------

def test_torchvision_decode_jpeg_binds_and_its_deprecation_is_filtered(streams):
    import inspect

    from torchvision.io import ImageReadMode, decode_jpeg

    assert {"input", "mode", "device"} <= set(inspect.signature(decode_jpeg).parameters)
    assert ImageReadMode.RGB
    floor = next(r for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
                 if r.startswith("torchvision"))
    assert floor == "torchvision>=0.19"  # a list of streams on the GPU
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its own DeprecationWarning (0.29) would stop the decode
        decoder = gpu_decoders.make_decoder("torchvision", "cpu")
        tiles = decoder(streams["svs"][:2] + streams["bach"][:1] + [b"\xff\xd8 not a jpeg"])
    assert tiles[-1] is None  # a bad stream is refused alone, the others decoded
    for s, t in zip(streams["svs"][:2] + streams["bach"][:1], tiles):
        assert np.array_equal(t.numpy(), jpeg_reference.fancy(s))  # on the CPU: libjpeg itself
    assert decoder.reference is jpeg_reference.fancy and decoder.decodes_rgb


def test_the_extras_pin_the_series_the_calls_are_checked_against():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pin = gpu_decoders.NVIMGCODEC_PIN
    assert extras["gpu"][0] == f"nvidia-nvimgcodec-cu13[nvjpeg]{pin}"  # CUDA 13, with its GPU backend
    assert extras["gpu-cu12"][0] == f"nvidia-nvimgcodec-cu12[nvjpeg]{pin}"
    assert f"nvidia-nvimgcodec-cu13{pin}" in extras["test"]  # the binding tests' wheel, without nvJPEG


def test_one_nvjpeg_build_across_the_extras_the_workflow_envs_and_the_smoke_run():
    """nvImageCodec's nvjpeg extra names nvJPEG without a version, which would resolve to
    the newest build: each extra pins the nvJPEG its CUDA environment carries, and the
    smoke run carries the CUDA 13 extra's (its lock), so every install decodes alike."""
    import json

    import yaml
    from packaging.requirements import Requirement

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, env, name in (("gpu", "pathtwt", "nvidia-nvjpeg"), ("gpu-cu12", "pathtwt-cu12", "nvidia-nvjpeg-cu12")):
        (pin,) = [Requirement(r) for r in extras[extra] if Requirement(r).name == name]
        (exact,) = pin.specifier
        assert exact.operator == "==", pin  # one build, not a range
        pip = next(d["pip"] for d in yaml.safe_load((REPO / "workflow" / "envs" / f"{env}.yaml").read_text())
                   ["dependencies"] if isinstance(d, dict))
        carried = [p.split("==", 1)[1] for p in pip if p.split("==", 1)[0] == name]
        assert carried == [exact.version], (env, carried, str(pin))
        if extra == "gpu":
            lock = json.loads((REPO / "benchmarks" / "gpu_smoke_wheels.json").read_text())["wheels"]
            assert [w["version"] for w in lock if w["name"] == name] == [exact.version]


def test_a_torchvision_too_old_for_a_list_of_streams_is_one_line(monkeypatch):
    import torchvision

    monkeypatch.setattr(torchvision, "__version__", "0.18.1+cu121")
    with pytest.raises(GpuDecoderUnavailable, match=r"^torchvision 0\.18\.1\+cu121 decodes one JPEG per call .*"
                                                    r"pip install 'torchvision>=0\.19'$"):
        gpu_decoders.make_decoder("torchvision", "cpu")


# ---- torch's cudart binding and the ring pin ----------------------------------------

def _arity(doc: str) -> int:
    return len(re.findall(r"arg\d+:", doc.split("->")[0]))


def test_the_cudart_calls_of_the_ring_pin_bind():
    cudart = torch._C._cudart  # what torch.cuda.cudart() returns once CUDA is initialised
    assert _arity(cudart.cudaHostRegister.__doc__) == 3 and _arity(cudart.cudaHostUnregister.__doc__) == 1
    assert cudart.cudaGetErrorString(cudart.cudaError(2)) == "out of memory"  # a code the enum does not list
    if torch.version.cuda is None:
        pytest.skip("a CPU build of torch loads no CUDA runtime")
    from pathtwt.features import cuda_runtime

    # torch's runtime is loaded under its own name; cudaGetLastError is reached through it
    assert re.fullmatch(r"libcudart\.so\.\d+", Path(cuda_runtime.loaded_runtime()).name)
    assert isinstance(cuda_runtime.clear_last_error("test"), int)


def test_the_memory_pool_keeps_its_memory_through_the_runtime_torch_loaded():
    """nvImageCodec allocates from the device's default stream-ordered pool: its release
    threshold is raised to keep freed memory across batches. The two runtime calls resolve
    in the libcudart torch loaded, and are made with the pool of the job's device, the
    release-threshold attribute and an all-ones uint64."""
    import ctypes

    from pathtwt.features import cuda_runtime

    if torch.version.cuda is None:
        pytest.skip("a CPU build of torch loads no CUDA runtime")
    loaded = ctypes.CDLL(cuda_runtime.loaded_runtime(), mode=os.RTLD_NOLOAD)
    assert loaded.cudaDeviceGetDefaultMemPool and loaded.cudaMemPoolSetAttribute  # AttributeError if absent
    calls = []

    class Runtime:
        def cudaDeviceGetDefaultMemPool(self, pool, device):
            ctypes.cast(pool, ctypes.POINTER(ctypes.c_void_p))[0] = 0x1234
            calls.append(("pool", device))
            return 0

        def cudaMemPoolSetAttribute(self, pool, attr, value):
            calls.append(("set", pool.value, attr, ctypes.cast(value, ctypes.POINTER(ctypes.c_uint64))[0]))
            return 0

        def cudaGetLastError(self):
            pytest.fail("nothing failed")

    assert cuda_runtime.keep_pool_memory(3, Runtime()) == 0
    assert calls == [("pool", 3), ("set", 0x1234, 4, 2**64 - 1)]


def test_the_memory_pool_is_trimmed_through_the_runtime_torch_loaded():
    """After an out-of-memory error the decoder's pool gives back what it keeps: the
    runtime's cudaMemPoolTrimTo, with the pool of the job's device and 0 bytes to keep (a
    size_t); a failure is cleared and costs only memory."""
    import ctypes

    from pathtwt.features import cuda_runtime

    if torch.version.cuda is None:
        pytest.skip("a CPU build of torch loads no CUDA runtime")
    loaded = ctypes.CDLL(cuda_runtime.loaded_runtime(), mode=os.RTLD_NOLOAD)
    assert loaded.cudaMemPoolTrimTo  # AttributeError if absent
    calls = []

    class Runtime:
        def __init__(self, status):
            self.status = status

        def cudaDeviceGetDefaultMemPool(self, pool, device):
            ctypes.cast(pool, ctypes.POINTER(ctypes.c_void_p))[0] = 0x1234
            calls.append(("pool", device))
            return 0

        def cudaMemPoolTrimTo(self, pool, keep):
            assert isinstance(keep, ctypes.c_size_t)
            calls.append(("trim", pool.value, keep.value))
            return self.status

        def cudaGetLastError(self):
            calls.append("cleared")
            return self.status

    assert cuda_runtime.trim_pool(1, Runtime(0)) == 0
    assert calls == [("pool", 1), ("trim", 0x1234, 0)]
    calls.clear()
    assert cuda_runtime.trim_pool(1, Runtime(2)) == 2 and calls[-1] == "cleared"


def test_nvimgcodec_images_are_reused_only_on_the_stream_they_were_made_on(monkeypatch):
    """nvImageCodec's DeviceBuffer::resize synchronises the stream a reused Image was made
    on when a call runs on another (src/imgproc/device_buffer.cpp): Images are kept per
    stream, never from torch's default stream (the forward passes'), and dropped when a job
    ends; a step down also gives the device pool's memory back, after synchronising."""
    from pathtwt.features import cuda_runtime

    class Stream:
        def __init__(self, handle):
            self.cuda_stream = handle

        def __eq__(self, other):
            return self.cuda_stream == other.cuda_stream

    current = [Stream(0)]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[0])
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: Stream(0))
    monkeypatch.setattr(gpu_decoders, "_tensor", lambda image, device: torch.zeros((2, 2, 3), dtype=torch.uint8))
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("sync"))
    monkeypatch.setattr(cuda_runtime, "trim_pool", lambda index, runtime=None: events.append(("trim", index)) or 0)
    seen = []

    class Library:
        CodeStream = staticmethod(lambda data: data)

    class Decoder:
        def decode(self, sources, images=None, params=None, cuda_stream=0):
            seen.append((cuda_stream, None if images is None else [id(i) for i in images]))
            return [object() for _ in sources]

    batches = gpu_decoders._NvImageCodecBatches(Library, Decoder(), None, torch.device("cuda", 1))
    out = torch.empty((2, 2, 2, 3), dtype=torch.uint8)
    batches.into([b"a", b"b"], out)  # the default stream (the decoder's check): nothing kept
    assert seen[-1] == (0, None) and batches.pools == {}
    current[0] = Stream(7)
    batches.into([b"a", b"b"], out)
    kept = [id(i) for i in batches.pools[7]]
    batches.into([b"a", b"b"], out)
    assert seen[-1] == (7, kept)  # reused on the stream it was made on
    current[0] = Stream(9)
    batches.into([b"a", b"b"], out)
    assert seen[-1] == (9, None) and set(batches.pools) == {7, 9}  # never another stream's
    current[0] = Stream(0)
    batches.into([b"a"], out[:1])
    assert seen[-1] == (0, None)
    batches.release(False)  # a job ends
    assert batches.pools == {} and events == []
    batches.release(True)  # a step down
    assert events == ["sync", ("trim", 1)]


def test_a_failed_pin_clears_the_cuda_error_or_stops_in_one_line(monkeypatch, caplog, tmp_path):
    from pathtwt.features import cuda_runtime, device_tiles
    from pathtwt.features.ring import Ring, RingSize

    class Cudart:
        cudaError = torch._C._cudart.cudaError
        cudaGetErrorString = staticmethod(torch._C._cudart.cudaGetErrorString)

        def cudaHostRegister(self, address, size, flags):
            return self.cudaError(712)  # cudaErrorHostMemoryAlreadyRegistered

        def cudaHostUnregister(self, address):
            pytest.fail("nothing was pinned")

    cleared = []
    monkeypatch.setattr(torch.cuda, "cudart", Cudart)
    ring = Ring(RingSize(slots=2, slot_bytes=4096))
    with monkeypatch.context() as m, caplog.at_level(logging.WARNING):
        m.setattr(cuda_runtime, "clear_last_error", lambda context: cleared.append(context) or 712)
        undo = device_tiles.pin_host_memory(ring, "cuda")
    undo()
    assert len(cleared) == 1 and "cudaHostRegister failed" in cleared[0]
    assert [r.getMessage() for r in caplog.records] == [f"{cleared[0]}; copies to the GPU go through a staging buffer"]
    assert "already mapped (712)" in cleared[0] and ring.describe() in cleared[0]
    # where torch's runtime is not a library of its own, the job stops with that line
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    monkeypatch.setattr(cuda_runtime, "MAPS", maps)
    with pytest.raises(PathtwtError) as err:
        device_tiles.pin_host_memory(ring, "cuda")
    assert "\n" not in str(err.value) and str(err.value).startswith("could not pin the tile ring")
    assert "stopping" in str(err.value) and "ulimit -l" in str(err.value)
    ring.close()


# ---- the check a decoder makes of itself ---------------------------------------------

def _stand_in(decode_one, name="stand-in") -> BatchDecoder:
    return BatchDecoder(name, lambda streams: [torch.from_numpy(np.ascontiguousarray(decode_one(s))) for s in streams])


def _check(decoder):
    return gpu_decoders._checked(decoder, torch.device("cpu"), "stand-in 1.0", "pip install stand-in",
                                 "stand-in decoded nothing")


def _as_ycbcr(stream):
    """libjpeg told the stream is YCbCr whatever its Adobe marker says (nvImageCodec's JPEG
    parser takes every three-component JPEG for YCbCr)."""
    import imagecodecs

    return np.asarray(imagecodecs.jpeg8_decode(stream, colorspace="YCbCr", outcolorspace="RGB"))


def test_a_decoder_is_checked_against_libjpeg_upsampling_its_way():
    ycc, rgb = jpeg_reference.probes()
    # the test JPEGs tell the upsampling and the colour space apart by far more than the tolerance
    assert jpeg_reference.max_difference(jpeg_reference.plain(ycc), jpeg_reference.fancy(ycc)) > 4 * \
        jpeg_reference.TOLERANCE
    assert jpeg_reference.max_difference(_as_ycbcr(rgb), jpeg_reference.fancy(rgb)) > 4 * jpeg_reference.TOLERANCE
    assert b"Adobe" in rgb and b"Adobe" not in ycc
    fancy = _check(_stand_in(jpeg_reference.fancy))
    assert fancy.reference is jpeg_reference.fancy and fancy.decodes_rgb
    plain = _check(_stand_in(jpeg_reference.plain))  # nvJPEG without interpolation, torchvision's
    assert plain.reference is jpeg_reference.plain and plain.decodes_rgb
    off3 = _check(_stand_in(lambda s: np.clip(jpeg_reference.fancy(s).astype(int) + 3, 0, 255).astype(np.uint8)))
    assert off3.reference is jpeg_reference.fancy  # 3 grey levels: a second IDCT's difference, within 10
    ycbcr_only = _check(_stand_in(lambda s: _as_ycbcr(s) if b"Adobe" in bytes(s) else jpeg_reference.fancy(s)))
    assert ycbcr_only.reference is jpeg_reference.fancy and not ycbcr_only.decodes_rgb
    refusing_rgb = _check(BatchDecoder("x", lambda ss: [None if b"Adobe" in bytes(s) else
                                                       torch.from_numpy(jpeg_reference.fancy(s)) for s in ss]))
    assert not refusing_rgb.decodes_rgb


def test_a_decoder_that_matches_neither_or_decodes_nothing_is_unavailable():
    wrong = _stand_in(lambda s: np.clip(jpeg_reference.fancy(s).astype(int) + 11, 0, 255).astype(np.uint8))
    with pytest.raises(GpuDecoderUnavailable, match=r"^stand-in 1\.0 on cpu: a test JPEG decodes 11 grey levels away "
                                                    r"from libjpeg's \(more than 10.*--decode cpu$"):
        _check(wrong)
    with pytest.raises(GpuDecoderUnavailable, match="^stand-in decoded nothing$"):
        _check(BatchDecoder("x", lambda ss: [None for _ in ss]))

    def broken(ss):
        raise RuntimeError("nvjpeg error 7\nat line 3")

    with pytest.raises(GpuDecoderUnavailable, match=r"^stand-in 1\.0 could not decode a test JPEG on cpu "
                                                    r"\(RuntimeError: nvjpeg error 7 at line 3\); pip install stand-in$"):
        _check(BatchDecoder("x", broken))


def test_a_stand_in_decoder_gets_the_attributes_it_does_not_state(monkeypatch):
    def make_stub(device):
        def decode(streams):
            return [None for _ in streams]

        return BatchDecoder("stub", decode, is_host=True)

    monkeypatch.setitem(gpu_decoders.GPU_DECODERS, "stub", (lambda: True, make_stub, False))  # a plain tuple too
    stub = gpu_decoders.make_decoder("stub", "cpu")
    assert (stub.name, stub.is_host, stub.reference, stub.tolerance, stub.decodes_rgb) == (
        "stub", True, jpeg_reference.fancy, jpeg_reference.TOLERANCE, False)
    host = gpu_decoders.make_decoder("host", "cpu")
    assert (host.is_host, host.reference, host.decodes_rgb) == (True, jpeg_reference.fancy, True)


def test_the_tolerance_covers_a_second_idct_and_not_a_wrong_upsampling(streams):
    """benchmarks/decode_tolerance.py on a few streams: libjpeg's fast IDCT stays within
    the tolerance of its accurate one, plain upsampling does not stay within it of fancy."""
    import simplejpeg

    idct, upsampling = 0, 0
    for s in streams["svs"] + streams["bach"]:
        fancy, plain = jpeg_reference.fancy(s), jpeg_reference.plain(s)
        fast = simplejpeg.decode_jpeg(s, colorspace="RGB", fastdct=True, fastupsample=False)
        fast_plain = simplejpeg.decode_jpeg(s, colorspace="RGB", fastdct=True, fastupsample=True)
        idct = max(idct, jpeg_reference.max_difference(fast, fancy), jpeg_reference.max_difference(fast_plain, plain))
        upsampling = max(upsampling, jpeg_reference.max_difference(plain, fancy))
    assert 0 < idct <= jpeg_reference.TOLERANCE < upsampling
