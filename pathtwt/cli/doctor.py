"""pathtwt doctor: what this machine can run, one line a check (OK, WARN or FAIL with the
fix); exit 1 if any check fails."""

from __future__ import annotations

import argparse
import json

from pathtwt.cli.options import default_store

HELP = ("what this machine can run: Python, torch and its build, the driver, each GPU, the GPU JPEG decoders, "
        "the slide readers, /dev/shm, the store, Snakemake and SLURM, the CPU's matrix units; one line a check, "
        "OK / WARN / FAIL with the fix; exit 1 if any check fails")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", default=None, help=f"the store folder to check (default: {default_store()})")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="loader workers a job would start, for the /dev/shm check (default: the cores this "
                        "job may use minus one)")
    parser.add_argument("--json", action="store_true", help="print the checks and their facts as JSON instead")


def run(args: argparse.Namespace) -> int:
    from pathtwt.bench.doctor import Context, as_json, exit_code, run_checks
    from pathtwt.devices import available_cores

    ctx = Context(store=args.store or default_store(),
                  workers=args.workers if args.workers is not None else max(1, available_cores() - 1))
    rows = run_checks(ctx)
    if args.json:
        print(json.dumps({"checks": as_json(rows), "exit": exit_code(rows)}, indent=1))
    else:
        for row in rows:
            print(row.line())
        failed = sum(r.status == "FAIL" for r in rows)
        warned = sum(r.status == "WARN" for r in rows)
        print(f"{len(rows)} checks: {failed} FAIL, {warned} WARN")
    return exit_code(rows)
