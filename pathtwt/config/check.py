"""Workflow configuration checks, run by `pathtwt check-config` and by the Snakefile at
parse time, so that a bad config or label table fails before any job starts.

The schema (``schema.yaml`` beside this module, shipped as package data) fixes the keys
and their defaults; this module adds what a schema cannot say: label tables with duplicate slide ids, unknown
splits or slides missing on disk, and references between sections (a task naming a
cohort that does not exist). Every error is one line naming the file and the key.
"""

from __future__ import annotations

import copy
import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Mapping

from pathtwt.errors import ConfigError
from pathtwt.io.layout import RANDOM_INIT as RANDOM_INIT_VARIANT  # a reserved variant name and method
from pathtwt.io.slide_ids import check_slide_ids, check_workflow_path

# Read through importlib.resources, so an installed wheel finds it as well as a checkout.
SCHEMA_RESOURCE = ("pathtwt.config", "schema.yaml")
# Offending rows listed in one error line before it is cut short.
MAX_LISTED = 8


def load_yaml(path: str | os.PathLike) -> Any:
    import yaml

    path = Path(path)
    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.safe_load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None


def _key_path(parts: Iterable[Any]) -> str:
    return ".".join(str(p) for p in parts) or "<top level>"


def read_schema() -> dict:
    """schema.yaml as written: without the defaults and choices :func:`load_schema` fills in
    from the stages and registries."""
    import yaml
    from importlib.resources import files

    package, name = SCHEMA_RESOURCE
    return yaml.safe_load(files(package).joinpath(name).read_text(encoding="utf-8"))


def load_schema() -> dict:
    """The workflow config schema shipped with the package."""
    return with_compression_methods(with_mil_heads(with_stage_defaults(read_schema())))


def with_compression_methods(schema: dict) -> dict:
    """``schema`` with ``variants.NAME.method`` naming the methods of the registry
    (:data:`pathtwt.compress.registry.METHODS`) after the two reference rows, ``none`` (the
    uncompressed teacher) and ``random-init``, so a new method is accepted from its entry."""
    from pathtwt.compress.registry import METHODS

    node = schema["properties"]["variants"]["additionalProperties"]["properties"]["method"]
    if "enum" in node:
        raise ValueError("schema.yaml: variants.NAME.method has an enum of its own; it comes from "
                         "pathtwt/compress/registry.py")
    node["enum"] = ["none", RANDOM_INIT_VARIANT, *METHODS]
    return schema


def with_mil_heads(schema: dict) -> dict:
    """``schema`` with ``mil.heads`` naming the heads of the registry
    (:mod:`pathtwt.mil.heads`): the enum, the default and one line per head in the
    description, so a new head is accepted, defaulted and documented from its entry alone."""
    from pathtwt.mil import heads

    node = schema["properties"]["mil"]["properties"]["heads"]
    for key in ("enum", "default"):
        if key in node or key in node["items"]:
            raise ValueError(f"schema.yaml: mil.heads has an {key} of its own; it comes from pathtwt/mil/heads.py")
    node["items"]["enum"] = list(heads.names())
    node["default"] = heads.workflow_default()
    node["description"] = f"{node['description']}; {heads.summaries()}."
    return schema


def stage_defaults() -> dict[tuple[str, ...], dict[str, Any]]:
    """Schema section -> the defaults its keys take from the stage that runs them, each
    written once beside its stage: a cohort's ``tiling`` (``pathtwt tile``), ``compress``
    (``pathtwt compress``), ``discovery`` (the forward-pass batch size) and ``extract``
    (``pathtwt extract``)."""
    from dataclasses import asdict

    from pathtwt.compress.defaults import COMPRESS_DEFAULTS
    from pathtwt.features.options import EXTRACT_DEFAULTS
    from pathtwt.models.defaults import FORWARD_BATCH_SIZE
    from pathtwt.wsi.tiling import TILING_DEFAULTS

    compress = asdict(COMPRESS_DEFAULTS)
    return {
        ("cohorts", "additionalProperties", "tiling"): asdict(TILING_DEFAULTS),
        ("compress",): {k: compress[k] for k in SCHEMA_COMPRESS_KEYS},
        ("discovery",): {"tokens": COMPRESS_DEFAULTS.tokens, "batch_size": FORWARD_BATCH_SIZE},
        ("extract",): asdict(EXTRACT_DEFAULTS),
    }


# mil key -> the `pathtwt train-mil` flag that overrides the protocol's preset with it
MIL_OVERRIDES = {"epochs": "--epochs", "accumulation": "--accumulation", "hidden_dim": "--hidden-dim",
                 "transmil_heads": "--heads", "landmarks": "--landmarks"}
# the `pathtwt compress` settings the workflow config has a key for (same name, "_" for "-")
SCHEMA_COMPRESS_KEYS = ("steps", "epochs", "batch_size", "accumulate", "precision", "lr", "warmup_steps",
                        "audition_steps", "schedule", "layer_scale", "augment", "loss_norm", "seed", "rank_timeout")


def with_stage_defaults(schema: dict) -> dict:
    """``schema`` with the defaults of :func:`stage_defaults` filled in, so the workflow, the
    CLI and the option dataclasses cannot disagree (a default written in the schema as well
    is refused: it would be a second place for the fact)."""
    for path, defaults in stage_defaults().items():
        node = schema["properties"]
        for part in path[:-1]:
            node = node[part]
            node = node.get("properties", node)
        props = node[path[-1]]["properties"]
        for key, value in defaults.items():
            if "default" in props[key]:
                raise ValueError(f"schema.yaml: {'.'.join(path)}.{key} has a default of its own; it comes from the stage")
            props[key]["default"] = value
    return schema


def validate_schema(config: dict, *, source: str, schema_path: str | os.PathLike | None = None) -> dict:
    """Validate ``config`` against the schema and fill in defaults (on a deep copy, so
    two cohorts never share one default dict). Raises ConfigError naming the key."""
    import jsonschema

    schema = load_schema() if schema_path is None else load_yaml(schema_path)
    base = jsonschema.Draft202012Validator
    validate_properties = base.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema_node):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema_node)

    validator_cls = jsonschema.validators.extend(base, {"properties": set_defaults})
    config = copy.deepcopy(config) if config is not None else {}
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: the config must be a mapping of keys to values")
    errors = sorted(validator_cls(schema).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        # Every violation, one per line, so a config with several typos is fixed in one pass.
        lines = [f"key {_key_path(err.absolute_path)}: {err.message}{_did_you_mean(err)}" for err in errors]
        if len(lines) == 1:
            raise ConfigError(f"{source}: {lines[0]}")
        raise ConfigError(f"{source}: {len(lines)} problems:\n" + "\n".join(f"  {line}" for line in lines))
    fill_min_tissue(config)
    return config


def _did_you_mean(err) -> str:
    """For an unknown key, the known keys of that mapping closest to it (difflib), or ""."""
    import difflib

    if err.validator != "additionalProperties" or not isinstance(err.instance, dict):
        return ""
    known = list((err.schema.get("properties") or {}).keys())
    hints = []
    for key in err.instance:
        if key in known or not isinstance(key, str):
            continue
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        if close:
            hints.append(f"{key!r}: did you mean {close[0]!r}?")
    return f" ({'; '.join(hints)})" if hints else ""


def fill_min_tissue(config: dict) -> None:
    """A cohort's tiling.min_tissue left null becomes its filter's default, so the jobs get
    (and the coords files record) the value used."""
    from pathtwt.wsi.tiling import DEFAULT_MIN_TISSUE

    for cohort in (config.get("cohorts") or {}).values():
        tiling = cohort.get("tiling") if isinstance(cohort, dict) else None
        if isinstance(tiling, dict) and tiling.get("min_tissue") is None:
            tiling["min_tissue"] = DEFAULT_MIN_TISSUE.get(tiling.get("tissue", "fraction"), DEFAULT_MIN_TISSUE["fraction"])


def resolve(config: Mapping[str, Any], path: str) -> Path:
    """A cohort path as the workflow sees it: absolute, or relative to data_root."""
    p = Path(os.path.expandvars(os.path.expanduser(path)))
    return p if p.is_absolute() else Path(config.get("data_root", ".")) / p


def is_glob(spec: str) -> bool:
    return any(ch in spec for ch in "*?[")


def list_slides(config: Mapping[str, Any], cohort: str) -> dict[str, Path]:
    """slide_id -> slide file for a cohort's `slides` entry (folder, glob or CSV table).

    Names starting with "." are ignored (temporary files of atomic writes)."""
    cfg = config["cohorts"][cohort]
    spec = str(cfg["slides"])
    where = f"cohorts.{cohort}.slides"
    target = resolve(config, spec)
    if spec.endswith(".csv") and not is_glob(spec):
        return _slides_from_table(target, where)
    if is_glob(spec):
        candidates = [Path(p) for p in sorted(glob.glob(str(target)))]
    elif target.is_dir():
        candidates = sorted(target.iterdir())
    else:
        raise ConfigError(f"{target}: {where} is neither a folder, a glob nor a CSV table; fix the path")
    exts = tuple(e.lower() for e in cfg.get("extensions", []))
    slides: dict[str, Path] = {}
    for path in candidates:
        name = path.name
        if name.startswith(".") or not name.lower().endswith(exts):
            continue
        slide_id = name[: -len(next(e for e in exts if name.lower().endswith(e)))]
        if slide_id in slides:
            raise ConfigError(f"{path}: {where} holds two slides with the id {slide_id!r}; rename one")
        slides[slide_id] = path
    return slides


def _slides_from_table(table: Path, where: str) -> dict[str, Path]:
    import pandas as pd

    if not table.is_file():
        raise ConfigError(f"{table}: slide table of {where} not found")
    df = pd.read_csv(table, dtype=str, keep_default_na=False)
    missing = {"slide_id", "path"} - set(df.columns)
    if missing:
        raise ConfigError(f"{table}: slide table of {where} lacks columns {sorted(missing)}")
    dup = df["slide_id"][df["slide_id"].duplicated()].tolist()
    if dup:
        raise ConfigError(f"{table}: duplicate slide_id in {where}: {_listing(dup)}")
    check_slide_ids(list(df["slide_id"]), table, rows=[f"line {n}" for n in _data_lines(table, len(df))], workflow=True)
    return {
        row.slide_id: (Path(row.path) if Path(row.path).is_absolute() else table.parent / row.path)
        for row in df.itertuples()
    }


def _listing(items: list[Any]) -> str:
    shown = ", ".join(str(i) for i in items[:MAX_LISTED])
    return shown + (f" ... ({len(items)} in all)" if len(items) > MAX_LISTED else "")


@dataclass(frozen=True)
class LabelTable:
    """A cohort's label table reduced to the columns the workflow uses."""

    path: Path
    slide_ids: tuple[str, ...]
    labels: tuple[str, ...]
    splits: tuple[str, ...]
    lines: tuple[int, ...] = ()  # the file's line number of each row (1 = the header line)
    folds: tuple[int, ...] = ()  # cross-validation: each slide's test fold (-1: compression hold-out)

    def where(self, i: int) -> str:
        """How an error names row ``i``: its line in the file."""
        return f"line {self.lines[i]}" if i < len(self.lines) else f"data row {i + 1}"

    def ids_in_split(self, split: str) -> list[str]:
        return [s for s, sp in zip(self.slide_ids, self.splits) if sp == split]


def read_label_table(
    path: str | os.PathLike,
    *,
    label_column: str = "label",
    split_column: str = "split",
    splits: Iterable[str] = ("train", "val", "test"),
    where: str = "labels",
) -> LabelTable:
    """Read and check a label table; duplicate ids, empty labels and unknown splits are
    rejected with the offending rows, named by their line in the file."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: label table ({where}) not found")
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: label table ({where}) is not a readable CSV ({exc})") from None
    missing = [c for c in ("slide_id", label_column, split_column) if c not in df.columns]
    if missing:
        raise ConfigError(
            f"{path}: label table ({where}) lacks columns {missing}; it has {list(df.columns)}"
        )
    ids = df["slide_id"].str.strip()
    lines = _data_lines(path, len(df))
    rows = lambda mask: [f"line {lines[i]} ({ids[i]!r})" for i in mask[mask].index]  # noqa: E731
    dup = ids.duplicated(keep=False) & (ids != "")
    if dup.any():
        raise ConfigError(f"{path}: duplicate slide_id in {where}: {_listing(rows(dup))}")
    empty = (ids == "") | (df[label_column].str.strip() == "")
    if empty.any():
        raise ConfigError(f"{path}: empty slide_id or {label_column} in {where}: {_listing(rows(empty))}")
    check_slide_ids(list(ids), path, rows=[f"line {n}" for n in lines], workflow=True)
    allowed = list(splits)
    bad = ~df[split_column].str.strip().isin(allowed)
    if bad.any():
        listed = [f"{r}: {s!r}" for r, s in zip(rows(bad), df[split_column][bad])]
        raise ConfigError(
            f"{path}: unknown {split_column} in {where} (allowed {allowed}; set its `splits`): {_listing(listed)}"
        )
    return LabelTable(
        path=path,
        slide_ids=tuple(ids),
        labels=tuple(df[label_column].str.strip()),
        splits=tuple(df[split_column].str.strip()),
        lines=tuple(lines),
    )


def drawn_label_table(path: Path, *, label_column: str, draw: Mapping[str, Any], where: str) -> LabelTable:
    """A label table without a split column, with the seeded class-stratified split (or
    folds) the `labels` rule writes (`pathtwt labels split`: the same function, so the
    workflow's plan and the written table agree)."""
    from pathtwt.mil.label_builders import build_drawn_split, build_fold_split

    if not path.is_file():
        raise ConfigError(f"{path}: label table ({where}) not found")
    if draw.get("folds"):
        table = build_fold_split(path, draw["folds"], draw["seed"], label_column, draw.get("group_column"),
                                 draw.get("holdout") or 0.0)
    else:
        table = build_drawn_split(path, split_fractions(draw), draw["seed"], label_column)
    check_slide_ids(list(table["slide_id"]), path, rows=_lines_of_ids(path, table["slide_id"]), workflow=True)
    return LabelTable(
        path=path,
        slide_ids=tuple(table["slide_id"]),
        labels=tuple(str(v) for v in table["label"]),
        splits=tuple(table["split"]),
        folds=tuple(int(f) for f in table["fold"]) if "fold" in table.columns else (),
    )


def _lines_of_ids(path: Path, ids: Iterable[str]) -> list[str]:
    """How an error names the row of each of ``ids`` in the table ``path``: its line."""
    import pandas as pd

    raw = pd.read_csv(path, dtype=str, keep_default_na=False)["slide_id"].str.strip()
    line_of = dict(zip(raw, _data_lines(path, len(raw))))
    return [f"line {line_of[i]}" if i in line_of else "a row" for i in ids]


DEFAULT_FRACTIONS = (0.6, 0.2, 0.2)


def split_fractions(draw: Mapping[str, Any]) -> list[float]:
    """The train / val / test fractions of a drawn split (the default when none given)."""
    return list(draw.get("fractions") or DEFAULT_FRACTIONS)


def cohort_folds(config: Mapping[str, Any], cohort: str) -> int | None:
    """K of a cohort drawn into k folds, else None."""
    draw = config["cohorts"][cohort].get("draw_split") or {}
    return draw.get("folds") or None


def compression_split(config: Mapping[str, Any], task: Mapping[str, Any]) -> str:
    """The split of a task's cohort that compression draws from: the compression-only
    hold-out of a cross-validated cohort, else the task's training split."""
    from pathtwt.mil.folds import HOLDOUT_SPLIT

    return HOLDOUT_SPLIT if cohort_folds(config, task["cohort"]) else task["train_split"]


# Methods with no compress job: the teacher itself, and its architecture with random weights.
NOT_COMPRESSED = ("none", RANDOM_INIT_VARIANT)


def backbone_variants(config: Mapping[str, Any], backbone: Mapping[str, Any]) -> list[str]:
    """The variant names of a backbone (its config section): its ``variants``, else every
    variant; only those the config defines."""
    return [v for v in (backbone["variants"] or list(config["variants"])) if v in config["variants"]]


def compressed_variants(config: Mapping[str, Any], backbone: Mapping[str, Any]) -> list[str]:
    """A backbone's variants that a compress job makes (method neither ``none`` nor ``random-init``)."""
    return [v for v in backbone_variants(config, backbone) if config["variants"][v]["method"] not in NOT_COMPRESSED]


def is_calibrated(config: Mapping[str, Any], backbone: Mapping[str, Any]) -> bool:
    """Whether a backbone's calibration tiles are drawn: a compressed variant, or the analyses."""
    return bool(compressed_variants(config, backbone)) or bool(config.get("analysis", {}).get("enabled"))


def backbone_calibration_slides(config: Mapping[str, Any], backbone: Mapping[str, Any],
                                table_of: Callable[[str], LabelTable | None]) -> list[tuple[str, str]]:
    """(cohort, slide id) of a backbone's calibration tiles (its config section), in the
    order the draw reads them: its coords files sorted as paths, by cohort, then by file
    name. ``table_of(cohort)``: the cohort's label table (None: the cohort is left out)."""
    slides = set()
    for task_name in backbone["calibrate_on"] or list(config["tasks"]):
        task = config["tasks"][task_name]
        table = table_of(task["cohort"])
        if table is not None:
            slides.update((task["cohort"], s) for s in table.ids_in_split(compression_split(config, task)))
    return sorted(slides, key=lambda cs: PurePosixPath(cs[0], f"{cs[1]}.h5"))


def calibration_slides(config: Mapping[str, Any], tables: Mapping[str, LabelTable]) -> dict[str, list[tuple[str, str]]]:
    """backbone -> the (cohort, slide id) its calibration tiles are drawn from, for every
    backbone that is calibrated (:func:`is_calibrated`); only cohorts of ``tables``."""
    return {name: backbone_calibration_slides(config, bb, tables.get)
            for name, bb in config["backbones"].items() if is_calibrated(config, bb)}


def check_fold_draws(config: Mapping[str, Any], *, source: str) -> None:
    """`folds` excludes `fractions`; `group_column` and `holdout` need `folds`; and a
    cross-validated cohort that compression calibrates on must hold out its compression
    slides, else compression would see slides the folds report on."""
    for name, cohort in config["cohorts"].items():
        draw = cohort.get("draw_split") or {}
        key = f"cohorts.{name}.draw_split"
        if draw.get("folds") and draw.get("fractions") is not None:
            raise ConfigError(f"{source}: key {key}: give `folds` or `fractions`, not both (folds test every slide once)")
        if draw.get("folds") is not None:
            from pathtwt.mil.folds import check_fold_count

            check_fold_count(draw["folds"], f"{source}: key {key}.folds")
        if not draw.get("folds"):
            for extra in ("group_column", "holdout"):
                if draw.get(extra):
                    raise ConfigError(f"{source}: key {key}.{extra}: only with `folds`")
            continue
        if draw.get("holdout"):
            continue
        calibrating = [b for b, bb in config["backbones"].items()
                       if any(config["tasks"][t]["cohort"] == name for t in (bb["calibrate_on"] or list(config["tasks"])))
                       and compressed_variants(config, bb)]
        if calibrating:
            raise ConfigError(
                f"{source}: key {key}.holdout: backbone {calibrating[0]} is compressed on cohort {name}, whose every slide "
                "a fold reports on; hold out a compression-only part (e.g. holdout: 0.2) or calibrate on another task's cohort"
            )


# The "split" of a cohort only tested externally, whose label table has no split column.
ALL_TEST = {"fractions": [0.0, 0.0, 1.0], "seed": 0, "folds": None}


def split_draw(config: Mapping[str, Any], cohort: str) -> Mapping[str, Any] | None:
    """How a cohort's split is drawn: its `draw_split`; for a cohort that no task trains
    on (external test only) whose label table has no split column, every slide in test;
    else None (the table's split column is read)."""
    cfg = config["cohorts"][cohort]
    if cfg.get("draw_split"):
        return cfg["draw_split"]
    if any(t["cohort"] == cohort for t in config["tasks"].values()):
        return None
    path = resolve(config, cfg["labels"])
    try:
        with open(path, encoding="utf-8") as fh:
            header = [c.strip() for c in fh.readline().strip().split(",")]
    except (OSError, UnicodeDecodeError):
        return None  # read_label_table says what is wrong with the file
    return None if cfg["split_column"] in header else ALL_TEST


def _data_lines(path: Path, n_rows: int) -> list[int]:
    """The file line of each data row as pandas reads them (blank lines skipped, the
    first non-blank line the header); quoted fields spanning lines are not counted apart."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        nonblank = [k + 1 for k, line in enumerate(fh) if line.strip()]
    lines = nonblank[1 : n_rows + 1]
    # a quoted newline makes fewer rows than lines; fall back to counting after the header
    return lines if len(lines) == n_rows else [i + 2 for i in range(n_rows)]


def cohort_label_table(config: Mapping[str, Any], cohort: str) -> LabelTable:
    cfg = config["cohorts"][cohort]
    draw = split_draw(config, cohort)
    if draw:
        return drawn_label_table(
            resolve(config, cfg["labels"]), label_column=cfg["label_column"], draw=draw,
            where=f"cohorts.{cohort}.labels",
        )
    return read_label_table(
        resolve(config, cfg["labels"]),
        label_column=cfg["label_column"],
        split_column=cfg["split_column"],
        splits=cfg["splits"],
        where=f"cohorts.{cohort}.labels",
    )


def check_slides_on_disk(config: Mapping[str, Any], cohort: str, table: LabelTable) -> dict[str, Path]:
    """slide_id -> path for every labelled slide; labelled slides without a file are an error."""
    found = list_slides(config, cohort)
    missing = [f"{table.where(i)} ({s!r})" for i, s in enumerate(table.slide_ids) if s not in found or not found[s].exists()]
    if missing:
        raise ConfigError(
            f"{table.path}: slides of cohorts.{cohort} missing on disk under "
            f"{resolve(config, config['cohorts'][cohort]['slides'])}: {_listing(missing)}"
        )
    for i, slide_id in enumerate(table.slide_ids):
        check_workflow_path(found[slide_id], f"the slide of {table.path} {table.where(i)}")
    return {s: found[s] for s in table.slide_ids}


def demo_pending(config: Mapping[str, Any], cohort: str) -> bool:
    """True for a demo cohort whose data the workflow has not generated yet."""
    cfg = config["cohorts"][cohort]
    return bool(cfg.get("demo")) and not resolve(config, cfg["labels"]).is_file()


def check_references(config: Mapping[str, Any], *, source: str) -> None:
    from pathtwt.compress.registry import METHODS, goal_of

    cohorts, tasks, variants = config["cohorts"], config["tasks"], config["variants"]
    for name, task in tasks.items():
        for key, cohort in [("cohort", task["cohort"])] + [("external", c) for c in task["external"]]:
            if cohort not in cohorts:
                raise ConfigError(f"{source}: key tasks.{name}.{key}: unknown cohort {cohort!r}; add it under cohorts")
        splits = cohorts[task["cohort"]]["splits"]
        for key in ("train_split", "val_split", "test_split"):
            if task[key] not in splits:
                raise ConfigError(
                    f"{source}: key tasks.{name}.{key}: split {task[key]!r} is not one of "
                    f"cohorts.{task['cohort']}.splits {splits}"
                )
    for name, bb in config["backbones"].items():
        check_backbone_name(name, f"{source}: key backbones.{name}")
        if bb["fallback"]:
            check_backbone_name(bb["fallback"], f"{source}: key backbones.{name}.fallback")
        for task in bb["calibrate_on"]:
            if task not in tasks:
                raise ConfigError(f"{source}: key backbones.{name}.calibrate_on: unknown task {task!r}")
        for variant in bb["variants"]:
            if variant not in variants:
                raise ConfigError(f"{source}: key backbones.{name}.variants: unknown variant {variant!r}")
    for name, var in variants.items():
        if var["method"] == RANDOM_INIT_VARIANT:
            if name != RANDOM_INIT_VARIANT or var["depth"] is not None or var["eps"] is not None:
                raise ConfigError(
                    f"{source}: key variants.{name}: method random-init is the variant named random-init "
                    "(the teacher's full architecture with random weights); give no depth or eps"
                )
            continue
        goal = goal_of(var["method"])
        if goal == "none" and var["method"] != "none":  # every layer kept (NOSE: attention removed)
            if var["depth"] is not None or var["eps"] is not None:
                raise ConfigError(f"{source}: key variants.{name}: the {var['method']} method keeps every layer; "
                                  "give no depth or eps")
            continue
        if var["method"] != "none" and (var["depth"] is None) == (var["eps"] is None):
            raise ConfigError(f"{source}: key variants.{name}: give exactly one of depth and eps")
        if var["eps"] is not None and goal != "depth or eps":
            takes = ", ".join(m for m, spec in METHODS.items() if spec.goal == "depth or eps")
            raise ConfigError(f"{source}: key variants.{name}.eps: only {takes} takes eps; give a depth")
    if RANDOM_INIT_VARIANT in variants and variants[RANDOM_INIT_VARIANT]["method"] != RANDOM_INIT_VARIANT:
        raise ConfigError(
            f"{source}: key variants.{RANDOM_INIT_VARIANT}: the name is reserved for the random-init reference "
            "(method: random-init); rename the variant"
        )
    if any(c.get("demo") for c in cohorts.values()) and not config["demo"]["enabled"]:
        raise ConfigError(f"{source}: key demo.enabled: cohorts marked demo: true need demo.enabled: true")
    check_fold_draws(config, source=source)


def check_backbone_name(name: str, where: str) -> None:
    """A backbone of the config is a registry name (:data:`pathtwt.models.encoders.BACKBONES`);
    an unknown one is refused with the closest names."""
    import difflib

    from pathtwt.models.encoders import BACKBONES

    if name in BACKBONES:
        return
    close = difflib.get_close_matches(str(name).lower(), BACKBONES, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else \
        f"the registry's names: {', '.join(sorted(b for b in BACKBONES if not b.endswith('-tiny')))}"
    raise ConfigError(f"{where}: unknown backbone {name!r}; {hint} (`pathtwt extract --help` lists them)")


def available_probes(config: Mapping[str, Any], *, source: str) -> tuple[list[str], list[str]]:
    """(probe sets to run, probe sets skipped). A probe set whose tiles folder or split
    file is absent is skipped when its `if_missing` is `skip` (a probe set on data that
    may not be checked out, as in the demo), else an error naming the key."""
    run, skipped = [], []
    for name, probe in config.get("probes", {}).items():
        absent = [
            (key, Path(probe[key])) for key, is_there in (("tiles", Path.is_dir), ("split_file", Path.is_file))
            if probe.get(key) is not None and not is_there(Path(probe[key]))
        ]
        if not absent:
            run.append(name)
        elif probe.get("if_missing") == "skip":
            skipped.append(name)
        else:
            key, path = absent[0]
            raise ConfigError(
                f"{source}: key probes.{name}.{key}: {path} not found; fix the path or set probes.{name}.if_missing: skip"
            )
    return run, skipped


def check_config(config: Mapping[str, Any], *, source: str, require_slides: bool = True) -> dict[str, LabelTable]:
    """Cross-section references, label tables and slides on disk. Returns the label
    tables of cohorts whose data exist (demo cohorts not generated yet are skipped)."""
    check_references(config, source=source)
    check_workflow_paths(config)
    if require_slides:
        available_probes(config, source=source)
    tables: dict[str, LabelTable] = {}
    for cohort in config["cohorts"]:
        if demo_pending(config, cohort):
            continue
        tables[cohort] = cohort_label_table(config, cohort)
        if require_slides:
            paths = check_slides_on_disk(config, cohort, tables[cohort])
            check_pixel_sizes(config, cohort, paths)
            check_roi_folder(config, cohort, paths)
    check_training_classes(config, tables, source=source)
    return tables


def check_workflow_paths(config: Mapping[str, Any]) -> None:
    """The config's own paths that reach the workflow's rules as files (label tables,
    slide and ROI folders, weights, probe tiles) can be carried: no braces, which Snakemake
    reads as wildcards, no control characters (:func:`pathtwt.io.slide_ids.workflow_problem`)."""
    keys = [(f"cohorts.{c}.{k}", cfg.get(k)) for c, cfg in config["cohorts"].items() for k in ("slides", "labels", "roi")]
    keys += [(f"backbones.{b}.weights", bb.get("weights")) for b, bb in config["backbones"].items()]
    keys += [(f"probes.{n}.{k}", pr.get(k)) for n, pr in (config.get("probes") or {}).items() for k in ("tiles", "split_file")]
    for key, value in keys:
        if value:
            check_workflow_path(resolve(config, str(value)), key)


def roi_file(config: Mapping[str, Any], cohort: str, slide: str) -> Path | None:
    """A slide's GeoJSON in its cohort's `roi` folder (``{slide}.geojson``); None when the
    cohort has no such folder or the slide no file in it (the slide is tiled whole)."""
    folder = config["cohorts"][cohort].get("roi")
    path = resolve(config, folder) / f"{slide}.geojson" if folder else None
    return path if path is not None and path.is_file() else None


def check_roi_folder(config: Mapping[str, Any], cohort: str, paths: Mapping[str, Path]) -> None:
    """A cohort's `roi` folder exists and each GeoJSON in it is named after a slide of the
    cohort (a misnamed file would leave its slide tiled whole without a word)."""
    folder = config["cohorts"][cohort].get("roi")
    if not folder:
        return
    target = resolve(config, folder)
    if not target.is_dir():
        raise ConfigError(f"{target}: cohorts.{cohort}.roi is not a folder; give the folder of <slide_id>.geojson files")
    strays = sorted(p.name for p in target.glob("*.geojson") if p.stem not in paths)
    if strays:
        raise ConfigError(f"{target}: GeoJSON file(s) named after no slide of cohorts.{cohort}: {_listing(strays)}; "
                          "name each <slide_id>.geojson")


def check_training_classes(config: Mapping[str, Any], tables: Mapping[str, LabelTable], *, source: str) -> None:
    """Every class a task's training cohort labels has at least one slide in the
    training split (a head cannot learn a class it never sees, yet val and test would
    count it)."""
    for name, task in config["tasks"].items():
        table = tables.get(task["cohort"])
        if table is None or table.folds:  # folds: every fold holds every class (checked when drawn)
            continue
        train = {lab for lab, sp in zip(table.labels, table.splits) if sp == task["train_split"]}
        absent = sorted(set(table.labels) - train, key=lambda v: (len(v), v))
        if absent:
            cohort = config["cohorts"][task["cohort"]]
            how = "the drawn split (cohorts.{}.draw_split)".format(task["cohort"]) if cohort.get("draw_split") else \
                f"its {cohort['split_column']} column"
            raise ConfigError(
                f"{table.path}: task {name} ({source}): class(es) {', '.join(absent)} have no slide in split "
                f"{task['train_split']!r} after {how}; add training slides of those classes or change the split"
            )


def check_pixel_sizes(config: Mapping[str, Any], cohort: str, paths: Mapping[str, Path]) -> None:
    """Plain images (JPEG, PNG) of a cohort: each must get a pixel size (its file's, or
    the cohort's `mpp_fallback`). Images whose files state sizes that differ from each
    other while others take the cohort's value would be tiled at a scale nobody stated,
    so the cohort is refused naming which images have which size. A truncated JPEG is
    refused by name. Reads only headers and the last bytes of each file."""
    from pathtwt.wsi.images import SUFFIXES, image_format, jpeg_is_complete, stated_mpp
    from pathtwt.wsi.slides import MPP_MAX, MPP_MIN

    images = {s: p for s, p in paths.items() if p.suffix.lower() in SUFFIXES}
    if not images:
        return
    fallback = config["cohorts"][cohort].get("mpp_fallback")
    sizes: dict[str, list[str]] = {}  # "0.42 um/px" -> slide ids
    from_cohort = False
    for slide_id, path in images.items():
        # a cut-short copy is refused here, by name, rather than by its tile job mid-run
        if image_format(path) == "JPEG" and not jpeg_is_complete(path):
            if config["cohorts"][cohort]["tiling"].get("on_failure") == "record":
                continue  # its tile job records it as failed
            raise ConfigError(
                f"{path}: the JPEG of cohorts.{cohort} is truncated (no end-of-image marker); copy it again "
                f"from the source, remove it and its label row, or set cohorts.{cohort}.tiling.on_failure: record "
                "to leave it out and record it"
            )
        mpp = stated_mpp(path)
        if mpp is None or not MPP_MIN <= mpp <= MPP_MAX:
            if fallback is None:
                raise ConfigError(
                    f"{path}: the image file states no pixel size; set cohorts.{cohort}.mpp_fallback "
                    "to the scan resolution in um/px"
                )
            mpp, from_cohort = float(fallback), True
        sizes.setdefault(f"{mpp:.3g} um/px", []).append(slide_id)
    # images that all state their own sizes are each tiled at their own scale; the cohort's
    # value beside other stated sizes is the ambiguous case
    if len(sizes) > 1 and from_cohort:
        groups = "; ".join(f"{k}: {len(v)} image(s), e.g. {_listing(sorted(v)[:3])}" for k, v in sizes.items())
        raise ConfigError(
            f"{resolve(config, config['cohorts'][cohort]['slides'])}: cohorts.{cohort} mixes images of different "
            f"pixel sizes while not every image states its own (the others take mpp_fallback {fallback}): "
            f"{groups}; split it into one cohort per pixel size, or write each image's size into its file (dpi)"
        )


def read_and_check_slides(config: Mapping[str, Any], tables: Mapping[str, LabelTable], *, source: str,
                          jobs: int | None = None, cache: Path | None = None) -> list[str]:
    """Open, tile and read every labelled slide (:mod:`pathtwt.config.slide_reads`): raise
    one line naming the slides that cannot be read; return warnings (slides to be recorded
    as failed, a calibration asking more tiles than its slides hold)."""
    from pathtwt.config import slide_reads

    paths = {cohort: check_slides_on_disk(config, cohort, table) for cohort, table in tables.items()}
    found = slide_reads.read_slides(config, paths, jobs=jobs, cache=cache)
    warnings = slide_reads.refuse_unreadable(config, tables, found, source=source)
    return warnings + slide_reads.calibration_warnings(config, calibration_slides(config, tables), found)


def study_name(config: Mapping[str, Any], config_files: Iterable[str | os.PathLike]) -> str:
    """The study's name: its ``study`` key, else the name of the last config file (its
    characters outside letters, digits, ``_.-`` as ``-``); its results lie in results/NAME."""
    if config.get("study"):
        return str(config["study"])
    files = [Path(f) for f in config_files]
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", files[-1].stem if files else "").strip("-.")
    return stem or "study"


def load_and_check(paths: Iterable[str | os.PathLike], *, require_slides: bool = True) -> tuple[dict, dict[str, LabelTable]]:
    """Merge config files (later ones override keys of earlier ones, as Snakemake's
    --configfile does), validate (the study named, :func:`study_name`), and check the tables."""
    merged: dict = {}
    names = []
    for path in paths:
        data = load_yaml(path) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the config must be a mapping of keys to values")
        _deep_update(merged, data)
        names.append(str(path))
    source = " + ".join(names)
    config = validate_schema(merged, source=source)
    config["study"] = study_name(config, names)
    return config, check_config(config, source=source, require_slides=require_slides)


def _deep_update(base: dict, new: Mapping) -> None:
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _deep_update(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


def write_normalized_labels(table: LabelTable, out: str | os.PathLike, rename: Mapping[str, str] | None = None) -> None:
    """The label table as `pathtwt train-mil` reads it: slide_id,label,split, with the
    cohort's split names renamed to train/val/test (``rename``: old -> new)."""
    import csv
    import io

    from pathtwt.io.atomic import write_text_atomic

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["slide_id", "label", "split"])
    rename = dict(rename or {})
    writer.writerows(zip(table.slide_ids, table.labels, (rename.get(s, s) for s in table.splits)))
    write_text_atomic(out, buf.getvalue())
