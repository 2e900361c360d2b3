"""pathtwt extract: tile embeddings of one or more slides with one loaded backbone."""

from __future__ import annotations

import argparse
import json

from pathtwt.models.recipes import DEFAULT_RECIPE, RECIPES

from pathtwt.cli.options import (
    add_device_argument, add_normalisation_arguments, add_progress_argument, add_threads_argument, add_workers_argument,
    backbone_help, normalisation, show_progress,
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
    from pathtwt.features.options import EXTRACT_DEFAULTS
    from pathtwt.models.defaults import FORWARD_BATCH_SIZE

    parser.add_argument("--batch-size", type=_batch_size, default=EXTRACT_DEFAULTS.batch_size, metavar="N|auto",
                        help=f"tiles per forward pass (default auto: {FORWARD_BATCH_SIZE} on a CPU; on a GPU sized "
                        "from its memory, 256 or 512 from 40 GiB, halved at run time if a pass does not fit)")
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


def _batch_size(text: str) -> int | None:
    if text.strip().lower() == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a batch size: give a whole number >= 1 or auto")
    return value


def add_decode_argument(parser: argparse.ArgumentParser) -> None:
    from pathtwt.features.decoding import DECODE_CHOICES
    from pathtwt.features.options import EXTRACT_DEFAULTS

    parser.add_argument("--decode", default=EXTRACT_DEFAULTS.decode, choices=DECODE_CHOICES,
                        help="where the native tiles of JPEG-tiled slides are decoded: cpu (the reading processes "
                        "decode, cut and resize), gpu (the reading processes send the compressed tiles; the job's "
                        "GPU decodes them in batches with nvImageCodec, or torchvision's nvJPEG, cuts and shrinks "
                        "them; an error without CUDA), auto (gpu where the model runs on CUDA and a GPU decoder is "
                        "installed, else cpu; default: %(default)s)")


def add_precision_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                        help="auto: bf16 autocast over fp32 weights where the device has native bf16, kept "
                        "only if the run's first 8 tiles agree with fp32 (cosine >= 0.999, else fp32; see the features "
                        "files' precision_check), otherwise the backbone's default; bf16/fp16: weights cast")


def load_backbone(args: argparse.Namespace, device):
    """(backbone, bf16 autocast?) as --precision asks; shared with `pathtwt predict`, so a
    slide embedded there gets the features `pathtwt extract` would write."""
    from pathtwt.models.registry import create_backbone

    # --precision as pathtwt.models.precision resolves it: on native bf16 hardware, auto is
    # fp32 weights under bf16 autocast, guarded by the run's first tiles
    backbone = create_backbone(
        args.backbone, weights=args.weights, pretrained=not args.random_init, device=device,
        precision=args.precision, **normalisation(args)
    )
    return backbone, backbone.bf16_autocast


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
    from pathtwt.features.decoding import resolve_decode

    device = use_device(args.device)
    resolve_decode(args.decode, device)  # `gpu` without CUDA: one line before any model loads
    backbone, autocast = load_backbone(args, device)
    options = ExtractOptions(
        batch_size=args.batch_size, workers=args.workers, decode=args.decode, embedding=args.embedding,
        progress=show_progress(args), skip_existing=args.skip_existing, failures=args.failures, force=args.force,
        bf16_autocast=autocast,
    )
    summaries = extract_many(jobs, backbone, options)
    for summary in summaries:
        print(json.dumps(summary))
    return 0
