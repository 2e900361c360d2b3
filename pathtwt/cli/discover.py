"""pathtwt discover: layer-similarity matrix of a frozen backbone and its exact partition."""

from __future__ import annotations

import argparse
from pathlib import Path

from pathtwt.cli.options import add_backbone_arguments, load_fit_tiles, load_teacher, progress_bar, teacher_provenance

HELP = "layer-similarity matrix of a frozen backbone on calibration tiles and the exact min-max merge plan"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_backbone_arguments(parser)
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    goal = parser.add_mutually_exclusive_group(required=True)
    goal.add_argument("--eps", type=float, help="fewest blocks with every block discrepancy <= EPS")
    goal.add_argument("--depth", type=int, help="exactly K blocks with the smallest worst discrepancy")
    from pathtwt.compress.defaults import COMPRESS_DEFAULTS

    parser.add_argument(
        "--tokens", choices=("all", "cls", "patch-mean"), default=COMPRESS_DEFAULTS.tokens,
        help="tokens compared: all (per token, averaged), cls, or the patch-token mean",
    )


def run(args: argparse.Namespace) -> int:
    from pathtwt.analysis.figures import similarity_heatmap
    from pathtwt.compress.discovery import discover
    from pathtwt.compress.fidelity import references
    from pathtwt.compress.similarity import save_similarity
    from pathtwt.compress.teacher_cache import cache_directory
    from pathtwt.io.atomic import write_json_atomic, write_text_atomic

    backbone = load_teacher(args)
    calib = load_fit_tiles(args)
    # a fit split small enough for the teacher cache: its one pass over the fit tiles is
    # kept on disk, and every compress job of this teacher and calibration file reads it
    # (auditioning, the fit means, the targets) instead of running it again
    with progress_bar(args, len(calib.fit), "layer similarity") as bar:
        found = discover(backbone, calib, depth=args.depth, eps=args.eps, tokens=args.tokens,
                         batch_size=args.batch_size, device=backbone.device, progress=bar.update)
    S, part = found.similarity, found.partition
    out: Path = args.out
    save_similarity(out, S)
    write_text_atomic(
        out / "eps_sweep.csv", "eps,n_blocks\n" + "".join(f"{e:.6f},{n}\n" for e, n in zip(found.eps_grid, found.sweep))
    )
    plan = {**found.plan(), **teacher_provenance(backbone, len(calib.fit), args)}
    similarity_heatmap(
        S, part.blocks, out / "similarity.png",
        title=f"{backbone.spec.name}: {part.n_blocks} blocks",
        caption=(
            f"{backbone.spec.name}: mean cosine distance ({args.tokens} tokens) between the outputs of its "
            f"{S.shape[0]} layers on {len(calib.fit)} calibration tiles; red squares: the {part.n_blocks} blocks "
            f"(worst discrepancy {part.max_discrepancy:.3f})."
        ),
    )
    # the reference rows (teacher, constant, random-init) of every compress job of this
    # calibration set, kept in the teacher cache beside it: they are measured on the report
    # tiles, where nothing is chosen, and the plan above never saw them
    if cache_directory(calib) is not None:
        references(backbone, calib, device=backbone.device, seed=args.seed)
    write_json_atomic(out / "plan.json", plan)  # last: its presence means the folder is complete
    blocks = " ".join(f"[{s}-{e}]" for s, e in part.blocks)
    print(f"{out}: {part.n_blocks} blocks {blocks}, worst discrepancy {part.max_discrepancy:.4f}"
          f" ({len(calib.fit)} tiles)")
    return 0
