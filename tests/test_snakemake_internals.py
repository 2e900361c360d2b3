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
