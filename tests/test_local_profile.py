"""workflow/profiles/local: Snakemake accepts it and plans the demo through it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "workflow" / "profiles" / "local"
SNAKEMAKE = Path(sys.executable).parent / "snakemake"


def test_local_profile_settings():
    settings = yaml.safe_load((PROFILE / "config.yaml").read_text())
    # the lighter scheduler and nothing a cluster profile would carry: no gpu limit either,
    # the workflow's own one-per-visible-GPU rule applies as without a profile
    assert settings == {"cores": "all", "scheduler": "greedy"}


def test_demo_plans_through_the_local_profile(tmp_path):
    res = subprocess.run([str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path), "-n",
                          "--profile", str(PROFILE), "--configfile", str(REPO / "config" / "config.yaml"),
                          "--quiet", "rules"],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "demo_slides" in res.stdout and "train_mil" in res.stdout


def _plan(tmp_path, *extra, env=None, configfiles=()):
    import os

    return subprocess.run([str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path), "-n",
                           "--profile", str(PROFILE), "--configfile", str(REPO / "config" / "config.yaml"),
                           *map(str, configfiles), *extra],
                          capture_output=True, text=True, cwd=REPO, timeout=600, env={**os.environ, **(env or {})})


def test_cpu_stages_ask_for_no_gpu_and_gpu_stages_one(tmp_path):
    # the demo runs compress, extract and MIL on the CPU: none of its jobs holds the one gpu
    res = _plan(tmp_path, "--cores", "2")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    gpus = re.findall(r"^\s+resources: .*?\bgpu=(\d+)", res.stdout, re.M)
    assert gpus and set(gpus) == {"0"}
    # a GPU stage (MIL on cuda) asks for one (before the demo's slides are written, its store
    # entries have no keys yet: the MIL jobs are the GPU stage the plan shows)
    cuda = tmp_path / "cuda.yaml"
    cuda.write_text("mil:\n  device: cuda\n")
    res = _plan(tmp_path, "--cores", "2", configfiles=[cuda])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    mil = re.findall(r"rule train_mil:.*?resources: [^\n]*?\bgpu=(\d+)", res.stdout, re.S)
    assert mil and set(mil) == {"1"}


def test_more_gpus_than_the_machine_shows_is_one_line(tmp_path):
    res = _plan(tmp_path, "--resources", "gpu=3", env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert res.returncode != 0
    assert "--resources gpu=3: this machine shows 2 GPU(s); give at most gpu=2" in res.stdout + res.stderr


def test_multi_gpu_compress_needs_as_many_gpus_in_the_run(tmp_path):
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("compress:\n  device: cuda\n  gpus: 2\n")
    res = _plan(tmp_path, configfiles=[gpus], env={"CUDA_VISIBLE_DEVICES": "0"})
    assert res.returncode != 0
    assert "compress.gpus 2: the run allows gpu=1; give --resources gpu=2 or more" in res.stdout + res.stderr


def _plan_bare(tmp_path, *extra, env):
    """A dry run without any profile: the mission's `snakemake --cores N` command line."""
    import os

    return subprocess.run([str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path), "-n",
                           "--cores", "4", "--configfile", str(REPO / "config" / "config.yaml"), *extra],
                          capture_output=True, text=True, cwd=REPO, timeout=600, env={**os.environ, **env})


def test_without_a_profile_gpu_jobs_run_one_per_visible_gpu(tmp_path):
    res = _plan_bare(tmp_path, env={"CUDA_VISIBLE_DEVICES": "GPU-aaaa"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    said = [line for line in (res.stdout + res.stderr).splitlines() if "GPU job(s) at a time" in line]
    assert said == ["pathtwt workflow: at most 1 GPU job(s) at a time, one per visible GPU "
                    "(CUDA_VISIBLE_DEVICES=GPU-aaaa); --resources gpu=N to change"]
    # a command-line limit is the user's, and says so
    res = _plan_bare(tmp_path, "--resources", "gpu=2", env={"HIP_VISIBLE_DEVICES": "0,1"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "pathtwt workflow: at most 2 GPU job(s) at a time (--resources gpu=2)" in res.stdout + res.stderr
    res = _plan_bare(tmp_path, "--resources", "gpu=3", env={"HIP_VISIBLE_DEVICES": "0,1"})
    assert res.returncode != 0
    assert "--resources gpu=3: this machine shows 2 GPU(s); give at most gpu=2" in res.stdout + res.stderr
