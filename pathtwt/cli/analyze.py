"""pathtwt analyze: the paper's analyses of a backbone (and a compressed student)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pathtwt.cli.options import add_backbone_arguments, load_teacher, progress_bar, teacher_provenance

HELP = "norm growth, eps sensitivity, intrinsic-dimension trajectories and augmentation stability"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)

    p = sub.add_parser("norms", help="per-layer token norms and residual-to-output ratio")
    _teacher_args(p, n_tiles=64, part="all")

    p = sub.add_parser("eps", help="number of blocks against eps for one or more discover folders")
    p.add_argument("--discovery", nargs="+", required=True, metavar="[NAME=]DIR", help="`pathtwt discover` folders")
    p.add_argument("--n-eps", type=int, default=41, help="eps grid points")
    p.add_argument("--out", required=True, type=Path, help="output folder")

    for name, helptext in (
        ("intrinsic-dim", "Two-NN intrinsic dimension at every block boundary, teacher and student"),
        ("stability", "ID and representation spread under stochastic augmentation (Table 1)"),
    ):
        p = sub.add_parser(name, help=helptext)
        _teacher_args(p, n_tiles=500, part="report")
        p.add_argument(
            "--student", type=Path,
            help="compressed backbone folder whose model.json holds the plan (default: teacher only, needs --plan)",
        )
        p.add_argument(
            "--plan", type=Path,
            help="plan.json giving the teacher's boundaries when no student is given (default: the student's plan)",
        )
        p.add_argument(
            "--representations", nargs="+", default=["cls", "patch-mean", "patch-seq"],
            choices=("cls", "patch-mean", "patch-seq"), help="representations measured",
        )
        p.add_argument("--discard-fraction", type=float, default=0.1, help="Two-NN tail discarded")
        if name == "stability":
            p.add_argument("--n-draws", type=int, default=5, help="augmentation draws per tile")


def _teacher_args(p: argparse.ArgumentParser, *, n_tiles: int, part: str) -> None:
    add_backbone_arguments(p, n_tiles=n_tiles)
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument(
        "--part", choices=("fit", "select", "report", "all"), default=part,
        help=f"calibration part analysed (default {part}; report keeps tiles a student was trained on out)",
    )


def run(args: argparse.Namespace) -> int:
    from pathtwt.errors import ConfigError

    if args.analysis == "eps":
        return _run_eps(args)
    backbone = load_teacher(args)
    tiles = _tiles(args)
    if len(tiles) < 3:
        raise ConfigError(f"--part {args.part} holds {len(tiles)} tiles; raise --n-tiles or use --part all")
    if args.analysis == "norms":
        return _run_norms(args, backbone, tiles)
    return _run_ids(args, backbone, tiles)


def _tiles(args: argparse.Namespace):
    from pathtwt.compress.calibration import load_calibration

    calib = load_calibration(args.calibration, part=args.part, n_tiles=args.n_tiles, seed=args.seed)
    tiles = calib.fit
    if calib.provenance["part"] != args.part:
        print(f"note: coords/image sources carry no fit/select/report split; --part {args.part} needs a calib.h5 "
              f"from `pathtwt calibrate`, so all {len(tiles)} drawn tiles are analysed", file=sys.stderr)
    return tiles


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    from pathtwt.io.atomic import write_text_atomic

    keys = list(rows[0]) if rows else []
    fmt = lambda v: f"{v:.6g}" if isinstance(v, float) else str(v)  # noqa: E731
    body = "".join(",".join(fmt(r.get(k, "")) for k in keys) + "\n" for r in rows)
    write_text_atomic(path, ",".join(keys) + "\n" + body)


def _run_norms(args, backbone, tiles) -> int:
    from pathtwt.analysis.figures import norm_growth
    from pathtwt.analysis.norms import norm_profile
    from pathtwt.io.atomic import write_json_atomic

    with progress_bar(args, len(tiles), "layer norms") as bar:
        prof = norm_profile(
            backbone.model, backbone.transform, tiles, num_prefix_tokens=backbone.spec.num_prefix_tokens,
            batch_size=args.batch_size, device=backbone.device, progress=bar.update,
        )
    out: Path = args.out
    _write_csv(out / "norms.csv", prof.rows())
    norm_growth(
        prof.layers, {"patch tokens": prof.patch_norm, "CLS": prof.cls_norm},
        {"patch tokens": prof.patch_residual_ratio, "CLS": prof.cls_residual_ratio}, out / "norms.png",
        name=backbone.spec.name,
    )
    write_json_atomic(out / "norms_summary.json", {
        "analysis": "norms", "patch_norm_growth": prof.patch_growth, "rows": prof.rows(),
        **teacher_provenance(backbone, len(tiles), args), "part": args.part,
    })
    print(f"{out}: patch-token norm grows {prof.patch_growth:.1f}x from layer 1 to {prof.layers[-1]}"
          f" ({len(tiles)} tiles)")
    return 0


def _boundaries(args, backbone) -> tuple[list[int], Any]:
    """Teacher layers at the boundaries, and the student backbone (or None)."""
    from pathtwt.models.registry import create_backbone
    from pathtwt.errors import ConfigError

    if args.student is not None:
        meta_path = args.student / "model.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        plan = meta.get("plan") or {}
        if not plan.get("blocks"):
            raise ConfigError(f"{meta_path}: no plan.blocks; the student must be a `pathtwt compress` output folder")
        student = create_backbone(args.student, device=backbone.device)
        ends = [int(e) for _, e in plan["blocks"]]
        if len(ends) != len(student.model.blocks):
            raise ConfigError(
                f"{meta_path}: plan has {len(ends)} blocks but the model has {len(student.model.blocks)} layers"
            )
        return ends, student
    if args.plan is not None:
        return [int(e) for _, e in json.loads(Path(args.plan).read_text())["blocks"]], None
    return list(range(1, len(backbone.model.blocks) + 1)), None


def _run_ids(args, backbone, tiles) -> int:
    from pathtwt.analysis.figures import id_trajectories
    from pathtwt.analysis.stability import ModelUnderTest, markdown_table, stability, table_rows, trajectory_ids
    from pathtwt.io.atomic import write_json_atomic, write_text_atomic

    ends, student = _boundaries(args, backbone)
    models = [ModelUnderTest("teacher", backbone.model, backbone.transform, backbone.spec.num_prefix_tokens, ends)]
    if student is not None:
        models.append(ModelUnderTest(
            "student", student.model, student.transform, student.spec.num_prefix_tokens, list(range(1, len(ends) + 1))
        ))
    kinds = list(dict.fromkeys(args.representations))
    common = dict(
        kinds=kinds, discard_fraction=args.discard_fraction, batch_size=args.batch_size, device=backbone.device
    )
    out: Path = args.out
    summary: dict[str, Any] = {
        "analysis": args.analysis, "part": args.part, "teacher_layers": ends,
        "student": str(args.student) if student is not None else None, **teacher_provenance(backbone, len(tiles), args),
    }
    if args.analysis == "intrinsic-dim":
        with progress_bar(args, len(tiles) * len(models), "boundary representations") as bar:
            ids = {m.name: trajectory_ids(m, tiles, progress=bar.update, **common) for m in models}
        rows = [
            {"boundary": j + 1, **{f"{m.name}_layer": m.layers[j] for m in models},
             **{f"{m.name}_{k}": ids[m.name][k][j] for m in models for k in kinds}}
            for j in range(len(ends))
        ]
        _write_csv(out / "intrinsic_dim.csv", rows)
        for k in kinds:
            id_trajectories(ends, {m.name: (ids[m.name][k], [0.0] * len(ends)) for m in models},
                            out / f"intrinsic_dim_{k}.png", representation=k)
        write_json_atomic(out / "intrinsic_dim.json", {**summary, "ids": ids})
        print(f"{out}: intrinsic dimension at {len(ends)} boundaries for {', '.join(m.name for m in models)}")
        return 0
    with progress_bar(args, len(tiles) * len(models) * args.n_draws, "augmented views") as bar:
        res = stability(models, tiles, n_draws=args.n_draws, seed=args.seed, progress=bar.update, **common)
    tables, markdown = {}, []
    for k in kinds:
        rows = table_rows(res, "teacher", "student" if student is not None else None, k)
        tables[k] = rows
        _write_csv(out / f"stability_{k}.csv", rows)
        markdown.append(f"### {k}\n\n" + markdown_table(rows, k))
        id_trajectories(
            ends, {name: (res.ids[name][k].mean(0), res.ids[name][k].std(0, ddof=1) if args.n_draws > 1 else
                          [0.0] * len(ends)) for name in res.ids},
            out / f"stability_{k}.png", representation=k,
        )
    write_text_atomic(out / "stability.md", "\n".join(markdown))
    write_json_atomic(out / "stability.json", {**summary, "n_draws": args.n_draws, "tables": tables})
    print(f"{out}: stability over {args.n_draws} augmentation draws at {len(ends)} boundaries")
    print("\n".join(markdown))
    return 0


def _run_eps(args) -> int:
    from pathtwt.analysis.eps_sensitivity import load_discovery, sensitivity
    from pathtwt.analysis.figures import eps_curves
    from pathtwt.io.atomic import write_json_atomic

    matrices = {}
    for item in args.discovery:
        label, _, folder = item.rpartition("=")
        name, S = load_discovery(folder)
        matrices[label or name] = S
    grid, counts = sensitivity(matrices, n_eps=args.n_eps)
    rows = [{"eps": float(e), **{name: c[i] for name, c in counts.items()}} for i, e in enumerate(grid)]
    _write_csv(args.out / "eps_sensitivity.csv", rows)
    eps_curves({name: (grid, c) for name, c in counts.items()}, args.out / "eps_sensitivity.png")
    write_json_atomic(args.out / "eps_sensitivity_summary.json", {"analysis": "eps", "eps": grid, "n_blocks": counts})
    print(f"{args.out}: eps sweep of {len(matrices)} backbone(s) over {len(grid)} values")
    return 0
