"""An installed wheel works without the repository: `pip wheel .`, installed into a
fresh venv, and `pathtwt check-config config/config.yaml` run from a folder outside the
checkout (the config schema is package data read through importlib.resources).

The fresh venv gets the package from the wheel only; its dependencies come from the test
interpreter's site-packages through a path file, so the test needs no network and no
second copy of torch. That path file adds the folder to sys.path without running the
path files inside it, so the test interpreter's own (editable) pathtwt stays invisible.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# no PYTHONPATH pointing at a checkout: the installed package must stand on its own
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(cmd, **kwargs) -> subprocess.CompletedProcess:
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, env=CLEAN_ENV, **kwargs)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))}:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
    return res


def test_wheel_installs_and_checks_a_config_outside_the_repository(tmp_path):
    # build from a copy of the sources, so the checkout gets no build/ or egg-info folders
    src = tmp_path / "src"
    shutil.copytree(REPO / "pathtwt", src / "pathtwt", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, src])
    (wheel,) = dist.glob("pathtwt-*.whl")
    assert "pathtwt/config/schema.yaml" in zipfile.ZipFile(wheel).namelist()

    env = tmp_path / "fresh"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel])

    outside = tmp_path / "elsewhere"
    (outside / "config").mkdir(parents=True)
    shutil.copy(REPO / "config" / "config.yaml", outside / "config" / "config.yaml")
    where = _run([python, "-c", "import pathtwt; print(pathtwt.__file__)"], cwd=outside).stdout.strip()
    assert where.startswith(str(site)), f"pathtwt imported from {where}, not the installed wheel"
    res = _run([env / "bin" / "pathtwt", "check-config", "config/config.yaml"], cwd=outside)
    assert "config ok:" in res.stdout
    # and a schema error still names the key, read from the packaged schema
    (outside / "config" / "bad.yaml").write_text("extract: {batch_size: many}\n")
    bad = subprocess.run([env / "bin" / "pathtwt", "check-config", "config/config.yaml", "config/bad.yaml"],
                         capture_output=True, text=True, cwd=outside, timeout=120, env=CLEAN_ENV)
    assert bad.returncode == 1 and "key extract.batch_size" in bad.stderr
