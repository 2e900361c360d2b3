"""The methods' own settings (``pathtwt compress --option KEY=VALUE``, the config's
``variants.NAME.options``): each key once, with the method that reads it, its default
and what it does. The CLI's help and its check of the keys, and every method's read of a
setting, come from this table, so a default is written in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class MethodOption:
    method: str  # the method that reads it (a name of pathtwt.compress.registry.METHODS)
    default: Any  # a number or a bool; None: derived from the run (``derived`` says how)
    meaning: str = ""
    derived: str = ""  # the default in words, where the run decides it


METHOD_OPTIONS: dict[str, MethodOption] = {
    "audition_lr": MethodOption("twt", 1e-4, "learning rate of the surrogates' audition fits"),
    "ridge": MethodOption("linear", 1e-6, "ridge penalty of the least-squares maps"),
    "linear_single_layers": MethodOption("linear", False, "replace single-layer blocks too"),
    "fold": MethodOption("linear", False, "merge each map into the preceding MLP (ReplaceMe)"),
    "stage1_fraction": MethodOption("raptor", 0.3, "share of the budget for the block-wise stage 1"),
    "rollout_ramp": MethodOption("raptor", 0.25, "share of stage 1 over which the rollout weight rises to 1"),
    "time_scale": MethodOption("raptor", True, "per-block layer-number conditioning"),
    "probe_hidden": MethodOption("wdpruning", 2048, "hidden width of the embedding probe"),
    "keep_attention": MethodOption("nose", 0, "layers that keep attention (0: removed from every layer)"),
    "dilute_fraction": MethodOption("nose", 0.3, "share of the budget over which attention is diluted"),
    "search_budget": MethodOption("subset", None, "subsets scored", derived="2L+12"),
    "search_steps": MethodOption("subset", None, "distillation steps per scored subset", derived="steps/10"),
    "random_control": MethodOption("subset", False, "draw subsets at random (the search's control)"),
}


def method_option(extra: Mapping[str, Any], key: str, derived: Any = None) -> Any:
    """The run's value of ``key`` (``options.extra``), else the table's default, else
    ``derived`` (the default the run computes, for keys whose default depends on it)."""
    spec = METHOD_OPTIONS[key]  # a KeyError here is a method reading a key it never declared
    value = extra.get(key)
    if value is not None:
        return value
    return derived if spec.default is None else spec.default


def describe(key: str) -> str:
    """``method; default D: meaning``, as the CLI's help lists each key."""
    spec = METHOD_OPTIONS[key]
    default = spec.derived or (str(spec.default).lower() if isinstance(spec.default, bool) else f"{spec.default:g}")
    kind = "true/false, " if isinstance(spec.default, bool) else ""
    return f"{spec.method}; {kind}default {default}" + (f": {spec.meaning}" if spec.meaning else "")
