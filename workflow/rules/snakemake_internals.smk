# The workflow's only hold on Snakemake's private internals, each behind a version guard:
# on a Snakemake major it was not tested with, a patch is left out with a log line and
# Snakemake's default behaviour stays. pyproject.toml bounds the workflow extra to the
# same major; change both together, after testing (tests/test_local_profile.py,
# tests/test_slurm.py exercise all three patches).
import snakemake as _snakemake

# the Snakemake major these patches were written against and tested with
TESTED_SNAKEMAKE_MAJOR = 9
_SAID = set()


def _internals_tested(what):
    """True on the tested Snakemake major; else a log line saying ``what`` keeps Snakemake's default."""
    version = getattr(_snakemake, "__version__", "0")
    try:
        major = int(str(version).split(".")[0])
    except ValueError:
        major = None
    if major == TESTED_SNAKEMAKE_MAJOR:
        return True
    if what in _SAID:  # one line per patch, however often it is asked
        return False
    _SAID.add(what)
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
    from snakemake.resources import Resources

    cpu_partition = default["slurm_partition"].raw if "slurm_partition" in default else None
    # the loop variable is not called "rule": the linter takes that word, a space and a colon for a rule
    for name, section in rule_devices.items():
        if str(config[section].get("device", "")).lower() != "cpu":
            continue
        # also without a profile entry: locally a CPU job does not count against --resources gpu=N
        rule_settings = overwrite.setdefault(name, Resources())
        if "slurm_partition" in rule_settings and cpu_partition is not None:
            rule_settings["slurm_partition"] = cpu_partition
        rule_settings["gpu"] = 0


def on_cluster():
    """A cluster profile gives every job a partition; a local run has none. That is read
    from the parsed profile (private), which also holds in a dry run; on an untested major,
    the executor's public flag (a dry run through a cluster profile then counts as local)."""
    if not _internals_tested("telling a cluster profile from a local run by its partition"):
        return not getattr(workflow, "local_exec", True)
    default = getattr(workflow.resource_settings, "_parsed_default_resources", None)
    return default is not None and "slurm_partition" in default


def give_compress_its_gpus():
    """`compress: {gpus: N}` runs one data-parallel rank per GPU. A profile's compress
    settings (`set-resources` memory, `set-threads`) are per GPU, so a multi-GPU job asks
    for N times them, and for N GPUs; the profile's partition and account stay (a
    command-line --set-resources would replace the profile's whole block). Done once,
    where the plan is made: a submitted job receives the results. A cluster profile's
    one-GPU limit per group job is lifted to N (a grouped extraction then gets up to N GPUs
    and its jobs claim one each, pathtwt.devices)."""
    gpus = int(config["compress"]["gpus"])
    if gpus <= 1 or str(config["compress"]["device"]).lower() == "cpu" or workflow.remote_exec:
        return
    # nothing is changed before the guard: on another major the run keeps Snakemake's own
    # limits (a too-small gpu limit then leaves the compress job unscheduled, not mangled)
    if not _internals_tested("scaling the profile's compress settings to compress.gpus"):
        return
    # the profiles' `resources: gpu=1` (one GPU per group job) caps every job's gpu: lift it
    limit = workflow.global_resources
    if "gpu" in limit and int(limit["gpu"].value) < gpus:
        if not on_cluster():
            raise WorkflowError(f"compress.gpus {gpus}: the run allows gpu={limit['gpu'].value}; "
                                f"give --resources gpu={gpus} or more (at most the machine's GPUs)")
        limit["gpu"] = gpus
    from snakemake.resources import Resource

    settings = workflow.resource_settings
    if "compress" in settings._parsed_overwrite_resources:
        per_gpu = settings._parsed_overwrite_resources["compress"]
        per_gpu["gpu"] = gpus
        if "mem_mb" in per_gpu:
            per_gpu["mem_mb"] = int(per_gpu["mem_mb"].value) * gpus
    threads = settings._parsed_overwrite_threads
    if "compress" in threads:
        threads["compress"] = Resource("_cores", int(threads["compress"].value) * gpus)


def check_local_gpus():
    """A local run starts at most one GPU job per visible GPU unless `--resources gpu=N`
    says otherwise (pathtwt.devices.local_gpu_jobs), and says so in one line at the start;
    N above the machine's GPUs is one line, before any job. Called before
    give_compress_its_gpus, which reads the limit."""
    from pathtwt.devices import local_gpu_jobs

    if workflow.remote_exec or on_cluster():
        return
    try:
        limit, line = local_gpu_jobs(workflow.resource_settings.resources.get("gpu"))
    except ConfigError as exc:
        raise WorkflowError(str(exc)) from None
    if limit is not None:
        if not _internals_tested("one GPU job per visible GPU"):
            return
        workflow.register_resource("gpu", limit)
    logger.info(line)


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
