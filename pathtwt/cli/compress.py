"""pathtwt compress: compress a backbone with TWT or a comparison method and export it as a
backbone variant folder (``model.safetensors`` + ``model.json``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pathtwt.compress.method_options import METHOD_OPTIONS, describe
from pathtwt.compress.registry import METHODS, PAPER_METHOD

if TYPE_CHECKING:
    from pathtwt.compress.pipeline import CompressOptions

HELP = "compress a backbone (TWT or a comparison method) and export it as a plain timm ViT variant folder"


def _on_off(value: str) -> bool:
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {value!r}")
    return value == "on"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pathtwt.cli.options import add_backbone_arguments
    from pathtwt.compress.defaults import COMPRESS_DEFAULTS as D

    # here --batch-size is distillation's micro-batch, whose default is the distillation one
    add_backbone_arguments(parser, batch_size=D.batch_size)
    parser.add_argument("--method", default=PAPER_METHOD, help=f"one of {', '.join(METHODS)} (default %(default)s)")
    parser.add_argument("--out", required=True, type=Path, help="variant folder to write")
    # every method whose goal is not "none" (pathtwt.compress.registry) needs one of these; each says so
    goal = parser.add_mutually_exclusive_group()
    goal.add_argument("--depth", type=int, help="exactly K blocks (discovery runs here unless --plan); default: none, one of --depth, --eps, --plan is needed by every method but nose")
    goal.add_argument("--eps", type=float, help="fewest blocks with discrepancy <= EPS (discovery runs here); default: none")
    goal.add_argument("--plan", type=Path, help="plan.json from pathtwt discover (default: none)")
    parser.add_argument("--tokens", choices=("all", "cls", "patch-mean"), default=D.tokens,
                        help="token mode of the similarity matrix when discovering here (default all)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--steps", type=int, default=D.steps, help="distillation optimiser steps (default: from --epochs)")
    budget.add_argument("--epochs", type=float, default=D.epochs, help="distillation passes over the training tiles, fractions allowed "
                        "(default 1); the implied optimiser steps are printed before training")
    parser.add_argument("--accumulate", type=int, default=D.accumulate,
                        help="micro-batches of --batch-size per optimiser step (effective batch = batch size x this; default 1)")
    parser.add_argument("--train-coords", nargs="+", default=None, metavar="COORDS",
                        help="stream distillation tiles from these coords files / folders / .txt lists (the training "
                        "cohort) instead of the in-memory fit tiles; the slides of the calibration file's held-out tiles are "
                        "left out. Needs --calibration calibration files (default: none, in memory)")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default=D.precision,
                        help="distillation autocast (default auto: bf16 where the device has native bf16, else fp32); "
                        "weights and optimiser state stay fp32")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes reading training tiles (default when streaming: the job's cores - 1, at most 16 on a "
                        "GPU and 4 on CPU; 0 in memory)")
    parser.add_argument("--lr", type=float, default=D.lr, help=f"peak learning rate (default {D.lr:g})")
    parser.add_argument("--warmup-steps", type=int, default=D.warmup_steps, help="linear warm-up before the cosine decay")
    parser.add_argument("--audition-steps", type=int, default=D.audition_steps,
                        help="fitting steps per audition candidate, 0 = rank as they are")
    parser.add_argument("--schedule", type=_on_off, default=D.schedule, metavar="on|off",
                        help="staggered cosine loss-weight ramp (default: off for pathology backbones, on otherwise)")
    parser.add_argument("--layer-scale", type=_on_off, default=D.layer_scale, metavar="on|off",
                        help="learnable scalar per surrogate branch, folded at export (default as --schedule)")
    parser.add_argument("--augment", type=_on_off, default=D.augment, metavar="on|off",
                        help=f"colour jitter + Gaussian blur (default {'on' if D.augment else 'off'}; off caches teacher targets)")
    parser.add_argument("--loss-norm", choices=("none", "variance"), default=D.loss_norm,
                        help="distillation loss terms: none = plain MSE (the paper's), variance = each term over its "
                        "teacher target's variance on the first training tiles, so late layers with large norms do not "
                        "drown the early ones (default %(default)s, chosen on BACH validation images: benchmarks/studies/results/bach_recipe.md)")
    parser.add_argument("--init", choices=("audition", "random"), default=D.init,
                        help="surrogate initialisation (random: ablation)")
    parser.add_argument("--holdout", type=float, default=D.holdout, help="fraction of drawn calibration tiles kept out of fitting, half select "
                        f"(choices) and half report (reported fidelity) (default {D.holdout:g})")
    parser.add_argument("--checkpoint", type=Path, default=None, help="resume file (default OUT/checkpoint.pt)")
    parser.add_argument("--checkpoint-every", type=int, default=D.checkpoint_every,
                        help=f"steps between checkpoints (default {D.checkpoint_every})")
    parser.add_argument("--keep-checkpoint", action="store_true", help="keep the checkpoint after a successful export")
    parser.add_argument("--stop-after", type=int, default=None,
                        help="stop after this many steps, keeping the checkpoint; rerun to resume "
                        "(default: run to the end)")
    parser.add_argument("--rank-timeout", type=float, default=D.rank_timeout, metavar="MINUTES",
                        help="data-parallel ranks (torchrun, srun): minutes a rank waits for the others in a collective "
                        "before the job ends with a line naming the rank that stopped answering (default %(default)g)")
    parser.add_argument(
        "--option", action="append", default=[], metavar="KEY=VALUE",
        help="a method-specific setting, repeatable: " + ", ".join(f"{k} ({describe(k)})" for k in METHOD_OPTIONS),
    )




def parse_method_options(pairs: list[str]) -> dict:
    """``KEY=VALUE`` strings into a dict of numbers and booleans, refusing unknown keys."""
    from pathtwt.errors import ConfigError

    out: dict = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in METHOD_OPTIONS:
            raise ConfigError(f"--option {pair!r}: expected KEY=VALUE with KEY one of {', '.join(METHOD_OPTIONS)}")
        lowered = value.strip().lower()
        if lowered in ("true", "false"):
            out[key] = lowered == "true"
            continue
        try:
            out[key] = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            raise ConfigError(f"--option {pair!r}: {value!r} is not a number or true/false") from None
    return out


def compress_options(args: argparse.Namespace, **resolved) -> "CompressOptions":
    """The options of a run from its flags: every field of the two option dataclasses that
    has a flag of the same name, then the values resolved here (``resolved``: precision,
    workers, device, extra), the progress switch and the command line."""
    from dataclasses import fields

    from pathtwt.cli.options import show_progress
    from pathtwt.compress.distill import DistillOptions
    from pathtwt.compress.pipeline import CompressOptions

    given = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    values = {**given, "progress": show_progress(args), **resolved,
              "command": [f"--{k.replace('_', '-')}={v}" for k, v in given.items() if v is not None]}
    distill = DistillOptions(**{f.name: values[f.name] for f in fields(DistillOptions) if f.name in values})
    own = {f.name: values[f.name] for f in fields(CompressOptions) if f.name in values and f.name != "distill"}
    return CompressOptions(distill=distill, **own)


def process_device(requested: str, timeout_minutes: float) -> str:
    """This process's device, joining the process group under torchrun / srun. An srun rank
    learns its rank (LOCAL_RANK from SLURM_LOCALID) before the device is resolved, so it
    takes the GPU of its rank and claims no other one. A rank of several watches the others
    from then on (:mod:`pathtwt.compress.rank_failures`)."""
    from pathtwt.cli import error_prefix
    from pathtwt.compress.rank_failures import watch_peers
    from pathtwt.compress.ranks import init_from_env, launched_world_size
    from pathtwt.devices import use_device

    launched_world_size()
    device = init_from_env(use_device(requested), timeout_minutes)
    watch_peers(error_prefix("compress"), timeout_minutes=timeout_minutes, stop_prefix="pathtwt compress: ")
    return device


def run(args: argparse.Namespace) -> int:
    """The run, with stop signals handled for all of it (:mod:`pathtwt.compress.stopping`);
    a rank of several that fails leaves its group so that every rank ends, each with one
    line (:func:`pathtwt.compress.rank_failures.leave_after_error`)."""
    from pathtwt.cli import error_line
    from pathtwt.compress.rank_failures import leave_after_error, stop_watching
    from pathtwt.compress.ranks import shutdown
    from pathtwt.compress.stopping import ending, stop_signals_handled

    with stop_signals_handled():
        try:
            code = _run(args)
        except BaseException as exc:
            ending()
            own = None if isinstance(exc, KeyboardInterrupt) else error_line(args.command, exc)
            replacement = leave_after_error(exc, own)
            if replacement is None:
                raise
            raise replacement from None
        watched = stop_watching()
        shutdown()
        if not watched:  # its store call still out: finalising would abort the rank (stop_watching)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code


def _run(args: argparse.Namespace) -> int:
    from pathtwt.compress.calibration import load_calibration
    from pathtwt.compress.registry import CLOSED_FORM, get_method
    from pathtwt.models.registry import create_backbone

    from pathtwt.compress.ranks import decide, is_writer, world_size
    from pathtwt.models.precision import resolve_precision

    method = get_method(args.method)  # fail on an unknown method before loading anything
    extra = parse_method_options(args.option)
    if args.accumulate < 1:
        from pathtwt.errors import ConfigError

        raise ConfigError(f"--accumulate {args.accumulate}: must be >= 1")
    device = process_device(args.device, args.rank_timeout)
    if args.batch_size % world_size():
        from pathtwt.errors import ConfigError

        raise ConfigError(f"--batch-size {args.batch_size} is not divisible by the {world_size()} ranks; choose a multiple")
    # resolved per rank (auto: by its device), decided once
    precision = decide("the training precision", resolve_precision(args.precision, device, training=True).compute)
    # float32 teacher whatever the backbone's inference precision: its outputs are the targets
    from pathtwt.cli.options import normalisation

    teacher = create_backbone(args.backbone, weights=args.weights, pretrained=not args.random_init,
                              device=device, precision="fp32", **normalisation(args))
    calib = load_calibration(args.calibration, n_tiles=args.n_tiles, seed=args.seed, holdout=args.holdout,
                             resize_to=teacher.spec.input_size)
    if args.train_coords:
        from pathtwt.compress.training_tiles import with_streamed_training

        calib = with_streamed_training(calib, args.calibration, args.train_coords)
    from pathtwt.compress.training_tiles import default_workers

    workers = default_workers(device, bool(args.train_coords)) if args.workers is None else args.workers
    options = compress_options(args, precision=precision, workers=workers or 0, device=teacher.device, extra=extra)
    agree_on_inputs(args, teacher, calib)
    if is_writer() and args.method not in CLOSED_FORM:
        from pathtwt.compress.distill import plan_summary
        from pathtwt.compress.pipeline import distill_options

        print(plan_summary(distill_options(options), len(calib.training_tiles()), world=world_size()), flush=True)
    out = method(teacher, calib, options)
    if not is_writer():
        return 0  # rank 0 reports
    if out is None:
        print(f"{args.out}: stopped after step {args.stop_after}; rerun the same command to resume")
        return 0
    import json

    meta = json.loads((Path(out) / "model.json").read_text())
    fid = meta.get("fidelity", {})
    print(f"{out}: {meta['name']}, {meta['params'] / 1e6:.2f} M params, {meta['macs_per_tile'] / 1e9:.2f} G MACs/tile, "
          f"embedding R^2 on {fid.get('on', '?')} tiles {fid.get('initial', {}).get('r2', float('nan')):.4f} -> "
          f"{fid.get('final', {}).get('r2', float('nan')):.4f} (CKA {fid.get('final', {}).get('cka', float('nan')):.4f})")
    return 0


def agree_on_inputs(args: argparse.Namespace, teacher, calib) -> None:
    """Several ranks: every rank runs the same command on the same teacher and tiles (an
    srun task started with other arguments, or a node that sees another file, is one line
    on every rank before any training). The calibration tiles are compared by a hash of
    their pixels (the teacher cache's, computed once per set), streamed training tiles by
    their count."""
    from pathtwt.compress.ranks import agree, world_size
    from pathtwt.compress.teacher_cache import tiles_digest

    if world_size() == 1:
        return
    settings = {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "rank_timeout"}
    inputs = {"teacher_weights_sha256": teacher.weights_sha256,
              "calibration_tiles": {split: len(tiles) for split, tiles in
                                    (("fit", calib.fit), ("select", calib.select), ("report", calib.report))},
              "calibration_pixels_sha256": tiles_digest(calib),
              "training_tiles": len(calib.training_tiles())}
    agree("the run's settings and inputs", {**settings, **inputs},
          "start every rank with the same command, on files every rank reads the same")
