"""Registry of compression methods.

A method is a function ``(teacher: Backbone, calib: CalibrationSet, options:
CompressOptions) -> Path | None`` (see :mod:`pathtwt.compress.pipeline`) that writes a
backbone variant folder to ``options.out`` and returns it (None when the run stopped early
on purpose, ``--stop-after``, leaving a checkpoint to resume from). Methods are named here
as "module:function" and imported only when chosen, so a comparison method whose module
has not been installed fails with a clear message instead of breaking the others.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pathtwt.errors import ConfigError

# what a variant of the method gives: a depth (exactly K layers or blocks), a depth or an
# eps (TWT partitions to the fewest blocks within eps), or neither (every layer is kept)
GOALS = ("depth", "depth or eps", "none")


@dataclass(frozen=True)
class CompressionMethod:
    target: str  # "module:function", imported only when the method is chosen
    goal: str = "depth"  # one of GOALS: what pathtwt compress and the config's variants.NAME take
    closed_form: bool = False  # fitted in closed form, never distilled: no training budget to announce
    # what a K-deep variant costs a tile (pathtwt bench): "depth", the plain timm ViT of K layers it
    # exports; "teacher", the teacher's layer count (raptor runs each shared layer as often as the
    # block it replaces had layers); "other", neither (nose keeps every layer, less attention)
    cost: str = "depth"


METHODS: dict[str, CompressionMethod] = {
    "twt": CompressionMethod("pathtwt.compress.methods.twt:compress", goal="depth or eps"),
    "truncation": CompressionMethod("pathtwt.compress.methods.truncation:compress"),
    "raptor": CompressionMethod("pathtwt.compress.methods.raptor:compress", cost="teacher"),
    "wdpruning": CompressionMethod("pathtwt.compress.methods.wdpruning:compress"),
    # every layer kept, attention removed (or kept in --option keep_attention=K layers)
    "nose": CompressionMethod("pathtwt.compress.methods.nose:compress", goal="none", cost="other"),
    "linear": CompressionMethod("pathtwt.compress.methods.linear:compress", closed_form=True),
    "subset": CompressionMethod("pathtwt.compress.methods.subset:compress"),
}

# the method of the paper pathtwt implements: `pathtwt compress`'s default; discovery
# partitions for its first variant (the goal the similarity figure shows), and the
# intrinsic-dimension and stability analyses study its variants
PAPER_METHOD = "twt"

CLOSED_FORM = frozenset(name for name, m in METHODS.items() if m.closed_form)


def goal_of(name: str) -> str:
    """What a variant of method ``name`` gives (:data:`GOALS`); the uncompressed and
    random-init reference rows give neither."""
    return METHODS[name].goal if name in METHODS else "none"


def known_methods() -> list[str]:
    return sorted(METHODS)


def get_method(name: str) -> Callable[..., Path | None]:
    """The function registered as ``name``; a ConfigError names the known methods or the
    missing module."""
    method = METHODS.get(name)
    if method is None:
        raise ConfigError(f"unknown compression method {name!r}; known methods: {', '.join(known_methods())}")
    module_name, func_name = method.target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigError(f"compression method {name!r} is not installed ({module_name} is missing)") from exc
        raise
    func = getattr(module, func_name, None)
    if func is None:
        raise ConfigError(f"compression method {name!r}: {module_name} defines no {func_name}()")
    return func
