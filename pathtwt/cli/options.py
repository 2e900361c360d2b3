"""The command-line convention every subcommand follows, in one place.

- ``--device`` takes auto|cpu|cuda|cuda:N (:func:`add_device_argument`), decided once
  per process by :func:`pathtwt.devices.use_device`;
- ``--no-progress`` is the one switch for progress bars (:func:`add_progress_argument`;
  ``--quiet`` remains as a deprecated alias);
- ``--workers`` and ``--threads`` size the CPU side (:func:`add_workers_argument`,
  :func:`add_threads_argument`); the workflow passes its job's cores to them;
- every option has help text that shows its default: :class:`HelpFormatter` appends
  ``(default: X)`` unless the text already says what the default is, which options whose
  default is None must do (tests/test_cli_options.py walks every subcommand for this).

A new subcommand uses these helpers rather than declaring its own variants.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default and prints docstring text without RST backticks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            action.default is argparse.SUPPRESS
            or action.required
            or (not action.option_strings and action.nargs not in ("?", "*"))
            or "default" in text.lower()
            or action.default is None
        ):
            return text
        if action.default is False and action.nargs == 0:
            return text + " (default: off)"
        if action.default == []:
            return text + " (default: none)"
        return text + " (default: %(default)s)"

    def _format_text(self, text: str) -> str:
        return super()._format_text(text.replace("`", ""))

    def _expand_help(self, action: argparse.Action) -> str:
        return super()._expand_help(action).replace("`", "")


def use_help_formatter(parser: argparse.ArgumentParser) -> None:
    """:class:`HelpFormatter` for ``parser`` and every nested subcommand parser."""
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                use_help_formatter(sub)


def iter_parsers(parser: argparse.ArgumentParser, prefix: str = "pathtwt"):
    """(command path, parser) for ``parser`` and every nested subcommand parser."""
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from iter_parsers(sub, f"{prefix} {name}")


def _device_name(text: str) -> str:
    from pathtwt.devices import check_device_name
    from pathtwt.errors import ConfigError

    try:
        return check_device_name(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_device_argument(parser: argparse.ArgumentParser, default: str = "auto") -> None:
    from pathtwt.devices import DEVICE_HELP

    parser.add_argument("--device", type=_device_name, default=default, metavar="DEVICE", help=DEVICE_HELP)


class _DeprecatedQuiet(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: --quiet is deprecated; use --no-progress", file=sys.stderr)
        setattr(namespace, self.dest, True)


def add_progress_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-progress", action="store_true",
        help="no progress bars (they are drawn on stderr only when it is a terminal)",
    )
    parser.add_argument("--quiet", dest="no_progress", nargs=0, action=_DeprecatedQuiet, help=argparse.SUPPRESS)


def show_progress(args: argparse.Namespace) -> bool:
    """Progress bars unless --no-progress, and only on a terminal (a bar redrawn into a
    job's log file is noise)."""
    return not getattr(args, "no_progress", False) and sys.stderr.isatty()


def progress_bar(args: argparse.Namespace, total: int, desc: str, unit: str = "tile"):
    """A tqdm bar for a step of ``total`` units, drawn only when :func:`show_progress`;
    use as a context manager and pass its ``update`` as a ``progress`` callback."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not show_progress(args), dynamic_ncols=True, leave=False)


def default_store() -> str:
    """The store a command reads without --store: the config's default ``store:`` (the schema's)."""
    from pathtwt.config.check import read_schema

    return str(read_schema()["properties"]["store"]["default"])


def add_workers_argument(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--workers", type=int, default=None, metavar="N",
        help=f"{what} (default: the cores this job may use minus one, at most 4; "
        "the cores come from SLURM_CPUS_PER_TASK or the CPU affinity)",
    )


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads", type=int, default=None, metavar="N",
        help="torch compute threads (default: torch's choice)",
    )


def backbone_help() -> str:
    """--backbone's help: the registry's names (test doubles ``*-tiny`` left out)."""
    from pathtwt.models.encoders import BACKBONES

    names = ", ".join(sorted(n for n in BACKBONES if not n.endswith("-tiny")))
    return (f"registry name ({names}; each has a NAME-tiny test double), a backbone variant folder, "
            "or timm:NAME for another timm ViT (with --weights)")


def _triple(text: str) -> tuple[float, float, float]:
    try:
        values = tuple(float(v) for v in text.replace(",", " ").split())
    except ValueError:
        values = ()
    if len(values) != 3:
        raise argparse.ArgumentTypeError(f"expected three numbers R,G B (e.g. 0.485,0.456,0.406), got {text!r}")
    return values  # type: ignore[return-value]


def add_normalisation_arguments(parser: argparse.ArgumentParser) -> None:
    for name in ("mean", "std"):
        parser.add_argument(
            f"--{name}", type=_triple, default=None, metavar="R,G,B",
            help=f"per-channel {name} of [0, 1] RGB the backbone was trained with (default: the registry's, or "
            "the timm model's pretrained config for timm:NAME)",
        )


def add_precision_argument(parser: argparse.ArgumentParser) -> None:
    from pathtwt.features.options import EXTRACT_DEFAULTS
    from pathtwt.models.precision import INFERENCE_REQUESTS

    parser.add_argument("--precision", default=EXTRACT_DEFAULTS.precision, choices=list(INFERENCE_REQUESTS),
                        help="auto: bf16 autocast over fp32 weights where the device has native bf16, kept "
                        "only if the run's first 8 tiles agree with fp32 (cosine >= 0.999, else fp32; see the features "
                        "files' precision_check), otherwise the backbone's default; bf16/fp16: weights cast")


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


def add_extract_batch_argument(parser: argparse.ArgumentParser) -> None:
    """Extraction's --batch-size (extract, predict): a number, or auto (the default)."""
    from pathtwt.features.options import EXTRACT_DEFAULTS
    from pathtwt.models.defaults import FORWARD_BATCH_SIZE

    parser.add_argument("--batch-size", type=_batch_size, default=EXTRACT_DEFAULTS.batch_size, metavar="N|auto",
                        help=f"tiles per forward pass (default auto: {FORWARD_BATCH_SIZE} on a CPU; on a GPU sized "
                        "from its memory, 256 or 512 from 40 GiB, halved at run time if a pass does not fit)")


def add_decode_argument(parser: argparse.ArgumentParser) -> None:
    from pathtwt.features.decoding import DECODE_CHOICES
    from pathtwt.features.options import EXTRACT_DEFAULTS

    parser.add_argument("--decode", default=EXTRACT_DEFAULTS.decode, choices=DECODE_CHOICES,
                        help="where the native tiles of JPEG-tiled slides are decoded: cpu (the reading processes "
                        "decode, cut and resize), gpu (the reading processes send the compressed tiles; the job's "
                        "GPU decodes them in batches with nvImageCodec, or torchvision's nvJPEG, cuts and shrinks "
                        "them; an error without CUDA), auto (gpu where the model runs on CUDA and a GPU decoder is "
                        "installed and decodes test JPEGs on the job's GPU when made, else cpu; default: %(default)s)")


def backbone_request(args: argparse.Namespace) -> Any:
    """The extraction backbone --backbone, --weights, --random-init, --precision and
    --mean/--std ask for (:class:`pathtwt.features.backbone.BackboneRequest`)."""
    from pathtwt.features.backbone import BackboneRequest

    return BackboneRequest(args.backbone, weights=args.weights, random_init=args.random_init,
                           precision=args.precision, **normalisation(args))


def normalisation(args: argparse.Namespace) -> dict[str, Any]:
    """``mean``/``std`` keyword arguments of ``create_backbone`` from --mean/--std."""
    return {"mean": getattr(args, "mean", None), "std": getattr(args, "std", None)}


def add_backbone_arguments(parser: argparse.ArgumentParser, n_tiles: int = 10_000, batch_size: int | None = None) -> None:
    """Teacher and calibration options shared with `pathtwt analyze`. ``batch_size``: the
    --batch-size default (None: the forward-pass one, pathtwt.models.defaults)."""
    from pathtwt.models.defaults import FORWARD_BATCH_SIZE

    parser.add_argument("--backbone", required=True, help=backbone_help())
    add_normalisation_arguments(parser)
    parser.add_argument(
        "--weights", default=None,
        help="local weights file or Hugging Face snapshot folder (default: the registry's: a local weights "
        "folder, then the hub unless HF_HUB_OFFLINE is set)",
    )
    parser.add_argument(
        "--random-init", action="store_true",
        help="use the exact architecture with random weights (tests and dry runs only)",
    )
    parser.add_argument(
        "--calibration", nargs="+", required=True, metavar="SRC",
        help="calib.h5 from `pathtwt calibrate`, or coords/image files and folders",
    )
    parser.add_argument("--n-tiles", type=int, default=n_tiles, help="calibration tiles to use")
    parser.add_argument("--seed", type=int, default=0, help="seed of the calibration draw")
    parser.add_argument("--batch-size", type=int, default=FORWARD_BATCH_SIZE if batch_size is None else batch_size,
                        help="tiles per forward pass")
    add_device_argument(parser)
    add_progress_argument(parser)


def load_teacher(args: argparse.Namespace) -> Any:
    from pathtwt.models.registry import create_backbone
    from pathtwt.devices import use_device

    device = use_device(args.device)
    # float32 whatever the backbone's inference precision: a teacher measured or compressed
    # (its layer outputs, shared with the compress jobs through the teacher cache)
    return create_backbone(args.backbone, weights=args.weights, pretrained=not args.random_init, device=device,
                           precision="fp32", **normalisation(args))


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
    """The calibration set as a compress job loads it: discovery chooses on its fit part only
    (the report part serves the teacher's reference rows; select stays unseen)."""
    from pathtwt.compress.calibration import load_calibration

    return load_calibration(args.calibration, n_tiles=args.n_tiles, seed=args.seed)
