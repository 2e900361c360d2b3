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
from pathlib import Path
from typing import Callable

from pathtwt.errors import ConfigError

METHODS: dict[str, str] = {
    "twt": "pathtwt.compress.methods.twt:compress",
    "truncation": "pathtwt.compress.methods.truncation:compress",
    "raptor": "pathtwt.compress.methods.raptor:compress",
    "wdpruning": "pathtwt.compress.methods.wdpruning:compress",
    "nose": "pathtwt.compress.methods.nose:compress",
    "linear": "pathtwt.compress.methods.linear:compress",
    "subset": "pathtwt.compress.methods.subset:compress",
}

# fitted in closed form, never distilled: no training budget to announce
CLOSED_FORM = frozenset({"linear"})


def known_methods() -> list[str]:
    return sorted(METHODS)


def get_method(name: str) -> Callable[..., Path | None]:
    """The function registered as ``name``; a ConfigError names the known methods or the
    missing module."""
    target = METHODS.get(name)
    if target is None:
        raise ConfigError(f"unknown compression method {name!r}; known methods: {', '.join(known_methods())}")
    module_name, func_name = target.split(":")
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
