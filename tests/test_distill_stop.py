"""A time limit on SLURM: SIGTERM reaches every process of the job, the tile-reading
workers included, and under torchrun each rank gets it twice (torchrun forwards it). A
real short distillation in its own process group is sent SIGTERM twice (to the whole
group, as SLURM does) and SIGINT in the middle of an optimiser step whose next
micro-batch the workers have not read yet: the run checkpoints at the end of that step,
exits as interrupted, and a rerun resumes from that step to the end. A stop during the
export leaves no weights file that looks finished."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import json, multiprocessing, os, signal, sys, time
    import numpy as np, torch
    from pathtwt.compress.distill import DeepSupervision, DistillOptions, distill, load_checkpoint

    class SlowTiles:
        # read slowly, so the main process always waits on the workers for its next micro-batch
        def __init__(self, tiles): self.tiles = tiles
        def __len__(self): return len(self.tiles)
        def read(self, i):
            time.sleep(0.2)
            return self.tiles[i]
        def describe(self): return {"source": "test"}

    class SignalOnce(DeepSupervision):
        def loss(self, student, x, targets, step):
            if step == 2 and os.environ.pop("SEND_SIGTERM", None):
                os.killpg(0, signal.SIGTERM)  # the whole group, as SLURM does at a time limit
                time.sleep(0.1)
                os.killpg(0, signal.SIGTERM)  # and again, as torchrun forwards it to its ranks
                time.sleep(0.1)
                os.kill(os.getpid(), signal.SIGINT)  # and a Ctrl-C on top
            return super().loss(student, x, targets, step)

    if __name__ == "__main__":
        # spawned workers do not inherit the main process's handler: the case of every
        # start method but fork (Python 3.14's default is forkserver)
        multiprocessing.set_start_method("spawn", force=True)
        from pathtwt.models.registry import create_backbone
        from pathtwt.compress.student import clone_layers, stitch_student

        teacher = create_backbone("vit-s14-tiny", pretrained=False, init_seed=5)
        tiles = np.random.default_rng(0).integers(0, 256, size=(8, 56, 56, 3), dtype=np.uint8)
        student = stitch_student(teacher.model, clone_layers(teacher.model, [0, 11]), spec=teacher.spec)
        options = DistillOptions(steps=4, batch_size=2, accumulate=2, seed=3, progress=False, checkpoint_every=0,
                                 loss_norm="none", augment=False, workers=1, checkpoint=sys.argv[1])
        try:
            result = distill(student, teacher.model, SlowTiles(tiles), transform=teacher.transform,
                             objective=SignalOnce([6, 12]), options=options)
        except KeyboardInterrupt:
            print(json.dumps({"stopped_at": load_checkpoint(sys.argv[1])["step"]}))
            sys.exit(130)
        print(json.dumps({"resumed_from": result.resumed_from, "steps": result.steps_done}))
""")


def _run(script: Path, ckpt: Path, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **env}
    # a session of its own: the signal sent to the group reaches only this run and its workers
    return subprocess.run([sys.executable, str(script), str(ckpt)], cwd=script.parent, env=environment,
                          capture_output=True, text=True, timeout=300, start_new_session=True)


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")
def test_sigterm_to_the_whole_job_checkpoints_the_step_and_resumes(tmp_path):
    script, ckpt = tmp_path / "run.py", tmp_path / "checkpoint.pt"
    script.write_text(SCRIPT)
    stopped = _run(script, ckpt, SEND_SIGTERM="1")
    assert stopped.returncode == 130, stopped.stderr[-2000:]
    # the signal came in step index 2 (the third step): that step finished and was saved
    assert json.loads(stopped.stdout.strip().splitlines()[-1]) == {"stopped_at": 3}
    resumed = _run(script, ckpt)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads(resumed.stdout.strip().splitlines()[-1]) == {"resumed_from": 3, "steps": 4}


def test_a_stop_during_the_export_leaves_no_weights_file_and_the_rerun_exports(tmp_path):
    from rank_faults import write_tiles

    tiles = write_tiles(tmp_path / "tiles", 8)
    out = tmp_path / "out"
    cmd = [sys.executable, str(REPO / "tests" / "rank_faults.py"), "compress", "--backbone", "vit-s14-tiny", "--random-init",
           "--calibration", str(tiles), "--depth", "2", "--steps", "2", "--batch-size", "4", "--audition-steps", "0",
           "--device", "cpu", "--precision", "fp32", "--no-progress", "--out", str(out)]
    launcher = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID")  # one process
    env = {**{k: v for k, v in os.environ.items() if k not in launcher}, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}",
           "OMP_NUM_THREADS": "1"}
    stopped = subprocess.run(cmd, env={**env, "RANK_FAULT": "stopexport:0"}, capture_output=True, text=True, timeout=300)
    assert stopped.returncode == 130, stopped.stderr[-2000:]
    assert stopped.stderr.strip().splitlines()[-1] == "pathtwt compress: interrupted"
    assert not (out / "model.safetensors").exists() and not (out / "model.json").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".") and "model" in p.name]  # no temporary left either
    assert (out / "checkpoint.pt").exists()  # the trained steps are kept
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    meta = json.loads((out / "model.json").read_text())
    assert meta["distillation"]["resumed_from"] == 2 and (out / "model.safetensors").exists()
