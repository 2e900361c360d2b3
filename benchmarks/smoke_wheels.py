"""The wheels the GPU smoke run carries: what pathtwt needs that the GPU machine's image
lacks, for its Python 3.12 on manylinux x86_64.

Measures: nothing timed: whether the lock's wheels plus the GPU image's packages satisfy
every requirement of pathtwt and its ``gpu`` extra, offline, and which carried wheel
nothing needs.

Command: `python benchmarks/smoke_wheels.py --check` (offline; tests/test_smoke_wheels.py
checks the same through its functions), then `python benchmarks/smoke_wheels.py --relock`
(needs PyPI).

JSON keys: it writes no result file; its one file is the lock,
``benchmarks/gpu_smoke_wheels.json``: `python`, `platforms`, `bytes` (the carried total)
and `wheels`, each with `name`, `version`, `file`, `sha256`, `requires`, `size`, `built`
and `kept` (a shrunk wheel's members).

The image cannot reach a registry, so everything it lacks travels in the carried folder
(``.smoke_data/wheels``) and is installed there with ``pip --no-index --no-deps --target``.
The list is a lock, ``benchmarks/gpu_smoke_wheels.json``: each wheel's name, version, file,
sha256 and requirements, so that a test can check without the network that the carried
wheels plus the image's packages (``benchmarks/gpu_image_packages.txt``) satisfy every
requirement, and ``gpu_smoke --prepare`` can fetch exactly those files.

    python benchmarks/smoke_wheels.py --relock     # resolve anew (needs PyPI), rewrite the lock
    python benchmarks/smoke_wheels.py --check      # the lock against the image, offline

Versions are those of the environment running ``--relock`` where they satisfy the
requirement (the versions the test suite ran with), else the newest that does (within
:data:`IMAGE_PINS`). A package published only as a source distribution is built into a
wheel here, and must be pure Python (``py3-none-any``) to travel.

Besides pathtwt's own requirements the smoke run carries its ``gpu`` extra: nvImageCodec
for CUDA 13 (the image's torch is a CUDA 13 build) with its nvJPEG extension, so the GPU
rows decode JPEG on the GPU. Its wheel is 25 MB, for every CPython from 3.9 to 3.14 and
with CPU, TIFF, JPEG 2000 and OpenCV extensions; it travels shrunk (:data:`SHRUNK`) to
what the image's Python 3.12 decodes JPEG on the GPU with, about 5 MB: the lock keeps
the published wheel's sha256 (what is downloaded is checked against it) and the members
kept, and the shrunk wheel's RECORD lists exactly those, with their hashes.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LOCK = HERE / "gpu_smoke_wheels.json"
IMAGE = HERE / "gpu_image_packages.txt"
PYTHON = "3.12"
# the image's interpreter, for environment markers
MARKER_ENV = {
    "python_version": PYTHON, "python_full_version": "3.12.3", "implementation_name": "cpython",
    "platform_python_implementation": "CPython", "implementation_version": "3.12.3", "os_name": "posix",
    "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "platform_release": "",
    "platform_version": "", "extra": "",
}
# pip matches manylinux_2_N exactly: every N a wheel of these packages is published for
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64",
             "manylinux1_x86_64"]
# the wheels' share of the 56 MiB the carried folder may hold (benchmarks/gpu_smoke's
# CARRIED_LIMIT_BYTES): the rest is the real slides
LIMIT_BYTES = 52 * 2**20
# the smoke run's own needs beyond pathtwt's: none (its phases are pathtwt's own commands and
# benchmarks; the workflow, and so Snakemake with its 9 MiB of wheels, is tested elsewhere)
RUNNER: tuple[str, ...] = ()
# requirements that do not travel, each with why the smoke run does without it (none today)
LEFT_OUT: dict[str, str] = {}


@dataclass(frozen=True)
class Wheel:
    name: str  # canonical project name
    version: str
    file: str
    sha256: str
    requires: tuple[str, ...]  # Requires-Dist, as written
    size: int = 0  # bytes, as carried
    built: bool = False  # built here from the only published source distribution
    kept: tuple[str, ...] = ()  # carried shrunk to these members (SHRUNK); sha256 is the published wheel's


def image_packages(path: Path = IMAGE) -> dict[str, str | None]:
    """Canonical name -> version (None where the image's version was not read)."""
    out: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[canonicalize_name(name)] = version or None
    return out


# the GPU JPEG decoder for the image's CUDA 13 torch (pyproject's extra of that name)
GPU_EXTRA = "gpu"
# versions held for the image, each with why
IMAGE_PINS = {
    # the image's torch 2.11 is a CUDA 13.0 build: nvJPEG of the same CUDA minor release
    "nvidia-nvjpeg": ">=13.0,<13.1",
}
# wheels carried in part: the members kept (fnmatch patterns; the dist-info is always kept)
SHRUNK = {
    # the Python 3.12 module, the library and its nvJPEG extension (the GPU backend; the
    # decoder allows no other): 5 MB of the 25
    "nvidia-nvimgcodec-cu13": ("nvidia/__init__.py", "nvidia/nvimgcodec/__init__.py",
                               "nvidia/nvimgcodec/nvimgcodec_impl.cpython-312-*.so", "nvidia/nvimgcodec/libnvimgcodec.so.*",
                               "nvidia/nvimgcodec/extensions/libnvjpeg_ext.so.*"),
}


def needed() -> list[Requirement]:
    """pathtwt's own requirements, its GPU decoder's and the runner's."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    gpu = project["optional-dependencies"][GPU_EXTRA]
    return [Requirement(r) for r in (*project["dependencies"], *gpu, *RUNNER)]


def load_lock(path: Path = LOCK) -> list[Wheel]:
    return [Wheel(**{**w, "requires": tuple(w["requires"]), "kept": tuple(w.get("kept", ()))})
            for w in json.loads(path.read_text())["wheels"]]


def applies(req: Requirement, extras: frozenset[str] = frozenset()) -> bool:
    """Whether ``req`` is wanted on the image's Python, for a package asked with ``extras``."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**MARKER_ENV, "extra": e}) for e in (extras or {""}))


def _wanted(wheels: list[Wheel]) -> list[tuple[str, Requirement]]:
    """(who asks, requirement) for pathtwt, the runner and every carried wheel, each wheel's
    requirements read with the extras its requirers ask for."""
    asks = [("pathtwt", r) for r in needed() if applies(r)]
    extras: dict[str, set[str]] = {}
    changed = True
    while changed:  # extras pull requirements in, which may ask for more extras
        changed = False
        for w in wheels:
            for text in w.requires:
                r = Requirement(text)
                if applies(r, frozenset(extras.get(w.name, ()))) and (w.name, r) not in asks:
                    asks.append((w.name, r))
        for _owner, r in asks:
            name = canonicalize_name(r.name)
            if not set(r.extras) <= extras.setdefault(name, set()):
                extras[name] |= set(r.extras)
                changed = True
    return asks


def reachable(wheels: list[Wheel]) -> list[Wheel]:
    """The wheels pathtwt's requirements reach, through carried wheels only: the lock less
    what a dropped requirement (a runner no longer carried) alone asked for."""
    by_name = {w.name: w for w in wheels}
    keep: set[str] = set()
    queue = [(r, frozenset()) for r in needed()]
    while queue:
        req, extras = queue.pop(0)
        name = canonicalize_name(req.name)
        if not applies(req, extras) or name not in by_name or (name in keep and not req.extras):
            continue
        keep.add(name)
        queue += [(Requirement(r), frozenset(req.extras)) for r in by_name[name].requires]
    return [w for w in wheels if w.name in keep]


def unmet(wheels: list[Wheel], image: dict[str, str | None]) -> list[str]:
    """Every requirement of pathtwt, the runner and each carried wheel that neither the
    carried wheels nor the image satisfy, and each carried wheel nothing needs, one line
    each; empty when all are met."""
    have = {w.name: w.version for w in wheels}
    problems = [f"{n}: carried and in the image (two versions stop the install)"
                for n in sorted(set(have) & set(image))]
    kept = {w.name for w in reachable(wheels)}
    problems += [f"{w.name}: carried, but nothing pathtwt needs asks for it" for w in wheels if w.name not in kept]
    for owner, req in _wanted(wheels):
        name = canonicalize_name(req.name)
        if name in LEFT_OUT:
            continue
        if name not in have and name not in image:
            problems.append(f"{owner} needs {req}: neither carried nor in the image")
            continue
        version = have.get(name) or image.get(name)
        if version is not None and not req.specifier.contains(Version(version), prereleases=True):
            problems.append(f"{owner} needs {req}: {name} {version} is what travels or is there")
    return problems


def _pip(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, cwd=cwd)


def _platform_args() -> list[str]:
    out = ["--python-version", PYTHON, "--implementation", "cp", "--only-binary=:all:"]
    for p in PLATFORMS:
        out += ["--platform", p]
    return out


def download(spec: str, dest: Path) -> Path | None:
    """The wheel pip picks for ``spec`` on the image's Python, into ``dest``; None if none."""
    before = set(dest.glob("*.whl"))
    res = _pip("download", "-q", "--no-deps", *_platform_args(), "-d", str(dest), spec)
    new = sorted(set(dest.glob("*.whl")) - before)
    return new[0] if res.returncode == 0 and new else None


def build(spec: str, dest: Path) -> Path | None:
    """A pure-Python wheel built here from ``spec``'s source distribution."""
    before = set(dest.glob("*.whl"))
    res = _pip("wheel", "-q", "--no-deps", "--no-binary=:all:", "-w", str(dest), spec)
    new = sorted(set(dest.glob("*.whl")) - before)
    if res.returncode != 0 or not new:
        return None
    if not new[0].name.endswith("-py3-none-any.whl"):
        raise SystemExit(f"smoke_wheels: {spec} has no wheel for Python {PYTHON} and builds only {new[0].name}, "
                         "which does not run on the image")
    return new[0]


def metadata(wheel: Path) -> tuple[str, str, tuple[str, ...]]:
    with zipfile.ZipFile(wheel) as z:
        text = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    field = lambda key: [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(key + ":")]  # noqa: E731
    return canonicalize_name(field("Name")[0]), field("Version")[0], tuple(field("Requires-Dist"))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pinned(req: Requirement) -> str:
    """``req`` pinned to this environment's version where it satisfies it (tested here)."""
    image_pin = IMAGE_PINS.get(canonicalize_name(req.name), "")
    try:
        version = importlib.metadata.version(req.name)
    except importlib.metadata.PackageNotFoundError:
        return str(Requirement(f"{req.name}{req.specifier}{',' if req.specifier and image_pin else ''}{image_pin}"))
    if req.specifier.contains(Version(version), prereleases=True):
        return f"{req.name}=={version}"
    return str(Requirement(f"{req.name}{req.specifier}"))


def relock(dest: Path) -> list[Wheel]:
    """Resolve what the image lacks, breadth first, downloading (or building) each wheel."""
    image = image_packages()
    wheels: dict[str, Wheel] = {}
    queue: list[tuple[Requirement, frozenset[str]]] = [(r, frozenset()) for r in needed()]
    done: set[tuple[str, frozenset[str]]] = set()
    while queue:
        req, extras = queue.pop(0)
        name = canonicalize_name(req.name)
        if not applies(req, extras) or name in image or name in LEFT_OUT or (name, frozenset(req.extras)) in done:
            continue
        done.add((name, frozenset(req.extras)))
        if name in wheels:
            if not req.specifier.contains(Version(wheels[name].version), prereleases=True):
                raise SystemExit(f"smoke_wheels: {req} conflicts with {name} {wheels[name].version} already chosen")
        else:
            spec = _pinned(req)
            path = download(spec, dest)
            built = path is None
            path = path or build(spec, dest)
            if path is None:
                raise SystemExit(f"smoke_wheels: no wheel or source distribution of {spec} for Python {PYTHON}")
            got, version, requires = metadata(path)
            published = sha256(path)
            kept = shrink(path, SHRUNK[name]) if name in SHRUNK else ()
            wheels[name] = Wheel(got, version, path.name, published, requires, path.stat().st_size, built, kept)
            print(f"  {path.name}{' (built)' if built else ''}{' (shrunk)' if kept else ''}", flush=True)
        for r in wheels[name].requires:
            queue.append((Requirement(r), frozenset(req.extras)))
    return sorted(wheels.values(), key=lambda w: w.name)


def fetch(wheels: list[Wheel], dest: Path) -> list[str]:
    """Download (or build, or shrink) each locked wheel into ``dest``; the problems, one line each."""
    dest.mkdir(parents=True, exist_ok=True)
    problems = []
    for w in wheels:
        target = dest / w.file
        if target.is_file() and not carried_differs(target, w):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            spec = f"{w.name}=={w.version}"
            path = build(spec, Path(tmp)) if w.built else download(spec, Path(tmp))
            if path is None or path.name != w.file:
                problems.append(f"{w.file}: not found for Python {PYTHON} ({spec}); the lock names a wheel "
                                "the registry does not serve: run benchmarks/smoke_wheels.py --relock")
                continue
            if not w.built and sha256(path) != w.sha256:
                problems.append(f"{w.file}: sha256 differs from the lock's; run benchmarks/smoke_wheels.py --relock")
                continue
            if w.kept:
                shrink(path, SHRUNK[w.name])
            path.replace(target)
        why = carried_differs(target, w)
        if why:
            problems.append(f"{w.file}: {why}; run benchmarks/smoke_wheels.py --relock")
    stray = sorted({p.name for p in dest.glob("*.whl")} - {w.file for w in wheels})
    for name in stray:
        (dest / name).unlink()  # two versions of a package stop the install
    return problems


def carried_differs(path: Path, w: Wheel) -> str:
    """Why the carried file ``path`` is not the lock's ``w`` (empty when it is): the
    published wheel's sha256, or for a shrunk one its members and their RECORD hashes."""
    if not w.kept:
        return "" if w.built or sha256(path) == w.sha256 else "sha256 differs from the lock's"
    try:
        members = wheel_members(path)
    except (zipfile.BadZipFile, KeyError, ValueError) as exc:
        return f"not a whole wheel ({exc})"
    return "" if members == set(w.kept) else f"holds {sorted(members ^ set(w.kept))[:3]} unlike the lock's members"


def _record_hash(data: bytes) -> str:
    import base64

    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_members(path: Path) -> set[str]:
    """The files of wheel ``path`` outside its dist-info, each checked against its RECORD
    line (ValueError naming the first that is not as recorded)."""
    with zipfile.ZipFile(path) as z:
        record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        recorded = {line.split(",")[0]: line.split(",")[1] for line in z.read(record).decode().splitlines() if line}
        names = [n for n in z.namelist() if not n.endswith("/")]
        for name in names:
            if name != record and recorded.get(name) != _record_hash(z.read(name)):
                raise ValueError(f"{name} is not as its RECORD says")
        if set(recorded) - set(names):
            raise ValueError(f"RECORD names {sorted(set(recorded) - set(names))[0]}, which is absent")
    return {n for n in names if ".dist-info/" not in n}


def shrink(path: Path, patterns: tuple[str, ...]) -> tuple[str, ...]:
    """Rewrite wheel ``path`` in place with only the members matching ``patterns`` (and
    its dist-info, the RECORD rewritten to list exactly what is kept); the members kept."""
    import fnmatch

    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
        record = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        keep = [i for i in src.infolist() if not i.is_dir() and i.filename != record and
                (".dist-info/" in i.filename or any(fnmatch.fnmatchcase(i.filename, p) for p in patterns))]
        lines = []
        for info in keep:
            data = src.read(info)
            out.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            lines.append(f"{info.filename},{_record_hash(data)},{len(data)}")
        out.writestr(src.getinfo(record), "\n".join([*lines, f"{record},,"]) + "\n", compress_type=zipfile.ZIP_DEFLATED)
    tmp.replace(path)
    return tuple(sorted(i.filename for i in keep if ".dist-info/" not in i.filename))


def install_command(wheels: Path, target: Path, python: str = "python3") -> list[str]:
    """How the smoke run installs the carried wheels on the image: nothing from a registry,
    no dependency resolution (the lock did it), the image's own torch left as it is."""
    return [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
            "--upgrade", "--target", str(target), *sorted(str(p) for p in wheels.glob("*.whl"))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--relock", action="store_true", help="resolve anew from PyPI and rewrite the lock")
    ap.add_argument("--check", action="store_true", help="check the lock against the image's packages")
    args = ap.parse_args(argv)
    if args.relock:
        with tempfile.TemporaryDirectory() as tmp:
            wheels = relock(Path(tmp))
        size = sum(w.size for w in wheels)
        tmp = LOCK.with_name(LOCK.name + ".tmp")
        tmp.write_text(json.dumps({"python": PYTHON, "platforms": PLATFORMS, "bytes": size,
                                   "wheels": [asdict(w) for w in wheels]}, indent=1) + "\n")
        tmp.replace(LOCK)  # never a half-written lock
        print(f"smoke_wheels: {len(wheels)} wheels, {size / 2**20:.1f} MiB -> {LOCK}")
        if size > LIMIT_BYTES:
            print(f"smoke_wheels: over the {LIMIT_BYTES // 2**20} MiB the wheels may take", file=sys.stderr)
            return 1
    problems = unmet(load_lock(), image_packages())
    for line in problems:
        print(f"smoke_wheels: {line}", file=sys.stderr)
    if not problems:
        print(f"smoke_wheels: every requirement met by the {len(load_lock())} carried wheels and the image")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
