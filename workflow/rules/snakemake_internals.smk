# The workflow's only hold on Snakemake's private internals, each behind a version guard:
# on a Snakemake major it was not tested with, a patch is left out with a log line and
# Snakemake's default behaviour stays. pyproject.toml bounds the workflow extra to the
# same major; change both together, after testing (tests/test_local_profile.py,
# tests/test_slurm.py exercise all three patches).
import snakemake as _snakemake

# the Snakemake major these patches were written against and tested with
TESTED_SNAKEMAKE_MAJOR = 9


def _internals_tested(what):
    """True on the tested Snakemake major; else a log line saying ``what`` keeps Snakemake's default."""
    version = getattr(_snakemake, "__version__", "0")
    try:
        major = int(str(version).split(".")[0])
    except ValueError:
        major = None
    if major == TESTED_SNAKEMAKE_MAJOR:
        return True
    logger.info(
        f"pathtwt workflow: Snakemake {version} is not the tested major {TESTED_SNAKEMAKE_MAJOR}; "
        f"{what} is left to Snakemake's default"
    )
    return False


def keep_cpu_stages_off_gpus(rule_devices):
    """A cluster profile sends the GPU rules to its GPU partition (`set-resources`). A
    stage configured with `device: cpu` needs no GPU: its rules keep the default
    partition and ask for no GPU, so they neither wait for nor hold a GPU node. Applied
    to the profile's per-rule settings before the rules are defined (they pick them up
    there) and handed on to the submitted jobs the same way. ``rule_devices``: rule name ->
    the config section whose `device` it runs on."""
    if not _internals_tested("moving device-cpu stages off the profile's GPU partition"):
        return
    settings = workflow.resource_settings
    overwrite = getattr(settings, "_parsed_overwrite_resources", None)
    default = getattr(settings, "_parsed_default_resources", None)
    if overwrite is None or default is None:
        return
    cpu_partition = default["slurm_partition"].raw if "slurm_partition" in default else None
    # the loop variable is not called "rule": the linter takes that word, a space and a colon for a rule
    for name, section in rule_devices.items():
        if str(config[section].get("device", "")).lower() != "cpu" or name not in overwrite:
            continue
        if "slurm_partition" in overwrite[name] and cpu_partition is not None:
            overwrite[name]["slurm_partition"] = cpu_partition
            overwrite[name]["gpu"] = 0


def wake_local_scheduler_on_job_events_only():
    """Snakemake's job rate limit (`--max-jobs-per-timespan`, 100/1s by default) wakes its
    scheduler every second for as long as any job runs; each wake-up re-evaluates every
    ready job and stats all its input files. With ready jobs of 200 inputs each (a
    cohort's extraction waiting for the cores) that held half a core of a 2-core machine.
    A local run is bounded by its cores, not by a submission rate, so with the default
    limit it schedules on job events only (a job started or finished). An explicit
    `--max-jobs-per-timespan`, and every cluster executor, keep the limit."""
    scheduler = getattr(workflow, "scheduler", None)
    limiter = getattr(scheduler, "job_rate_limiter", None)
    if limiter is None or not workflow.local_exec or not _internals_tested("the local job rate limit"):
        return
    if (limiter.max_jobs, limiter.timespan) == (100, 1):  # Snakemake's default: not chosen by the user
        scheduler.job_rate_limiter = None
        logger.info("local run: jobs are scheduled when a job starts or ends (no job rate limit)")


def run_bookkeeping_jobs_in_process():
    """Snakemake spawns a fresh Snakemake process (workflow parsed again, about 3 s) for
    every job with a `run:` block. This workflow's `run:` blocks are its local bookkeeping
    (a file list, a cohort's extraction manifest, a failures merge: milliseconds each), so
    the local executors run them in the main process's job threads instead, as
    `--force-use-threads` would. Jobs with a `shell:` command are started as before."""
    scheduler = getattr(workflow, "scheduler", None)
    executors = [getattr(scheduler, name, None) for name in ("_executor", "_local_executor")]
    executors = [e for e in executors if e is not None and type(e).__module__ == "snakemake.executors.local"]
    if not executors or not _internals_tested("running run: blocks in this process"):
        return
    changed = False
    for executor in executors:
        if not executor.use_threads:
            executor.use_threads = changed = True
    if changed:
        logger.info("local bookkeeping jobs (run: blocks) run in this process, not in spawned ones")
