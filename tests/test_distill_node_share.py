"""Two gloo ranks on one node distil in-memory tiles with the teacher-target cache: the
node holds one copy of the cache (both ranks map the same shared memory), each rank
computes half of its chunks, every pass around the steps (bf16 check, loss normalisation,
cache chunks) runs at most a rank's micro-batch of tiles, and the student is the one a
single process trains."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).parent / "torchrun"
BATCH, TILES, STEPS = 4, 12, 3

SCRIPT = textwrap.dedent(f"""
    import json, os, sys
    import numpy as np, torch
    sys.path.insert(0, {str(REPO / "tests")!r})
    from tiny_teacher import tiny_teacher
    from pathtwt.compress import ranks, targets
    from pathtwt.compress.distill import DeepSupervision, DistillOptions, distill
    from pathtwt.compress.student import clone_layers, stitch_student

    def run(out):
        teacher = tiny_teacher(5)
        student = stitch_student(teacher.model, clone_layers(teacher.model, [0, 5, 11]), spec=teacher.spec)
        tiles = np.random.default_rng(0).integers(0, 256, size=({TILES}, 56, 56, 3), dtype=np.uint8)
        passes, cache_tiles, maps = [], [], []
        teacher.model.patch_embed.register_forward_hook(lambda m, args, out_: passes.append(len(args[0])))
        computed = targets.teacher_targets
        targets.teacher_targets = lambda o, t, x, p: cache_tiles.append(len(x)) or computed(o, t, x, p)
        settle = targets.TargetCache.settle

        def settle_and_look(cache, device):
            with open("/proc/self/maps") as fh:
                maps.extend(sorted({{line.split()[4] for line in fh if "pathtwt-teacher-targets" in line}}))
            return settle(cache, device)

        targets.TargetCache.settle = settle_and_look
        result = distill(student, teacher.model, tiles, transform=teacher.transform, objective=DeepSupervision([1, 6, 12]),
                         options=DistillOptions(steps={STEPS}, batch_size={BATCH}, seed=3, progress=False,
                                                precision="bf16", bf16_tolerance=1.0, augment=False))
        torch.save(student.state_dict(), f"{{out}}.pt")
        with open(f"{{out}}.json", "w") as fh:
            json.dump({{"passes": passes, "cache_tiles": cache_tiles, "maps": maps, "targets": result.targets,
                       "loss": [h["loss"] for h in result.history]}}, fh)

    if __name__ == "__main__":
        ranks.init_from_env("cpu")
        try:
            run(os.path.join(sys.argv[1], f"rank{{ranks.rank()}}" if ranks.world_size() > 1 else "single"))
        finally:
            ranks.shutdown()
""")


def test_two_ranks_of_a_node_share_one_target_cache(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for launcher in ([str(TORCHRUN), "--standalone", "--nproc-per-node=2"], [sys.executable]):
        done = subprocess.run([*launcher, str(script), str(tmp_path)], capture_output=True, text=True, env=env,
                              timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rank = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    single = json.loads((tmp_path / "single.json").read_text())
    local = BATCH // 2
    for r in rank:
        # one shared-memory file for the node, mapped by both ranks
        assert r["targets"]["sharers"] == 2 and len(r["maps"]) == 1
        # every teacher pass (the bf16 check, the loss normalisation, the cache chunks) at a rank's micro-batch
        assert max(r["passes"]) <= local, r["passes"]
        # each rank computed half of the cache (beside 1-tile shape probes)
        assert sum(n for n in r["cache_tiles"] if n > 1) == TILES // 2, r["cache_tiles"]
    assert rank[0]["maps"] == rank[1]["maps"]
    assert single["targets"]["sharers"] == 1 and max(single["passes"]) <= BATCH
    assert sum(n for n in single["cache_tiles"] if n > 1) == TILES
    # the shared targets are the right ones: the first step's loss (before any update) is
    # the single process's, the later ones to bf16 rounding of passes of 2 tiles instead of
    # 4; half of the targets wrong or missing would change them at once
    assert rank[0]["loss"] == rank[1]["loss"] and np.isclose(rank[0]["loss"][0], single["loss"][0], rtol=1e-4)
    assert np.allclose(rank[0]["loss"], single["loss"], rtol=1e-2)
    a, b = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_path_that_resolves_to_another_file_is_not_mapped_and_said_once(tmp_path, monkeypatch, caplog):
    """Ranks in PID namespaces of their own see another process under the leader's pid: its
    ``/proc/<pid>/fd/<n>`` is some other file. Here that process is a helper holding a file
    of its own at the memfd's descriptor number: nothing is written to the file, and every
    rank keeps its own copy, said once."""
    import logging
    import time
    from types import SimpleNamespace

    from pathtwt.compress import node_shared, ranks

    other = tmp_path / "someone-elses.log"
    other.write_bytes(b"their data\n")
    helpers = []

    def memfd_create(name):
        fd = os.memfd_create(name)
        ready = tmp_path / "ready"
        helpers.append(subprocess.Popen([sys.executable, "-c", (
            "import os, sys, time; f = os.open(sys.argv[1], os.O_RDWR); os.dup2(f, int(sys.argv[2])); "
            "open(sys.argv[3], 'w').close(); time.sleep(60)"), str(other), str(fd), str(ready)]))
        end = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < end:
            time.sleep(0.02)
        return fd

    fake_os = SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
    fake_os.memfd_create = memfd_create
    fake_os.getpid = lambda: helpers[0].pid  # the leader's pid, as another namespace sees it
    monkeypatch.setattr(node_shared, "os", fake_os)
    monkeypatch.setattr(ranks, "world_size", lambda: 2)
    monkeypatch.setattr(ranks, "rank", lambda: 0)
    monkeypatch.setattr(ranks, "gather_json", lambda value, default=None: [json.loads(json.dumps(value))] * 2)
    try:
        with caplog.at_level(logging.WARNING, logger=node_shared.log.name):
            shared = node_shared.node_tensors([(64, 16)])
    finally:
        for helper in helpers:
            helper.kill()
            helper.wait()
    assert other.read_bytes() == b"their data\n"
    assert shared.sharers == 1 and shared.tensors[0].shape == (64, 16)
    said = [r.getMessage() for r in caplog.records if "one copy per rank" in r.getMessage()]
    assert len(said) == 1 and "not the node's shared memory" in said[0], said
