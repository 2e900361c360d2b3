"""pathtwt extract: tile embeddings of one or more slides with one loaded backbone."""

from __future__ import annotations

import argparse
import json

from pathtwt.models.recipes import DEFAULT_RECIPE, RECIPES

from pathtwt.cli.options import (
    add_decode_argument, add_device_argument, add_extract_batch_argument, add_normalisation_arguments,
    add_precision_argument, add_progress_argument, add_threads_argument, add_workers_argument, backbone_help,
    backbone_request, show_progress,
)

HELP = "embed every tile of a slide (or of each slide in a manifest) with a backbone into HDF5"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("slides", nargs="*", metavar="SLIDE", help="slide file(s); pair each with --coords and --out")
    parser.add_argument("--coords", nargs="+", default=[], metavar="COORDS.h5", help="coords file per slide (pathtwt tile)")
    parser.add_argument("--out", nargs="+", default=[], metavar="OUT.h5", help="features file per slide")
    parser.add_argument(
        "--manifest", metavar="TSV",
        help="tab-separated slide, coords, out per line, instead of SLIDE/--coords/--out (default: none)",
    )
    parser.add_argument("--backbone", required=True, help=backbone_help())
    add_normalisation_arguments(parser)
    parser.add_argument(
        "--weights",
        help="local weights file or Hugging Face snapshot folder (default: the registry's: a local weights "
        "folder, then the hub unless HF_HUB_OFFLINE is set)",
    )
    parser.add_argument(
        "--random-init", action="store_true", help="the architecture with random weights (tests and offline demos)"
    )
    parser.add_argument(
        "--embedding", default=DEFAULT_RECIPE, choices=RECIPES,
        help="tile embedding: concat(CLS, mean of patch tokens) (2 x width, the paper's) or the CLS token alone "
        "(1 x width, as TRIDENT)",
    )
    add_extract_batch_argument(parser)
    add_device_argument(parser)
    add_precision_argument(parser)
    add_workers_argument(parser, "tile-reading processes")
    add_threads_argument(parser)
    add_decode_argument(parser)
    parser.add_argument("--skip-existing", action="store_true", help="leave features files that already exist")
    parser.add_argument(
        "--failures", metavar="TSV", default=None,
        help="this run's failures table (one per job; the workflow merges them per cohort): a slide that "
        "fails (corrupt tile, NaN features) is recorded there and gets a features file with status 'failed', "
        "and the run goes on; the table is written even when nothing fails (default: the first failure stops "
        "the run)",
    )
    parser.add_argument(
        "--force", action="store_true",
        help="skip the check that each slide is the one its coords file was made from (size, levels, mpp, "
        "file fingerprint); only for a scan re-saved with the same geometry",
    )
    add_progress_argument(parser)


def run(args: argparse.Namespace) -> int:
    import torch

    from pathtwt.devices import use_device
    from pathtwt.errors import PathtwtError
    from pathtwt.features.extract import extract_many
    from pathtwt.features.jobs import jobs_from_lists, read_manifest
    from pathtwt.features.options import ExtractOptions

    if args.manifest and (args.slides or args.coords or args.out):
        raise PathtwtError("give either --manifest or SLIDE --coords --out, not both")
    jobs = read_manifest(args.manifest) if args.manifest else jobs_from_lists(args.slides, args.coords, args.out)
    if not jobs:
        raise PathtwtError("nothing to extract: give SLIDE --coords COORDS.h5 --out OUT.h5 or --manifest TSV")
    folders = [str(job.out) for job in jobs if job.out.is_dir()]
    if folders:
        raise PathtwtError(f"--out {folders[0]}: is a folder; give the features file to write, e.g. {folders[0]}/SLIDE.h5")
    if args.threads is not None and args.threads < 1:
        raise PathtwtError(f"--threads must be >= 1, got {args.threads}")
    if args.workers is not None and args.workers < 0:
        raise PathtwtError(f"--workers must be >= 0 (0 reads tiles in the main process), got {args.workers}")
    if args.threads:
        torch.set_num_threads(args.threads)
    from pathtwt.features.backbone import load_backbone
    from pathtwt.features.decoding import resolve_decode

    device = use_device(args.device)
    resolve_decode(args.decode, device)  # `gpu` without CUDA: one line before any model loads
    backbone, autocast = load_backbone(backbone_request(args), device)
    options = ExtractOptions(
        batch_size=args.batch_size, workers=args.workers, decode=args.decode, embedding=args.embedding,
        progress=show_progress(args), skip_existing=args.skip_existing, failures=args.failures, force=args.force,
        bf16_autocast=autocast,
    )
    summaries = extract_many(jobs, backbone, options)
    for summary in summaries:
        print(json.dumps(summary))
    return 0
