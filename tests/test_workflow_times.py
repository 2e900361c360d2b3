"""benchmarks/workflow_times.py reads per-rule job times from a Snakemake log."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LOG = """\
[Wed Dec  2 02:00:00 2026]
localrule tile:
    jobid: 3
    wildcards: slide=a
[Wed Dec  2 02:00:01 2026]
localrule tile:
    jobid: 4
[Wed Dec  2 02:00:05 2026]
Finished jobid: 3 (Rule: tile)
[Wed Dec  2 02:00:09 2026]
Finished jobid: 4 (Rule: tile)
[Wed Dec  2 02:00:09 2026]
localcheckpoint demo_slides:
    jobid: 7
[Wed Dec  2 02:01:39 2026]
Finished jobid: 7 (Rule: demo_slides)
"""


def test_job_times_per_rule_and_wall():
    spec = importlib.util.spec_from_file_location("workflow_times", REPO / "benchmarks" / "workflow_times.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    per_rule, wall = module.parse(LOG.splitlines())
    assert per_rule == {"tile": [5.0, 8.0], "demo_slides": [90.0]}
    assert wall == 99.0
