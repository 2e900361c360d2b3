"""Options and helpers that several subcommands share (teacher and calibration)."""

from __future__ import annotations

import argparse
from typing import Any


def add_backbone_arguments(parser: argparse.ArgumentParser, n_tiles: int = 10_000) -> None:
    """Teacher and calibration options shared with `pathtwt analyze`."""
    parser.add_argument("--backbone", required=True, help="registry name (e.g. h0-mini) or a backbone variant folder")
    parser.add_argument("--weights", default=None, help="local weights file (default: the registry's)")
    parser.add_argument(
        "--random-init", action="store_true",
        help="use the exact architecture with random weights (tests and dry runs only)",
    )
    parser.add_argument(
        "--calibration", nargs="+", required=True, metavar="SRC",
        help="calib.h5 from `pathtwt calibrate`, or coords/image files and folders",
    )
    parser.add_argument("--n-tiles", type=int, default=n_tiles, help=f"calibration tiles to use (default {n_tiles})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the calibration draw (default 0)")
    parser.add_argument("--batch-size", type=int, default=32, help="tiles per forward pass (default 32)")
    parser.add_argument("--device", default="auto", help="auto (default), cpu or cuda[:N]")


def load_teacher(args: argparse.Namespace) -> Any:
    from pathtwt.models.registry import create_backbone
    from pathtwt.devices import resolve_device

    device = resolve_device(args.device)
    return create_backbone(args.backbone, weights=args.weights, pretrained=not args.random_init, device=device)


def teacher_provenance(backbone: Any, n_tiles: int, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "backbone": backbone.spec.name,
        "weights_sha256": backbone.weights_sha256,
        "weights_source": backbone.source,
        "n_tiles": int(n_tiles),
        "calibration": [str(s) for s in args.calibration],
        "seed": args.seed,
    }


def load_fit_tiles(args: argparse.Namespace):
    """The fit part of the calibration set (select and report stay unseen)."""
    from pathtwt.compress.calibration import load_calibration

    return load_calibration(args.calibration, n_tiles=args.n_tiles, seed=args.seed)
