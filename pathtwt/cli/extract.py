"""pathtwt extract: tile embeddings of one or more slides with one loaded backbone."""

from __future__ import annotations

import argparse
import json

HELP = "embed every tile of a slide (or of each slide in a manifest) with a backbone into HDF5"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("slides", nargs="*", metavar="SLIDE", help="slide file(s); pair each with --coords and --out")
    parser.add_argument("--coords", nargs="+", default=[], metavar="COORDS.h5", help="coords file per slide (pathtwt tile)")
    parser.add_argument("--out", nargs="+", default=[], metavar="OUT.h5", help="features file per slide")
    parser.add_argument(
        "--manifest", metavar="TSV", help="tab-separated slide, coords, out per line (instead of SLIDE/--coords/--out)"
    )
    parser.add_argument("--backbone", required=True, help="registry name (h0-mini, hibou-b, ...) or variant folder")
    parser.add_argument("--weights", help="local weights file or Hugging Face snapshot folder")
    parser.add_argument(
        "--random-init", action="store_true", help="the architecture with random weights (tests and offline demos)"
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                        help="auto (default): bf16 autocast over fp32 weights where the device has native bf16, kept "
                        "only if the run's first batch agrees with fp32 (cosine >= 0.999, else fp32; see the features "
                        "files' precision_check), otherwise the backbone's default; bf16/fp16: weights cast")
    parser.add_argument("--workers", type=int, default=None, help="tile-reading processes (default: cores - 1, at most 4)")
    parser.add_argument("--threads", type=int, default=None, help="compute threads (default: torch's choice)")
    parser.add_argument("--skip-existing", action="store_true", help="leave features files that already exist")
    parser.add_argument(
        "--failures", metavar="TSV", default=None,
        help="per-cohort failures table: a slide that fails (corrupt tile, NaN features) is recorded there and "
        "gets a features file with status 'failed', and the run goes on (default: the first failure stops it)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    import torch

    from pathtwt.models.registry import create_backbone
    from pathtwt.devices import resolve_device
    from pathtwt.errors import PathtwtError
    from pathtwt.features.extract import extract_many, jobs_from_lists, read_manifest

    if args.manifest and (args.slides or args.coords or args.out):
        raise PathtwtError("give either --manifest or SLIDE --coords --out, not both")
    jobs = read_manifest(args.manifest) if args.manifest else jobs_from_lists(args.slides, args.coords, args.out)
    if not jobs:
        raise PathtwtError("nothing to extract: give SLIDE --coords COORDS.h5 --out OUT.h5 or --manifest TSV")
    if args.threads:
        torch.set_num_threads(args.threads)
    from pathtwt.devices import native_bf16

    device = resolve_device(args.device)
    autocast = args.precision == "auto" and native_bf16(device)
    backbone = create_backbone(
        args.backbone, weights=args.weights, pretrained=not args.random_init, device=device,
        precision="fp32" if autocast else args.precision
    )
    summaries = extract_many(
        jobs, backbone, batch_size=args.batch_size, workers=args.workers,
        progress=not args.quiet, skip_existing=args.skip_existing, failures=args.failures, bf16_autocast=autocast,
    )
    for summary in summaries:
        print(json.dumps(summary))
    return 0
