"""pathtwt doctor: each check through stand-ins for the hardware and software this machine
lacks (GPUs, a driver, GPU decoders, sbatch, AMX), and one real run here."""

from __future__ import annotations

import json
import types

import pytest
import torch

from pathtwt.bench import doctor
from pathtwt.cli import main

CTX = doctor.Context(store="results/store", workers=2)


def _one(rows, status):
    assert [r.status for r in rows] == [status], [r.line() for r in rows]
    return rows[0]


def test_an_old_python_fails_with_the_version_needed(monkeypatch):
    monkeypatch.setattr(doctor, "sys", types.SimpleNamespace(
        version_info=types.SimpleNamespace(major=3, minor=9, micro=18), executable="/usr/bin/python3"))
    row = _one(doctor.check_python(CTX), doctor.FAIL)
    assert "3.9.18" in row.detail and ">= 3.10" in row.fix


def test_torch_names_its_build():
    row = _one(doctor.check_torch(CTX), doctor.OK)
    assert torch.__version__ in row.detail and "build" in row.detail


def test_a_driver_older_than_the_builds_cuda_fails(monkeypatch):
    import pathtwt.devices as devices

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(devices, "visible_gpus", lambda: (1, "1 NVIDIA device file(s)"))
    monkeypatch.setattr(devices, "nvidia_driver_version", lambda: "535.104.05")
    row = _one(doctor.check_driver(CTX), doctor.FAIL)
    assert "535.104.05" in row.detail and "580.65.06" in row.detail and "CUDA 12" in row.fix
    monkeypatch.setattr(devices, "nvidia_driver_version", lambda: "590.44.01")
    assert "runs torch's CUDA 13.0 build" in _one(doctor.check_driver(CTX), doctor.OK).detail
    # GPUs but no driver at all
    monkeypatch.setattr(devices, "nvidia_driver_version", lambda: None)
    assert "install the NVIDIA driver" in _one(doctor.check_driver(CTX), doctor.FAIL).fix


def _fake_gpus(monkeypatch, free_gib=(70.0, 70.0), peer=True):
    import pathtwt.models.precision as precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(free_gib))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (int(free_gib[i] * 2**30), 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda i, j: peer)
    monkeypatch.setattr(precision, "native_bf16", lambda device: True)


def test_each_gpu_is_a_line_with_its_memory_bf16_and_peer_access(monkeypatch):
    _fake_gpus(monkeypatch)
    rows = doctor.check_gpus(CTX)
    assert [r.status for r in rows] == [doctor.OK, doctor.OK]
    assert "cuda:1 NVIDIA H100 80GB HBM3, 70.0 of 80.0 GiB free, bf16 native, peer access to all" in rows[1].detail
    _fake_gpus(monkeypatch, peer=False)
    assert all("peer access missing" in r.detail and r.status == doctor.WARN for r in doctor.check_gpus(CTX))
    _fake_gpus(monkeypatch, free_gib=(70.0, 1.0))
    busy = doctor.check_gpus(CTX)[1]
    assert busy.status == doctor.WARN and "another process holds this GPU" in busy.fix


def test_a_gpu_torch_cannot_use_fails(monkeypatch):
    import pathtwt.devices as devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "visible_gpus", lambda: (2, "CUDA_VISIBLE_DEVICES=0,1"))
    row = _one(doctor.check_gpus(CTX), doctor.FAIL)
    assert "CUDA_VISIBLE_DEVICES=0,1" in row.detail and "--device cpu" in row.fix


def test_each_gpu_decoder_says_its_self_check_or_why_not(monkeypatch):
    from pathtwt.features import gpu_decoders

    _fake_gpus(monkeypatch, free_gib=(70.0,))
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(gpu_decoders, "decoder_names",
                        lambda on_gpu=True, only_installed=True: ["torchvision"] if only_installed else
                        ["nvimgcodec", "torchvision"])

    def make(name, device):
        raise gpu_decoders.GpuDecoderUnavailable("torchvision is built without nvJPEG; install the CUDA build")

    monkeypatch.setattr(gpu_decoders, "make_decoder", make)
    rows = doctor.check_decoders(CTX)
    assert [r.status for r in rows] == [doctor.WARN] * 3
    assert rows[0].detail == "nvimgcodec: not installed" and "pip install 'nvidia-nvimgcodec-cu13[nvjpeg]" in rows[0].fix
    assert "built without nvJPEG" in rows[1].fix and "no GPU decoder works here" in rows[2].detail
    fake = types.SimpleNamespace(decodes_rgb=True, __repr__=lambda self: "fake")
    monkeypatch.setattr(gpu_decoders, "make_decoder", lambda name, device: fake)
    ok = doctor.check_decoders(CTX)
    assert [r.status for r in ok] == [doctor.WARN, doctor.OK] and "self-check passed on cuda:0" in ok[1].detail


def test_the_slide_readers_and_the_formats_they_read(monkeypatch):
    row = doctor.check_slide_readers(CTX)[0]
    assert row.status == doctor.OK and "OpenSlide" in row.detail and "Aperio SVS" in row.facts["formats"]
    monkeypatch.setitem(__import__("sys").modules, "openslide", None)  # import openslide raises ImportError
    rows = doctor.check_slide_readers(CTX)
    assert rows[0].status == doctor.WARN and "cannot read Aperio SVS" in rows[0].detail
    assert any(r.status == doctor.FAIL and "openslide-bin" in r.fix for r in rows)


def test_a_small_dev_shm_warns_with_the_workers_that_fit(monkeypatch):
    small = types.SimpleNamespace(total=64 * 2**20, free=64 * 2**20, used=0)
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda path: small)
    row = _one(doctor.check_shm(doctor.Context(store=".", workers=8)), doctor.WARN)
    assert "--workers 8 needs" in row.detail and "lower --workers to 0" in row.fix


def test_the_store_counts_entries_and_fails_when_not_writable(tmp_path, monkeypatch):
    row = _one(doctor.check_store(doctor.Context(store=str(tmp_path / "store"), workers=1)), doctor.OK)
    assert "made at the first run" in row.detail and row.facts["entries"] == 0

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(doctor.tempfile, "NamedTemporaryFile", refuse)
    row = _one(doctor.check_store(doctor.Context(store=str(tmp_path), workers=1)), doctor.FAIL)
    assert "not writable" in row.detail and "--store" in row.fix


def test_snakemake_slurm_and_a_fake_sbatch_on_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "sbatch not on PATH" in _one(doctor.check_workflow(CTX), doctor.WARN).detail
    sbatch = tmp_path / "sbatch"
    sbatch.write_text("#!/bin/sh\nexit 0\n")
    sbatch.chmod(0o755)
    row = _one(doctor.check_workflow(CTX), doctor.OK)
    assert f"sbatch {sbatch}" in row.detail and row.facts["snakemake"]


def test_the_cpus_matrix_units_decide_precision_auto(monkeypatch):
    import pathtwt.models.precision as precision

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.setattr(precision, "_cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})
    row = _one(doctor.check_cpu(CTX), doctor.OK)
    assert "AMX yes" in row.detail and "--precision auto on cpu: bf16 autocast" in row.detail
    monkeypatch.setattr(precision, "_cpu_flags", lambda: {"sse4_2"})
    row = _one(doctor.check_cpu(CTX), doctor.WARN)
    assert "AVX2 no" in row.detail and row.detail.endswith("fp32")


def test_a_check_that_raises_is_a_fail_and_the_exit_is_1(monkeypatch):
    def broken(ctx):
        raise RuntimeError("libcuda.so: cannot open shared object file")

    monkeypatch.setattr(doctor, "CHECKS", [doctor.check_python, broken])
    rows = doctor.run_checks(CTX)
    assert rows[1].status == doctor.FAIL and rows[1].name == "broken" and "libcuda.so" in rows[1].detail
    assert doctor.exit_code(rows) == 1 and doctor.exit_code(rows[:1]) == 0


def test_a_real_run_here(capsys, tmp_path):
    assert main(["doctor", "--json", "--store", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    names = [c["name"] for c in out["checks"]]
    assert names[:2] == ["python", "torch"] and {"driver", "gpu", "decoder", "slides", "shm", "store", "workflow",
                                                 "cpu"} <= set(names)
    assert out["exit"] == 0 and all(c["status"] in ("OK", "WARN") for c in out["checks"])
    assert main(["doctor", "--store", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("OK    python") and lines[-1].endswith("0 FAIL, " + lines[-1].split(", ")[1])


def test_a_fail_exits_1_from_the_command(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(doctor, "CHECKS", [lambda ctx: [doctor.Check("gpu", doctor.FAIL, "broken", "fix it")]])
    assert main(["doctor", "--store", str(tmp_path)]) == 1
    assert "FAIL  gpu            broken -> fix it" in capsys.readouterr().out


def test_this_machine_warns_only_for_what_it_lacks(tmp_path):
    rows = doctor.run_checks(doctor.Context(store=str(tmp_path), workers=1))
    assert not [r for r in rows if r.status == doctor.FAIL]
