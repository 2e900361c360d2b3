"""pathtwt store: what the store holds (ls), the space it takes (du), pruning what no named
study uses (gc), and making one entry under its lock (make: what the workflow's jobs run)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pathtwt.cli.options import default_store

HELP = "list, measure and prune the store of tiles, models and features; make one entry (the workflow's jobs)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    store = default_store()

    p = sub.add_parser("ls", help="one line per entry: name, size, when made, what it is")
    _store_argument(p, store)

    p = sub.add_parser("du", help="entries and space on disk per kind")
    _store_argument(p, store)

    p = sub.add_parser("gc", help="remove the entries no named study uses (a dry run unless --yes)")
    _store_argument(p, store)
    p.add_argument("--keep-used-by", nargs="+", required=True, metavar="STUDY.yaml",
                   help="study configs whose entries stay (each as `snakemake --configfile` reads it; the store is "
                   "the first one's store: key unless --store is given)")
    p.add_argument("--yes", action="store_true", help="remove them (default: list what would be removed)")

    p = sub.add_parser("make", help="make one entry under its lock by running COMMAND (the workflow's jobs run this)")
    p.add_argument("--entry", required=True, help="the entry: a folder entry, a file entry's record, a slide's "
                   "features file or a features set")
    p.add_argument("--record", required=True, metavar="JSON|@FILE",
                   help='what the entry is made from: {"kind": ..., "inputs": {...}, "names": {...}}, or @ and the '
                   "file that holds it")
    p.add_argument("--extractor", metavar="JSON", help="a slide's features or a features set: the extractor's record (default: none)")
    p.add_argument("--files", nargs="*", default=[], metavar="FILE",
                   help="what COMMAND must leave (a folder entry: names in its build folder)")
    p.add_argument("--manifest", metavar="TSV", help="a features set: its slides (slide, coords, features per line); "
                   "COMMAND gets --manifest with those this run embeds (default: none)")
    p.add_argument("--check-slide", metavar="SLIDE", help="refuse if the slide's fingerprint is not the record's (default: no slide checked)")
    p.add_argument("--check-weights", metavar="FILE", help="refuse if the weights' sha256 is not the record's (default: no weights checked)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command that makes the entry")


def _store_argument(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--store", default=None, help=f"the store folder (default: {default})")


def run(args: argparse.Namespace) -> int:
    return {"ls": _ls, "du": _du, "gc": _gc, "make": _make}[args.action](args)


def _ls(args: argparse.Namespace) -> int:
    from pathtwt.io.store.layout import Store
    from pathtwt.io.store.maintenance import list_lines

    for line in list_lines(Store(args.store or default_store())):
        print(line)
    return 0


def _du(args: argparse.Namespace) -> int:
    from pathtwt.io.store.layout import Store
    from pathtwt.io.store.maintenance import _human, usage

    totals = usage(Store(args.store or default_store()))
    for kind, (n, size) in sorted(totals.items()):
        print(f"{kind}\t{n}\t{_human(size)}")
    print(f"total\t{sum(n for n, _ in totals.values())}\t{_human(sum(s for _, s in totals.values()))}")
    return 0


def _gc(args: argparse.Namespace) -> int:
    from pathtwt.config.products import entries_used_by
    from pathtwt.io.store.layout import Store
    from pathtwt.io.store.maintenance import _human, remove, unused

    root, keep = entries_used_by(args.keep_used_by, store=args.store)
    store = Store(root)
    store.check_marker()
    doomed = unused(store, keep)
    size = sum(e.size for e in doomed)
    for entry in doomed:
        print(f"{'removing' if args.yes else 'would remove'}\t{entry.name}\t{_human(entry.size)}")
    if not args.yes:
        print(f"{len(doomed)} entries ({_human(size)}) used by none of {', '.join(args.keep_used_by)}; "
              "run again with --yes to remove them")
        return 0
    from pathtwt.io.store.lock import stale_heartbeats

    for beat in stale_heartbeats(store):  # writers killed before they could remove theirs
        beat.unlink(missing_ok=True)
    freed, failed = remove(doomed)
    for line in failed:
        print(f"pathtwt store gc: {line}", file=sys.stderr)
    print(f"removed {len(doomed) - len(failed)} entries, {_human(freed)} freed")
    return 1 if failed else 0


def _make(args: argparse.Namespace) -> int:
    from pathtwt.errors import PathtwtError
    from pathtwt.io.store.layout import Store
    from pathtwt.io.store.make import Target, make_entry, run_command
    from pathtwt.io.store.records import new_record

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise PathtwtError("pathtwt store make: give the command after --")
    entry = Path(args.entry)
    plan = _json_arg(args.record)
    record = new_record(plan["kind"], plan["inputs"], plan.get("names"))
    store = Store.of_entry(record["kind"], entry)
    _check_named(entry, record)
    if record["kind"] == "features-set":
        return _make_features_set(args, store, entry, record, command)
    if record["kind"] == "extractor":  # one slide's features file (per-slide extraction jobs)
        return _make_slide_features(args, store, entry, record, command)
    folder = record["kind"] in ("discovery", "model")
    files = [Store.building(entry) / f if folder else Path(f) for f in args.files]
    target = Target(entry, record, files, folder)
    return make_entry(store, target, lambda: run_command(command), check=lambda: _job_time_checks(args, record),
                      say=_say)


def _json_arg(text: str) -> dict:
    """A JSON argument, or the JSON file ``@PATH`` names (a record too long for a command line)."""
    from pathtwt.errors import PathtwtError

    try:
        return json.loads(Path(text[1:]).read_text(encoding="utf-8") if text.startswith("@") else text)
    except (OSError, ValueError) as exc:
        raise PathtwtError(f"pathtwt store make: --record {text[:60]}: not JSON ({exc})") from None


def _say(line: str) -> None:
    print(f"pathtwt store: {line}", flush=True)


def _check_named(entry: Path, record: dict) -> None:
    """The entry's path names the key its record gives (a rule and its record that disagree
    are a bug of the workflow, said before anything is made)."""
    from pathtwt.errors import StoreError

    if record["kind"] != "extractor" and record["key"] not in entry.name:
        raise StoreError(f"{entry}: not the entry of the key its record gives ({record['key']})")


def _job_time_checks(args: argparse.Namespace, record: dict) -> None:
    """A slide or weights file changed between the plan and the job: the entry would not be
    what its key says; one line, and nothing made."""
    from pathtwt.errors import StoreError

    inputs = record["inputs"]
    if args.check_slide:
        from pathtwt.wsi.fingerprint import head_tail_sha256

        size, digest = head_tail_sha256(args.check_slide)
        planned = inputs["slide"]
        if (size, digest) != (int(planned["size"]), planned["sha256"]):
            raise StoreError(f"{args.check_slide}: changed since the workflow was planned (fingerprint "
                             f"{planned['sha256'][:12]} -> {digest[:12]}); run the workflow again: a changed slide "
                             "gets entries of its own")
    if args.check_weights:
        from pathtwt.config.slide_reads import cache_root
        from pathtwt.models.weights import WeightsHashes

        teacher = inputs.get("teacher") or (inputs.get("model") or {}).get("teacher") or {}
        planned = (teacher.get("weights") or {}).get("sha256")
        actual = WeightsHashes(cache_root() / "weights-sha256.json").sha256(args.check_weights)
        if planned and actual != planned:
            raise StoreError(f"{args.check_weights}: replaced since the workflow was planned (sha256 {planned[:12]} -> "
                             f"{actual[:12]}); run the workflow again: new weights get entries of their own")


def _make_features_set(args, store, entry, record, command) -> int:
    from pathtwt.errors import PathtwtError
    from pathtwt.io.store.features_set import make_features_set, read_manifest_rows, write_manifest_rows
    from pathtwt.io.store.make import run_command
    from pathtwt.io.store.records import new_record

    if not args.manifest or not args.extractor:
        raise PathtwtError("pathtwt store make: a features set needs --manifest and --extractor")
    extractor_plan = _json_arg(args.extractor)
    extractor = new_record("extractor", extractor_plan["inputs"], extractor_plan.get("names"))
    jobs = read_manifest_rows(args.manifest)
    mine = Path(args.manifest).with_name(f".{Path(args.manifest).name}.{os.getpid()}.run.tsv")

    def embed(claimed):
        write_manifest_rows(mine, claimed)
        try:
            return run_command([*command, "--manifest", str(mine)])
        finally:
            mine.unlink(missing_ok=True)

    _job_time_checks(args, extractor)
    return make_features_set(store, entry, record, extractor, jobs, embed, say=_say)


def _make_slide_features(args, store, entry, record, command) -> int:
    """A slide's features file: the entry is the file the command writes; its record is
    its extractor's, shared by the extractor's folder."""
    from pathtwt.io.store.layout import RECORD
    from pathtwt.io.store.make import Target, ensure_record, make_entry, run_command

    ensure_record(store, entry.parent / RECORD, record)
    return make_entry(store, Target(entry, record, own_record=False), lambda: run_command(command),
                      check=lambda: _job_time_checks(args, record), say=_say)
