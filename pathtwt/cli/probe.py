"""`pathtwt probe`: balanced accuracy of a logistic-regression and a kNN probe on a
backbone's frozen tile embeddings of a labelled tile folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pathtwt.cli.options import add_device_argument, add_threads_argument

HELP = (
    "embed a folder of class subfolders of tiles with a backbone, fit a logistic-regression probe "
    "(standardised features, C=1) and a cosine kNN (k=20) on the train split, and report balanced "
    "accuracy (bootstrap 95 %% interval), accuracy and macro AUC on the test split"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backbone", required=True, help="registry name (e.g. vit-s14-imgfocus) or a variant folder")
    parser.add_argument("--weights", default=None, help="local weights file (default: the registry's)")
    parser.add_argument(
        "--random-init", action="store_true",
        help="the same architecture with random weights (the floor a useful backbone must beat)",
    )
    parser.add_argument("--tiles", required=True, type=Path, help="folder of class subfolders of image tiles")
    parser.add_argument("--out", required=True, type=Path, help="folder for probe.json and predictions.csv")
    parser.add_argument(
        "--split-file", type=Path, default=None,
        help="CSV with columns path,split (path relative to --tiles, split train or test); tiles it does not "
        "name are left out. Default: a seeded split stratified by class that keeps tiles whose file stems share "
        "the part before the first '_' on one side",
    )
    parser.add_argument("--test-fraction", type=float, default=0.3, help="test share of the drawn split (default 0.3)")
    parser.add_argument("--name", default=None, help="name of the probe set in probe.json (default: the folder's name)")
    parser.add_argument(
        "--max-per-class", type=int, default=None, metavar="N",
        help="keep at most N tiles per class in each split, drawn with --seed (quick runs; default: every tile)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the drawn split, subsampling and bootstrap (default 0)")
    from pathtwt.models.defaults import FORWARD_BATCH_SIZE

    parser.add_argument("--batch-size", type=int, default=FORWARD_BATCH_SIZE,
                        help=f"tiles per forward pass (default {FORWARD_BATCH_SIZE})")
    add_device_argument(parser)
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                        help="auto: as pathtwt extract, bf16 autocast over fp32 weights where the device has native "
                        "bf16, kept only if the first 8 tiles agree with fp32 (cosine >= 0.999, else fp32; probe.json "
                        "says which), otherwise the backbone's default; bf16/fp16: weights cast")
    add_threads_argument(parser)


def run(args: argparse.Namespace) -> int:
    from pathtwt.devices import use_device
    from pathtwt.models.registry import create_backbone
    from pathtwt.probe.data import load_probe_set
    from pathtwt.probe.run import probe_backbone, summary_line

    # the tiles and split are checked before the (slow) model build
    probe_set = load_probe_set(
        args.tiles, split_file=args.split_file, test_fraction=args.test_fraction, seed=args.seed,
        max_per_class=args.max_per_class,
    )
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    device = use_device(args.device)
    # the probe embeds tiles as extraction does, so that it measures the features MIL reads
    backbone = create_backbone(
        args.backbone, weights=args.weights, pretrained=not args.random_init, device=device,
        precision=args.precision,
    )
    summary = probe_backbone(
        backbone, probe_set, args.out, variant=str(args.backbone), name=args.name or args.tiles.resolve().name,
        seed=args.seed, batch_size=args.batch_size, max_per_class=args.max_per_class, random_init=args.random_init,
        bf16_autocast=backbone.bf16_autocast,
    )
    print(summary_line(summary), file=sys.stdout)
    return 0
