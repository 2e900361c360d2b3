"""The cluster profiles keep their promises, checked with dry runs through them: every
job keeps its partition when the account comes from the environment, GPU jobs get
realistic cores, and the paper's study on a fake data tree of the real cohort sizes is a
few hundred SLURM submissions, not one per slide."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
PROFILES = REPO / "workflow" / "profiles"

def _paper_cohorts():
    """benchmarks/plan_time.py: the paper's cohorts at their real sizes, and fake slides for them."""
    spec = importlib.util.spec_from_file_location("plan_time", REPO / "benchmarks" / "plan_time.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PAPER_COHORTS = _paper_cohorts()
# The paper's cohorts at their real sizes: folder, label table, label column, slides per
# split, extension (PANDA 10,616; TCGA-PRAD 449; CAMELYON17 500; CAMELYON16 399).
REAL_SIZES = PAPER_COHORTS.REAL_SIZES
REAL_SIZES_COUNT = {k: sum(v[3].values()) for k, v in REAL_SIZES.items()}
# A small tree for the resource checks.
SMALL_SIZES = {k: (f, l, c, {s: min(n, 2) for s, n in splits.items()}, e) for k, (f, l, c, splits, e) in REAL_SIZES.items()}


def dry_run(tmp_path: Path, profile: str, sizes: dict, env: dict | None = None, extra=(),
            configfiles=()) -> tuple[str, float]:
    data, work = tmp_path / "data", tmp_path / "work"
    PAPER_COHORTS.make_cohorts(data, sizes)
    work.mkdir(exist_ok=True)
    cmd = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(work), "-n",
           "--profile", str(PROFILES / profile), "--configfile", str(REPO / "config" / "paper.yaml"),
           *map(str, configfiles), "--config", f"data_root={data}", *extra]
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=900,
                         env={**os.environ, **(env or {})})
    elapsed = time.perf_counter() - start
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout, elapsed


def local_rules() -> set[str]:
    """Rules Snakemake runs in its own process, never submitted: `localrule: True` and
    rules without an action (targets such as `all`)."""
    names = set()
    texts = [(REPO / "Snakefile").read_text()] + [p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk")]
    for text in texts:
        for block in re.split(r"\n(?=[ ]*(?:rule|checkpoint) \w+:)", text)[1:]:
            name = re.match(r"\s*(?:rule|checkpoint) (\w+):", block).group(1)
            if "localrule: True" in block or not re.search(r"\n\s+(shell|run|script|wrapper|notebook):", block):
                names.add(name)
    return names


def jobs(output: str) -> list[dict]:
    """Every planned job of a dry run: rule, group (None outside one), resources."""
    out, group = [], None
    for line in output.splitlines():
        if "Group job" in line:
            group = object()  # the jobs listed next belong to this group, until a top-level job
            continue
        m = re.match(r"^(\s*)(?:local)?rule (\w+):$", line)
        if m:
            if not m.group(1):
                group = None  # a top-level job ends the group block
            out.append({"rule": m.group(2), "group": group, "resources": {}})
            continue
        m = re.match(r"^\s+resources: (.*)$", line)
        if m and out:
            out[-1]["resources"] = dict(kv.split("=", 1) for kv in m.group(1).split(", ") if "=" in kv)
    return out


def submissions(output: str) -> dict[str, int]:
    """rule -> SLURM jobs submitted for it: one per group of jobs, one per job outside a
    group, none for local rules."""
    local = local_rules()
    counted: dict[str, int] = {}
    seen_groups = set()
    for job in jobs(output):
        if job["rule"] in local:
            continue
        if job["group"] is not None:
            if id(job["group"]) in seen_groups:
                continue
            seen_groups.add(id(job["group"]))
        counted[job["rule"]] = counted.get(job["rule"], 0) + 1
    return counted


GPU_RULES = {"discover", "compress", "extract", "probe", "train_mil", "analyze_norms", "analyze_intrinsic_dim",
             "analyze_stability"}
# a labelled tile set for the probe jobs (the paper's config has none; the files need not be images to plan)
PROBE_CONFIG = "probes={'lung': {'tiles': 'probe-tiles'}}"


def with_probe_tiles(tmp_path: Path) -> None:
    for label in ("a", "b"):
        (tmp_path / "work" / "probe-tiles" / label).mkdir(parents=True, exist_ok=True)
        for i in range(2):
            (tmp_path / "work" / "probe-tiles" / label / f"s{i}_t.png").touch()


@pytest.mark.parametrize("profile,cpu,gpu,cores", [("slurm", "cpu", "gpu", 8), ("lumi", "small", "small-g", 7)])
def test_account_from_the_environment_keeps_every_partition(tmp_path, profile, cpu, gpu, cores):
    # --cores only lifts the dry run's own cap of one core per job, so the printed
    # threads are the ones a submission asks for
    with_probe_tiles(tmp_path)
    output, _ = dry_run(tmp_path, profile, SMALL_SIZES, env={"SBATCH_ACCOUNT": "project_465000042"},
                        extra=[PROBE_CONFIG, "--cores", "64"])
    planned = [j for j in jobs(output) if j["rule"] not in local_rules()]
    # probe (gpu=1) among them: every GPU rule on the GPU partition
    assert {j["rule"] for j in planned} >= GPU_RULES | {"tile", "calibrate"}
    for job in planned:
        res = job["resources"]
        assert res.get("slurm_partition") == (gpu if job["rule"] in GPU_RULES else cpu), (job["rule"], res)
        assert "mem_mb" in res and "runtime" in res
        if profile == "lumi":  # the account from SBATCH_ACCOUNT, beside every rule's own partition
            assert res.get("slurm_account") == "project_465000042", (job["rule"], res)
        if job["rule"] in {"discover", "compress", "extract", "probe", "train_mil"}:
            assert res.get("gpu") == "1"
    # GPU jobs ask for the site's cores per GPU and extract passes them on as workers
    assert re.findall(r"pathtwt extract .*?--workers (\d+)", output) and set(
        re.findall(r"pathtwt extract .*?--workers (\d+)", output)) == {str(cores - 1)}
    assert f"--threads {2 if profile == 'slurm' else 7}" in output.split("pathtwt train-mil", 1)[1].split("\n", 1)[0]
    # discovery and (streamed) distillation get the same cores per GPU: readers beside a
    # teacher and a student, not compress.threads' 2
    for rule in ("discover", "compress"):
        block = output.split(f"rule {rule}:", 1)[1].split("\n\n", 1)[0]
        assert f"threads: {cores}" in block, (rule, block)


@pytest.mark.parametrize("profile,cpu,gpu,mem,threads", [("slurm", "cpu", "gpu", 4 * 32000, 4 * 8),
                                                        ("lumi", "small", "small-g", 4 * 60000, 4 * 7)])
def test_multi_gpu_compress_keeps_every_partition(tmp_path, profile, cpu, gpu, mem, threads):
    """`compress: {gpus: 4}` (the config key that replaces a command-line --set-resources,
    which dropped the profile's whole block): compress asks for 4 GPUs, 4 x the per-GPU
    memory and cores, and every rule keeps its partition."""
    gpus = tmp_path / "gpus.yaml"  # a second config file, merged into the paper's
    gpus.write_text("compress:\n  gpus: 4\n")
    output, _ = dry_run(tmp_path, profile, SMALL_SIZES, env={"SBATCH_ACCOUNT": "project_465000042"},
                        extra=["--cores", "64"], configfiles=[gpus])
    planned = [j for j in jobs(output) if j["rule"] not in local_rules()]
    compress = [j["resources"] for j in planned if j["rule"] == "compress"]
    assert compress and all(r.get("gpu") == "4" and r.get("mem_mb") == str(mem) for r in compress), sorted(compress[0].items())
    for job in planned:
        assert job["resources"].get("slurm_partition") == (gpu if job["rule"] in GPU_RULES else cpu), job
        if job["rule"] in GPU_RULES - {"compress"} and "gpu" in job["resources"]:
            assert job["resources"]["gpu"] == "1", job
    # the other keys of the section are the config file's, and the job starts 4 ranks on claimed GPUs
    command = next(line for line in output.splitlines() if "$run compress" in line)
    assert "ranks=4;" in command and 'run="python -m pathtwt.devices --gpus $ranks -- $run"' in command
    assert "--batch-size 64 " in command  # the section's other keys come from the config file
    block = output.split("rule compress:", 1)[1].split("\n\n", 1)[0]
    assert f"threads: {threads}" in block, block


def test_a_cpu_stage_stays_off_the_gpu_partition(tmp_path):
    """`device: cpu` for MIL training (a study without GPUs for that stage): its jobs go to
    the default partition and ask for no GPU; the other GPU stages keep theirs."""
    output, _ = dry_run(tmp_path, "slurm", SMALL_SIZES, extra=["mil={'device': 'cpu'}"])
    planned = [j for j in jobs(output) if j["rule"] not in local_rules()]
    by_rule = {}
    for job in planned:
        by_rule.setdefault(job["rule"], []).append(job["resources"])
    assert by_rule["train_mil"] and all(r.get("slurm_partition") == "cpu" and r.get("gpu") == "0"
                                        for r in by_rule["train_mil"])
    assert all(r.get("slurm_partition") == "gpu" and r.get("gpu") == "1" for r in by_rule["extract"])


@pytest.mark.slow
def test_paper_study_is_a_few_hundred_submissions(tmp_path):
    """PANDA 10,616, TCGA-PRAD 449, CAMELYON17 500 and CAMELYON16 399 slides: one job per
    slide and per MIL run would be ~12,600 submissions; grouped, a few hundred."""
    output, elapsed = dry_run(tmp_path, "slurm", REAL_SIZES)
    print(f"planned the paper's study ({sum(REAL_SIZES_COUNT.values())} slides) in {elapsed:.0f} s")
    total_jobs = sum(1 for _ in jobs(output))
    per_rule = submissions(output)
    assert total_jobs > 12_000
    assert per_rule["tile"] == -(-sum(REAL_SIZES_COUNT.values()) // 100)  # 100 slides per tile job
    # 2 backbones x 8 variants x 2 tasks x 3 heads (abmil, transmil, meanpool), the 5 seeds
    # of a head in one job
    assert per_rule["train_mil"] == 2 * 8 * 2 * 3
    # 120 tile + 64 extract + 96 train_mil + a few dozen one-off jobs: ~310 against ~12,600
    assert sum(per_rule.values()) <= 320, per_rule


@pytest.mark.parametrize("route,extra,said", [
    ("rocm env", [], "jobs run in this environment (with --use-conda: workflow/envs/pathtwt-rocm.yaml)"),
    ("container", ["--software-deployment-method", "apptainer", "--config", "container=/tmp/pathtwt-lumi.sif",
                   "conda_env=pathtwt-rocm"], "jobs run in the image /tmp/pathtwt-lumi.sif"),
])
def test_lumi_profile_runs_the_rocm_env_or_the_container(tmp_path, route, extra, said):
    """LUMI never falls into the CUDA env: the profile selects pathtwt-rocm, and the
    container route plans with its image (a stand-in `apptainer` on PATH: the dry run
    only asks its version)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apptainer").write_text('#!/bin/sh\necho "apptainer version 1.3.4"\n')
    (fake / "apptainer").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    res = subprocess.run([str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(work), "-n",
                          "--profile", str(PROFILES / "lumi"), "--configfile", str(REPO / "config" / "config.yaml"),
                          *extra], capture_output=True, text=True, cwd=REPO, timeout=600,
                         env={**os.environ, "SBATCH_ACCOUNT": "project_465000042",
                              "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert said in res.stdout + res.stderr, route
