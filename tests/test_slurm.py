"""A real SLURM run of the workflow: a throwaway single-node cluster from Debian's
packages (slurmctld, slurmd, munge; no cgroups: proctrack/linuxproc and task/none; no
accounting database), then a small DAG of the workflow (tile every slide of a cohort of
three synthetic slides, and write its thumbnails) through `--profile workflow/profiles/slurm`,
whose `group-components` submit the three tile jobs as one SLURM job. Checks that they
went through sbatch as one group and that the outputs are right. The config must sit at /etc/slurm/slurm.conf: the
plugin's job step drops SLURM_CONF. Daemons run in the foreground of processes this test
starts and are stopped by their PIDs. Skips with a reason where SLURM is not installed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SLURM_CONF = Path("/etc/slurm/slurm.conf")
MARKER = "# written by pathtwt tests/test_slurm.py"
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol")
# squeue forgets a finished job MinJobAge seconds after it ends; the plugin only trusts
# squeue when MinJobAge >= 3 x its init seconds (else it falls back to sacct, which fails
# without slurmdbd).
MIN_JOB_AGE = 600


def missing_requirements() -> str | None:
    """Why the cluster cannot be started here, or None."""
    absent = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if absent:
        return f"SLURM binaries absent ({', '.join(absent)}); `apt-get install slurmctld slurmd slurm-client munge`"
    if os.geteuid() != 0:
        return "the single-node SLURM cluster needs root (it writes /etc/slurm/slurm.conf)"
    if SLURM_CONF.exists() and MARKER not in SLURM_CONF.read_text(errors="replace"):
        return f"{SLURM_CONF} exists and was not written by this test; not overwriting a real cluster config"
    if not Path("/etc/munge/munge.key").exists():
        return "/etc/munge/munge.key is absent (the munge package creates it)"
    return None


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _node_resources() -> tuple[int, int]:
    out = subprocess.run([_exe("slurmd"), "-C"], capture_output=True, text=True, check=True).stdout
    fields = dict(tok.split("=", 1) for tok in out.split() if "=" in tok)
    return int(fields["CPUs"]), int(fields["RealMemory"])


def slurm_conf(state: Path, host: str, cpus: int, mem_mb: int, partition: str) -> str:
    return f"""{MARKER}
ClusterName=pathtwt-test
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/d
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd.pid
SlurmctldLogFile={state}/slurmctld.log
SlurmdLogFile={state}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge={MIN_JOB_AGE}
DefMemPerCPU=500
ReturnToService=2
SchedulerParameters=sched_interval=1
MessageTimeout=30
NodeName={host} CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName={partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class Cluster:
    state: Path
    partition: str
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    wrote_conf: bool = False

    def start(self, timeout: float = 30.0) -> None:
        host = socket.gethostname().split(".")[0]
        cpus, mem = _node_resources()
        for sub in ("ctld", "d", "munge"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
        SLURM_CONF.write_text(slurm_conf(self.state, host, cpus, mem, self.partition))
        self.wrote_conf = True
        munge_dir = self.state / "munge"
        shutil.chown(munge_dir, "munge", "munge") if _has_user("munge") else None
        self._spawn(
            "munged",
            [_exe("munged"), "--foreground", "--force",
             f"--socket={Path('/run/munge/munge.socket.2')}", f"--pid-file={munge_dir}/munged.pid"],
        )
        self._wait(lambda: Path("/run/munge/munge.socket.2").exists(), timeout, "munged socket")
        # -c: clean start (forget jobs of an earlier run); -i: ignore a stale state.
        self._spawn("slurmctld", [_exe("slurmctld"), "-D", "-c", "-i"])
        self._wait(lambda: _ok(["scontrol", "ping"], "UP"), timeout, "slurmctld")
        self._spawn("slurmd", [_exe("slurmd"), "-D"])
        self._wait(lambda: _ok(["sinfo", "-h", "-o", "%t"], "idle"), timeout, "an idle node")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        log = open(self.state / f"{name}.out", "wb")
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait(self, cond, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead[0]} exited; see {self.state}/{dead[0]}.out and the logs there")
            if cond():
                return
            time.sleep(0.3)
        raise RuntimeError(f"timed out waiting for {what}; see the logs in {self.state}")

    def stop(self) -> None:
        # Reverse start order, by the PIDs this object started.
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        self.procs.clear()
        if self.wrote_conf and SLURM_CONF.exists() and MARKER in SLURM_CONF.read_text(errors="replace"):
            SLURM_CONF.unlink()

    def log_text(self) -> str:
        path = self.state / "slurmctld.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _has_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _ok(cmd: list[str], needle: str) -> bool:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0 and needle in res.stdout


REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
PARTITION = "pathtwt-test"
COHORT = "lymph-nodes"

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    c = Cluster(state=tmp_path_factory.mktemp("slurm"), partition=PARTITION)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def test_workflow_runs_through_slurm(cluster, tmp_path):
    import h5py
    import yaml

    # Three small synthetic slides and their label table, written here: the plugin's status
    # checks back off by 10 s per check, so a wave of jobs less saves tens of seconds.
    slides_dir = tmp_path / "data" / "slides"
    pathtwt = str(Path(sys.executable).parent / "pathtwt")
    rows = []
    for i, label in enumerate((0, 1, 1)):
        slide = f"s{i}"
        subprocess.run(
            [pathtwt, "demo", "make-slide", "--out", str(slides_dir / f"{slide}.tiff"), "--width", "1536",
             "--height", "1024", "--mpp", "0.5", "--task", "metastasis", "--label", str(label), "--seed", str(i)],
            check=True, capture_output=True, timeout=60,
        )
        rows.append(f"{slide},{label},test\n")
    (tmp_path / "data" / "labels.csv").write_text("slide_id,label,split\n" + "".join(rows))
    config = {"cohorts": {COHORT: {
        "slides": "data/slides", "labels": "data/labels.csv", "splits": ["test"],
        "tiling": {"tile_size": 224, "tissue": "otsu"},
    }}}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(config))
    cmd = [
        str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path), "all_tiles",
        "--configfile", str(tmp_path / "test.yaml"),
        "--profile", str(REPO / "workflow" / "profiles" / "slurm"),
        # test-local overrides: this cluster's partition, small requests, quick first status check
        "--default-resources", f"slurm_partition={PARTITION}", "mem_mb=500", "runtime=10",
        "--slurm-init-seconds-before-status-checks", "2", "--latency-wait", "5", "--jobs", "4",
        # the group job tiles one slide at a time, so it fits this small node's cores and memory
        "--resources", "cpu_slots=1",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=240)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-4000:] + "\n--- slurmctld ---\n" + cluster.log_text()[-2000:]

    slides = ["s0", "s1", "s2"]
    n_tiles = 0
    for slide in slides:
        with h5py.File(tmp_path / "results/test/tiles" / COHORT / f"{slide}.h5", "r") as h5:
            assert h5.attrs["status"] in ("ok", "no_tissue")
            assert h5.attrs["patch_size"] == 224 and h5["coords"].shape[1] == 2
            assert str(h5.attrs["slide_path"]).endswith(f"{slide}.tiff")
            n_tiles += h5["coords"].shape[0]
            coords = h5["coords"][()]
        assert (tmp_path / "results/test/thumbnails" / COHORT / f"{slide}.png").stat().st_size > 0
    assert n_tiles > 0
    # the cluster job computed what the command computes here
    subprocess.run([pathtwt, "tile", str(slides_dir / "s2.tiff"), "--out", str(tmp_path / "local.h5"),
                    "--tile-size", "224", "--tissue", "otsu"], check=True, capture_output=True, timeout=60)
    with h5py.File(tmp_path / "local.h5", "r") as h5:
        assert (h5["coords"][()] == coords).all() and len(coords) > 0

    # Every job went through sbatch, the three tile jobs as one group job (the profile's
    # `group-components: tile=100`): the controller allocated one job, and the plugin
    # kept its SLURM log.
    n_jobs = 1
    allocated = re.findall(r"sched: Allocate JobId=(\d+)", cluster.log_text())
    assert len(allocated) == n_jobs
    slurm_logs = list((tmp_path / ".snakemake" / "slurm_logs").rglob("*.log"))
    assert sum("group_tile" in str(p) for p in slurm_logs) == 1



def test_compress_job_runs_two_data_parallel_ranks_through_slurm(cluster, tmp_path):
    """tile -> calibrate -> discover -> compress through sbatch, the compress job with 2
    gloo ranks on CPU (launched by torchrun inside the job), streaming the training slides
    less the calibration's held-out slide."""
    import json

    import yaml

    slides_dir = tmp_path / "data" / "slides"
    pathtwt = str(Path(sys.executable).parent / "pathtwt")
    rows = []
    for i in range(3):
        subprocess.run(
            [pathtwt, "demo", "make-slide", "--out", str(slides_dir / f"t{i}.tiff"), "--width", "1536", "--height", "1024",
             "--mpp", "0.5", "--task", "metastasis", "--label", str(i % 2), "--seed", str(i)],
            check=True, capture_output=True, timeout=60,
        )
        rows.append(f"t{i},{i % 2},train\n")
    (tmp_path / "data" / "labels.csv").write_text("slide_id,label,split\n" + "".join(rows))
    config = {
        "cohorts": {"train-cohort": {"slides": "data/slides", "labels": "data/labels.csv",
                                     "tiling": {"tile_size": 224, "tissue": "otsu"}}},
        "tasks": {"metastasis": {"cohort": "train-cohort", "classes": 2, "metric": "accuracy", "protocol": "metastasis"}},
        # no weights here: the tiny ViT of the same structure with random weights
        "backbones": {"vit-s14-imgfocus": {"weights": "absent.safetensors", "fallback": "vit-s14-tiny",
                                           "variants": ["twt-2"]}},
        "variants": {"twt-2": {"method": "twt", "depth": 2}},
        "calibration": {"n_tiles": 24, "holdout": 0.3, "holdout_by": "slide"},
        "discovery": {"batch_size": 8},
        "compress": {"steps": 6, "batch_size": 4, "device": "cpu", "cpu_ranks": 2, "stream": True, "precision": "fp32",
                     "audition_steps": 0, "augment": False, "extra_args": "--workers 0"},
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(config))
    # the study's folder of the model (links into the store's entry, which the compress job makes)
    target = "results/test/models/vit-s14-tiny/twt-2"
    cmd = [
        str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path), target,
        "--configfile", str(tmp_path / "test.yaml"),
        "--profile", str(REPO / "workflow" / "profiles" / "slurm"),
        "--default-resources", f"slurm_partition={PARTITION}", "mem_mb=500", "runtime=10",
        # this cluster has no GPUs: the GPU rules run on its one partition, on CPU
        "--set-resources", *(f"{rule}:{key}" for rule in ("discover", "compress")
                             for key in (f"slurm_partition={PARTITION}", "gpu=0", "mem_mb=1500")),
        # the profile asks 8 cores per GPU job; this node has 2, and SLURM would hold the jobs forever
        "--set-threads", "discover=2", "compress=2",
        "--slurm-init-seconds-before-status-checks", "2", "--latency-wait", "5", "--jobs", "4",
        # the tile group job tiles one slide at a time, so it fits this small node's cores
        "--resources", "cpu_slots=1",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=480)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-4000:] + "\n--- slurmctld ---\n" + cluster.log_text()[-2000:]

    compress_log = next((tmp_path / "logs/test/compress").glob("*.log")).read_text()  # named by the entry's key
    assert "6 optimiser steps of 4 tiles (4 x 1 accumulated, 2 rank(s) x 2)" in compress_log
    meta = json.loads((tmp_path / target / "model.json").read_text())
    assert meta["name"] == "vit-s14-tiny/twt-2" and meta["distillation"]["steps"] == 6
    training = meta["distillation"]["training"]
    assert len(training["excluded_slides"]) == 1 and training["slides"] == 2  # one slide held out
    slurm_logs = list((tmp_path / ".snakemake" / "slurm_logs").rglob("*.log"))
    assert any("rule_compress" in str(p) for p in slurm_logs)  # the compress job went through sbatch
