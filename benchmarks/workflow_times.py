"""Per-rule job time of a Snakemake run, read from its log, and the run's wall time.

    .venv/bin/python benchmarks/workflow_times.py [.snakemake/log/<run>.snakemake.log] [--json out.json]

Without a path, the newest log under ``.snakemake/log``. For each rule: the number of jobs,
the sum of their durations (from the ``[date] ... rule X: jobid N`` line to ``Finished
jobid: N``), the longest job, and the share of the summed job time; jobs that run side by
side overlap, so the sums add up to more than the wall time on a machine with spare cores.

Measures: no time of its own: the per-rule job time of a Snakemake run (jobs, summed and longest durations,
share) and the run's wall time, read from its log.
Command: `PYTHONPATH=$PWD .venv/bin/python benchmarks/workflow_times.py LOG --json out.json` (smallest, any
log); without LOG the newest under .snakemake/log.
JSON keys: `log`, `wall_s`, `rules`: rule -> the seconds of each of its jobs.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime
from pathlib import Path

STAMP = re.compile(r"^\[(\w{3} \w{3}\s+\d+ \d\d:\d\d:\d\d \d{4})\]$")
START = re.compile(r"^(?:local)?(?:rule|checkpoint) (\S+):$")
JOBID = re.compile(r"^\s+jobid: (\d+)$")
FINISHED = re.compile(r"^Finished jobid: (\d+)")


def parse(lines: list[str]) -> tuple[dict[str, list[float]], float]:
    """{rule: [job seconds, ...]} and the wall seconds from the first to the last stamp."""
    stamp: datetime | None = None
    first: datetime | None = None
    pending_rule: str | None = None
    started: dict[str, tuple[str, datetime]] = {}
    per_rule: dict[str, list[float]] = {}
    for line in lines:
        line = line.rstrip("\n")
        m = STAMP.match(line)
        if m:
            stamp = datetime.strptime(" ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y")
            first = first or stamp
            continue
        m = START.match(line)
        if m:
            pending_rule = m.group(1)
            continue
        m = JOBID.match(line)
        if m and pending_rule is not None and stamp is not None:
            started[m.group(1)] = (pending_rule, stamp)
            pending_rule = None
            continue
        m = FINISHED.match(line)
        if m and m.group(1) in started and stamp is not None:
            rule, t0 = started.pop(m.group(1))
            per_rule.setdefault(rule, []).append((stamp - t0).total_seconds())
    wall = (stamp - first).total_seconds() if stamp and first else 0.0
    return per_rule, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", nargs="?", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    path = args.log
    if path is None:
        logs = sorted(Path(".snakemake/log").glob("*.snakemake.log"), key=lambda p: p.stat().st_mtime)
        if not logs:
            print("no Snakemake log under .snakemake/log; pass the log's path", file=sys.stderr)
            return 1
        path = logs[-1]
    per_rule, wall = parse(path.read_text().splitlines())
    total = sum(sum(v) for v in per_rule.values())
    print(f"{path}: wall {wall:.0f} s, summed job time {total:.0f} s")
    print("| rule | jobs | job time s | longest s | share of job time |")
    print("|---|---|---|---|---|")
    for rule, times in sorted(per_rule.items(), key=lambda kv: -sum(kv[1])):
        print(f"| {rule} | {len(times)} | {sum(times):.0f} | {max(times):.0f} | {sum(times) / total:.0%} |")
    if args.json:
        from pathtwt.io.atomic import write_json_atomic

        write_json_atomic(args.json, {"log": str(path), "wall_s": wall, "rules": per_rule})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
