"""The workflow's hold on Snakemake's private internals: only in
workflow/rules/snakemake_internals.smk, and each patch applied only on the tested Snakemake
major (elsewhere Snakemake's default stays, with a log line). The file is plain Python, so
it is run here against stand-in objects."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

RULES = Path(__file__).resolve().parents[1] / "workflow" / "rules"
INTERNALS = RULES / "snakemake_internals.smk"
PRIVATE = re.compile(r"_parsed_overwrite_resources|_parsed_default_resources|job_rate_limiter|use_threads")


def test_only_the_guarded_file_touches_snakemake_internals():
    touching = sorted(p.name for p in RULES.glob("*.smk") if PRIVATE.search(p.read_text()))
    assert touching == [INTERNALS.name]


class _Log:
    def __init__(self):
        self.lines = []

    def info(self, text):
        self.lines.append(text)


class _Resource:
    def __init__(self, raw):
        self.raw = raw


def _load(version: str):
    """The file's functions with a stand-in workflow (a local run, a cluster profile's
    per-rule resources), config and logger, as Snakemake ``version``."""
    log = _Log()
    local = type("LocalExecutor", (), {"__module__": "snakemake.executors.local"})()
    local.use_threads = False
    scheduler = types.SimpleNamespace(job_rate_limiter=types.SimpleNamespace(max_jobs=100, timespan=1),
                                      _executor=local, _local_executor=None)
    settings = types.SimpleNamespace(
        _parsed_overwrite_resources={"compress": {"slurm_partition": "gpu", "gpu": 1}},
        _parsed_default_resources={"slurm_partition": _Resource("cpu")},
    )
    workflow = types.SimpleNamespace(resource_settings=settings, scheduler=scheduler, local_exec=True)
    scope = {"workflow": workflow, "config": {"compress": {"device": "cpu"}}, "logger": log}
    exec(compile(INTERNALS.read_text(), str(INTERNALS), "exec"), scope)
    scope["_snakemake"] = types.SimpleNamespace(__version__=version)
    return scope, workflow, log


def test_on_the_tested_major_every_patch_applies():
    scope, workflow, log = _load(f"{_load('0')[0]['TESTED_SNAKEMAKE_MAJOR']}.3.1")
    scope["keep_cpu_stages_off_gpus"]({"compress": "compress"})
    scope["wake_local_scheduler_on_job_events_only"]()
    scope["run_bookkeeping_jobs_in_process"]()
    assert workflow.resource_settings._parsed_overwrite_resources["compress"] == {"slurm_partition": "cpu", "gpu": 0}
    assert workflow.scheduler.job_rate_limiter is None and workflow.scheduler._executor.use_threads is True
    assert not any("not the tested major" in line for line in log.lines)


@pytest.mark.parametrize("version", ["8.30.0", "10.0.0"])
def test_on_another_major_snakemake_keeps_its_defaults_and_says_so(version):
    scope, workflow, log = _load(version)
    scope["keep_cpu_stages_off_gpus"]({"compress": "compress"})
    scope["wake_local_scheduler_on_job_events_only"]()
    scope["run_bookkeeping_jobs_in_process"]()
    assert workflow.resource_settings._parsed_overwrite_resources["compress"] == {"slurm_partition": "gpu", "gpu": 1}
    assert workflow.scheduler.job_rate_limiter is not None and workflow.scheduler._executor.use_threads is False
    notes = [line for line in log.lines if f"Snakemake {version} is not the tested major" in line]
    assert len(notes) == 3 and all("\n" not in n for n in notes)


def test_pyproject_bounds_snakemake_to_the_tested_major():
    import tomllib

    scope, _, _ = _load("0")
    major = scope["TESTED_SNAKEMAKE_MAJOR"]
    project = tomllib.loads((RULES.parents[1] / "pyproject.toml").read_text())["project"]
    pins = [d for extra in ("workflow", "test") for d in project["optional-dependencies"][extra] if d.startswith("snakemake>")]
    assert pins and all(p == f"snakemake>={major},<{major + 1}" for p in pins)


def _compress_on_gpus(scope, workflow, gpus=2, cluster=True):
    """The stand-in as a run with ``compress.gpus: gpus`` and a profile's gpu=1 limit."""
    from snakemake.resources import Resource

    scope["config"] = {"compress": {"device": "cuda", "gpus": gpus}}
    scope["WorkflowError"] = RuntimeError
    workflow.remote_exec = False
    workflow.local_exec = not cluster
    workflow.global_resources = {"gpu": Resource("gpu", 1)}
    settings = workflow.resource_settings
    settings._parsed_overwrite_resources = {"compress": {"gpu": 1, "mem_mb": Resource("mem_mb", 1000)}}
    settings._parsed_overwrite_threads = {"compress": Resource("_cores", 8)}
    if not cluster:
        settings._parsed_default_resources = {}


def test_multi_gpu_compress_scales_on_the_tested_major():
    scope, workflow, _ = _load(f"{_load('0')[0]['TESTED_SNAKEMAKE_MAJOR']}.1.0")
    _compress_on_gpus(scope, workflow)
    scope["give_compress_its_gpus"]()
    assert workflow.global_resources["gpu"] == 2
    assert workflow.resource_settings._parsed_overwrite_resources["compress"]["mem_mb"] == 2000
    assert workflow.resource_settings._parsed_overwrite_threads["compress"].value == 16


@pytest.mark.parametrize("version", ["8.30.0", "10.0.0"])
def test_on_another_major_multi_gpu_compress_changes_nothing(version):
    scope, workflow, log = _load(version)
    _compress_on_gpus(scope, workflow)
    scope["give_compress_its_gpus"]()
    # the run's own gpu limit is Snakemake's, untouched (it was changed before the guard once)
    assert workflow.global_resources["gpu"].value == 1
    assert workflow.resource_settings._parsed_overwrite_threads["compress"].value == 8
    assert sum(f"Snakemake {version} is not the tested major" in line for line in log.lines) == 1


@pytest.mark.parametrize("version", ["8.30.0", "10.0.0"])
@pytest.mark.parametrize("cluster", [True, False])
def test_on_another_major_a_cluster_is_told_by_the_public_executor_flag(version, cluster):
    scope, workflow, log = _load(version)
    workflow.local_exec = not cluster
    # the private partition would say "cluster" in both cases: it is not read
    assert scope["on_cluster"]() is cluster
    assert scope["on_cluster"]() is cluster
    assert sum("not the tested major" in line for line in log.lines) == 1  # said once


def test_a_local_run_registers_one_gpu_job_per_visible_gpu(monkeypatch):
    from pathtwt.errors import ConfigError

    scope, workflow, log = _load(f"{_load('0')[0]['TESTED_SNAKEMAKE_MAJOR']}.1.0")
    registered = {}
    workflow.remote_exec = False
    workflow.resource_settings._parsed_default_resources = {}  # no partition: local
    workflow.resource_settings.resources = {}  # no --resources gpu=N
    workflow.register_resource = registered.__setitem__
    scope.update(ConfigError=ConfigError, WorkflowError=RuntimeError)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    scope["check_local_gpus"]()
    assert registered == {"gpu": 2}
    assert log.lines[-1].startswith("pathtwt workflow: at most 2 GPU job(s) at a time, one per visible GPU")
    # --resources gpu=3 on that machine: one line, nothing registered
    registered.clear()
    workflow.resource_settings.resources = {"gpu": 3}
    with pytest.raises(RuntimeError, match=r"^--resources gpu=3: this machine shows 2 GPU\(s\); give at most gpu=2"):
        scope["check_local_gpus"]()
    assert registered == {}
