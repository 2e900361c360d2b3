"""pathtwt export-features: a folder of features files in CLAM's or STAMP's layout."""

from __future__ import annotations

import argparse
import json

HELP = (
    "write a folder of pathtwt features files as CLAM's pt_files/{slide}.pt (+ h5_files/) or as "
    "STAMP's feature files (feats, coordinates in micrometres)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("features_dir", metavar="DIR", help="folder of features files ({slide}.h5, pathtwt extract)")
    parser.add_argument("out", metavar="OUT", help="output folder (created)")
    parser.add_argument(
        "--format", required=True, choices=["clam-pt", "stamp"],
        help="clam-pt: OUT/pt_files/{slide}.pt and OUT/h5_files/{slide}.h5; stamp: OUT/{slide}.h5",
    )


def run(args: argparse.Namespace) -> int:
    from pathtwt.features.export import export_features

    summary = export_features(args.features_dir, args.out, args.format)
    print(json.dumps(summary))
    return 0
