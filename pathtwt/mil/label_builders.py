"""Label tables (``slide_id,label,split``) built from the metadata tables the paper's
cohorts are published with (the expected columns are in config/README.md):

* PANDA: ``train.csv`` (``image_id``, ``isup_grade``) and a split file (the Song et al.
  split: ``slide_id`` or ``image_id`` with a ``split`` or ``fold_0`` column);
* TCGA-PRAD: the clinical table (primary and secondary Gleason pattern per patient)
  and the slides, labelled with the ISUP grade group of their patient;
* CAMELYON17: ``stage_labels.csv`` (``patient,stage``; the per-slide rows), optionally
  overridden by a corrected table in the same format; patients split train/val/test;
* CAMELYON16: the test set's ``reference.csv`` (``name,class,...``) and optionally the
  training slides, labelled by their file names ``normal_*`` / ``tumor_*``;
* any table of ``slide_id,label[,...]`` without a split (e.g. BACH's ``labels.csv``): a
  seeded split drawn per class (:func:`build_drawn_split`), by slide, since such cohorts
  name no patients.

Every row that cannot be read is reported with its file, line number and value, all at
once, so a table is fixed in one pass. Extra columns (``isup_grade``, ``stage``,
``patient``...) are kept for the reader; the workflow uses ``label`` or the configured
``label_column``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from pathtwt.errors import ConfigError
from pathtwt.wsi import formats as _formats
from pathtwt.mil.labels import gleason_to_isup, slide_listing

MISSING = {"", "'--", "--", "na", "nan", "none", "[not available]", "[not applicable]", "[unknown]", "[discrepancy]"}
SPLIT_NAMES = {"train": "train", "training": "train", "val": "val", "valid": "val", "validation": "val",
               "test": "test", "testing": "test"}
C17_STAGES = {"negative": 0, "itc": 1, "micro": 1, "macro": 1}  # label 1 = metastasis of any size
# a slide name in a table may end in any slide format's suffix (pathtwt.wsi.formats) or an archive's
SLIDE_SUFFIXES = _formats.SLIDE_SUFFIXES + _formats.ARCHIVE_SUFFIXES


# -- reading -------------------------------------------------------------------------


def read_table(path: str | os.PathLike, what: str) -> pd.DataFrame:
    """A CSV (``.csv``) or tab-separated (``.tsv``/``.txt``) table, every cell as text."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: {what} not found")
    sep = "\t" if path.suffix.lower() in (".tsv", ".txt") else ","
    try:
        table = pd.read_csv(path, sep=sep, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {what} is not a readable table ({exc})") from None
    table.columns = [str(c).strip() for c in table.columns]
    return table


def pick_column(table: pd.DataFrame, candidates: Sequence[str], path: Path, what: str) -> str:
    for name in candidates:
        if name in table.columns:
            return name
    raise ConfigError(
        f"{path}: {what} has none of the columns {', '.join(candidates)}; found {', '.join(map(str, table.columns))}"
    )


def line(index: int) -> int:
    """File line of table row ``index`` (line 1 is the header)."""
    return int(index) + 2


def fail_rows(path: Path, problem: str, bad: list[str], hint: str) -> None:
    if bad:
        raise ConfigError(f"{path}: {problem} at {slide_listing(bad)}; {hint}")


def strip_slide_suffix(name: str) -> str:
    name = name.strip()
    for suffix in SLIDE_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def read_splits(path: str | os.PathLike, column: str | None = None) -> dict[str, str]:
    """slide id -> train/val/test from a split file: ``slide_id`` (or ``image_id``) and
    ``split`` (or the Patho-Bench style ``fold_0``, or ``column``)."""
    path = Path(path)
    table = read_table(path, "split file")
    ids = pick_column(table, ("slide_id", "image_id"), path, "split file")
    col = pick_column(table, (column,) if column else ("split", "fold_0"), path, "split file")
    out: dict[str, str] = {}
    bad = []
    for i, (sid, value) in enumerate(zip(table[ids], table[col])):
        split = SPLIT_NAMES.get(value.strip().lower())
        if split is None:
            bad.append(f"line {line(i)} ({col}={value!r})")
            continue
        out[strip_slide_suffix(sid)] = split
    fail_rows(path, "split not train/val/test", bad, "use train, val or test")
    return out


def finish(rows: pd.DataFrame, where: str) -> pd.DataFrame:
    from pathtwt.io.slide_ids import check_slide_ids

    check_slide_ids(list(rows["slide_id"]), where)
    dupes = sorted(rows.loc[rows["slide_id"].duplicated(), "slide_id"].unique())
    if dupes:
        raise ConfigError(f"{where}: slide(s) listed more than once: {slide_listing(dupes)}; keep one row per slide")
    rows = rows.sort_values("slide_id", kind="stable").reset_index(drop=True)
    rows["label"] = rows["label"].astype(np.int64)
    first = ["slide_id", "label", "split"]
    return rows[first + [c for c in rows.columns if c not in first]]


def write_label_table(table: pd.DataFrame, out: str | os.PathLike) -> None:
    from pathtwt.io.atomic import atomic_output

    with atomic_output(out) as tmp:
        table.to_csv(tmp, index=False)


# -- PANDA ---------------------------------------------------------------------------


def build_panda(train_csv: str | os.PathLike, split_file: str | os.PathLike, split_column: str | None = None) -> pd.DataFrame:
    """PANDA ``train.csv`` (``image_id``, ``isup_grade`` 0..5, ``data_provider``,
    ``gleason_score``) with the split of ``split_file``. A slide of the split file that
    ``train.csv`` lacks is an error; a slide of ``train.csv`` the split leaves out is
    left out (the Song et al. split drops a few slides)."""
    path = Path(train_csv)
    table = read_table(path, "PANDA train.csv")
    for col in ("image_id", "isup_grade"):
        pick_column(table, (col,), path, "PANDA train.csv")
    splits = read_splits(split_file, split_column)
    known = set(table["image_id"].str.strip())
    unknown = sorted(s for s in splits if s not in known)
    if unknown:
        raise ConfigError(
            f"{split_file}: {len(unknown)} slide(s) of the split are not in {path}: {slide_listing(unknown)}; "
            "are the split and train.csv of the same PANDA release?"
        )
    bad, rows = [], []
    for i, row in table.iterrows():
        sid = row["image_id"].strip()
        if sid not in splits:
            continue
        grade = row["isup_grade"].strip()
        if not (grade.isdigit() and 0 <= int(grade) <= 5):
            bad.append(f"line {line(i)} ({sid}: isup_grade={grade!r})")
            continue
        extra = {c: row[c] for c in ("data_provider", "gleason_score") if c in table.columns}
        rows.append({"slide_id": sid, "label": int(grade), "split": splits[sid], "isup_grade": int(grade), **extra})
    fail_rows(path, "isup_grade not an integer 0..5", bad, "fix these rows of train.csv")
    return finish(pd.DataFrame(rows), str(path))


# -- TCGA-PRAD -----------------------------------------------------------------------

TCGA_PATIENT = ("bcr_patient_barcode", "cases.submitter_id", "case_submitter_id", "submitter_id")
TCGA_PRIMARY = ("gleason_pattern_primary", "diagnoses.primary_gleason_grade", "primary_gleason_grade",
                "primary_pattern")
TCGA_SECONDARY = ("gleason_pattern_secondary", "diagnoses.secondary_gleason_grade", "secondary_gleason_grade",
                  "secondary_pattern")


def gleason_pattern(value: str) -> int | None:
    """3, "3", "3.0" or GDC's "Pattern 3" -> 3; a missing marker -> None; else ValueError."""
    text = value.strip()
    if text.lower() in MISSING:
        return None
    match = re.fullmatch(r"(?:pattern\s*)?([1-5])(?:\.0)?", text, flags=re.IGNORECASE)
    if not match:
        raise ValueError(text)
    return int(match.group(1))


def slide_names(slides: str | os.PathLike) -> list[str]:
    """Slide ids from a folder of slides, a GDC manifest (``filename`` column), a table
    with ``slide_id``, or a plain list of file names (one a line)."""
    path = Path(slides)
    if path.is_dir():
        names = [p.name for p in sorted(path.iterdir()) if p.suffix.lower() in SLIDE_SUFFIXES]
    elif path.is_file():
        first = path.read_text(encoding="utf-8").splitlines()[:1]
        header = re.split(r"[\t,]", first[0]) if first else []
        if "filename" in header or "slide_id" in header:
            table = read_table(path, "slide list")
            names = list(table["filename" if "filename" in table.columns else "slide_id"])
        else:
            names = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    else:
        raise ConfigError(f"{path}: slide folder or list not found")
    ids = [strip_slide_suffix(n) for n in names if n.strip()]
    if not ids:
        raise ConfigError(f"{path}: no slides found (looked for {', '.join(SLIDE_SUFFIXES)})")
    return ids


def build_tcga_prad(clinical: str | os.PathLike, slides: str | os.PathLike, split: str = "test") -> pd.DataFrame:
    """Each slide labelled with the ISUP grade group of its patient's Gleason pattern
    (``pathtwt.mil.labels.gleason_to_isup``); the patient is the first 12 characters of
    a TCGA slide name (``TCGA-XX-XXXX``)."""
    path = Path(clinical)
    table = read_table(path, "TCGA clinical table")
    pcol = pick_column(table, TCGA_PATIENT, path, "TCGA clinical table")
    c1 = pick_column(table, TCGA_PRIMARY, path, "TCGA clinical table")
    c2 = pick_column(table, TCGA_SECONDARY, path, "TCGA clinical table")
    split = SPLIT_NAMES.get(split.lower(), "")
    if not split:
        raise ConfigError("--split must be train, val or test")
    ids = slide_names(slides)
    wanted = {sid[:12] for sid in ids}
    grades: dict[str, tuple[int, int, int]] = {}
    bad, conflicts = [], []
    for i, row in table.iterrows():
        patient = row[pcol].strip()
        # the BCR tables repeat the header and add a CDE_ID line under it
        if patient in table.columns or patient.startswith("CDE_ID") or patient not in wanted:
            continue
        try:
            p, s = gleason_pattern(row[c1]), gleason_pattern(row[c2])
        except ValueError:
            bad.append(f"line {line(i)} ({patient}: {c1}={row[c1]!r}, {c2}={row[c2]!r})")
            continue
        if p is None or s is None:
            bad.append(f"line {line(i)} ({patient}: {c1}={row[c1]!r}, {c2}={row[c2]!r})")
            continue
        entry = (p, s, gleason_to_isup(p, s))
        if patient in grades and grades[patient] != entry:
            conflicts.append(f"line {line(i)} ({patient}: {p}+{s} vs {grades[patient][0]}+{grades[patient][1]})")
        grades.setdefault(patient, entry)
    fail_rows(path, "no Gleason primary/secondary pattern 1..5", bad,
              "complete these patients' patterns or remove their slides from the slide list")
    fail_rows(path, "one patient with two different Gleason scores", conflicts, "keep one score per patient")
    unknown = sorted(sid for sid in ids if sid[:12] not in grades)
    if unknown:
        raise ConfigError(
            f"{path}: {len(unknown)} slide(s) whose patient is not in the clinical table: {slide_listing(unknown)}; "
            "use the clinical table of the same TCGA-PRAD download"
        )
    rows = [
        {"slide_id": sid, "label": grades[sid[:12]][2], "split": split, "isup_grade": grades[sid[:12]][2],
         "patient": sid[:12], "gleason": f"{grades[sid[:12]][0]}+{grades[sid[:12]][1]}"}
        for sid in ids
    ]
    return finish(pd.DataFrame(rows), str(path))


# -- CAMELYON17 ----------------------------------------------------------------------


def c17_slide_stages(path: Path) -> dict[str, tuple[str, int]]:
    """slide id -> (stage, line) from the slide rows of a ``patient,stage`` table."""
    table = read_table(path, "CAMELYON17 stage table")
    pick_column(table, ("patient",), path, "CAMELYON17 stage table")
    pick_column(table, ("stage",), path, "CAMELYON17 stage table")
    out, bad = {}, []
    for i, (name, stage) in enumerate(zip(table["patient"], table["stage"])):
        name, stage = name.strip(), stage.strip().lower()
        if name.lower().endswith(".zip"):
            continue  # the patient's pN stage, not a slide
        if stage not in C17_STAGES:
            bad.append(f"line {line(i)} ({name}: stage={stage!r})")
            continue
        out[strip_slide_suffix(name)] = (stage, line(i))
    fail_rows(path, "slide stage not negative/itc/micro/macro", bad, "fix these rows")
    return out


def patient_of(slide_id: str) -> str:
    return slide_id.split("_node_")[0]


def split_patients(
    patients: dict[str, int], fractions: Sequence[float], seed: int
) -> dict[str, str]:
    """Patient -> split, drawn with ``seed`` separately among patients with and without a
    metastasis so both splits see both classes; fractions are train, val, test."""
    if len(fractions) != 3 or min(fractions) < 0 or not np.isclose(sum(fractions), 1.0):
        raise ConfigError(f"--fractions {list(fractions)}: give three non-negative numbers (train val test) summing to 1")
    rng = np.random.default_rng(seed)
    out = {}
    for positive in (0, 1):
        group = sorted(p for p, y in patients.items() if y == positive)
        group = [group[i] for i in rng.permutation(len(group))]
        n_train = int(round(fractions[0] * len(group)))
        n_val = int(round(fractions[1] * len(group)))
        for k, patient in enumerate(group):
            out[patient] = "train" if k < n_train else "val" if k < n_train + n_val else "test"
    return out


def stratified_split(ids: Sequence[str], labels: Sequence[int], fractions: Sequence[float], seed: int) -> list[str]:
    """train/val/test per id, drawn with ``seed`` separately within each label so every
    split keeps the class balance. Per class of n ids: round(f_val n) val, round(f_test n)
    test, the rest train, so a class of one or two ids is trained on rather than only
    tested. The draw depends on the ids and labels, not on the row order."""
    if len(fractions) != 3 or min(fractions) < 0 or not np.isclose(sum(fractions), 1.0):
        raise ConfigError(f"split fractions {list(fractions)}: give three non-negative numbers (train val test) summing to 1")
    rng = np.random.default_rng(seed)
    out: dict[str, str] = {}
    for label in sorted(set(labels)):
        group = sorted(i for i, y in zip(ids, labels) if y == label)
        group = [group[k] for k in rng.permutation(len(group))]
        n_val = int(round(fractions[1] * len(group)))
        n_test = int(round(fractions[2] * len(group)))
        n_train = max(0, len(group) - n_val - n_test)
        for k, sid in enumerate(group):
            out[sid] = "train" if k < n_train else "val" if k < n_train + n_val else "test"
    return [out[i] for i in ids]


def read_unsplit_table(path: Path, label_column: str) -> pd.DataFrame:
    """A label table checked for a drawn split: slide ids present and unique, labels class
    indices (every cell still text, the other columns kept)."""
    table = read_table(path, "label table")
    for column in ("slide_id", label_column):
        if column not in table.columns:
            raise ConfigError(f"{path}: label table lacks column {column!r}; it has {', '.join(table.columns)}")
    table["slide_id"] = table["slide_id"].str.strip()
    empty = [f"line {line(i)}" for i, v in enumerate(table["slide_id"]) if not v]
    fail_rows(path, "empty slide_id", empty, "give every row a slide id")
    from pathtwt.io.slide_ids import check_slide_ids

    check_slide_ids(list(table["slide_id"]), path, rows=[f"line {line(i)}" for i in range(len(table))])
    bad = [f"line {line(i)} ({label_column}={v!r})" for i, v in enumerate(table[label_column]) if not v.strip().lstrip("-").isdigit()]
    fail_rows(path, f"{label_column} not a class index", bad, "labels are class indices 0..C-1")
    dupes = sorted(table.loc[table["slide_id"].duplicated(), "slide_id"].unique())
    if dupes:
        raise ConfigError(f"{path}: slide(s) listed more than once: {slide_listing(dupes)}; keep one row per slide")
    labels = [int(v) for v in table[label_column]]
    rows = table.drop(columns=[c for c in ("split", "fold") if c in table.columns]).copy()
    rows["label"] = labels
    if label_column != "label":
        rows = rows.drop(columns=[label_column])
    return rows


def build_drawn_split(
    table_path: str | os.PathLike, fractions: Sequence[float] = (0.6, 0.2, 0.2), seed: int = 0,
    label_column: str = "label",
) -> pd.DataFrame:
    """``slide_id,label,split`` (+ the table's other columns) for a label table without a
    split: the split is drawn by :func:`stratified_split`. An existing ``split`` column
    is replaced (and said so by the caller's summary)."""
    path = Path(table_path)
    rows = read_unsplit_table(path, label_column)
    rows["split"] = stratified_split(list(rows["slide_id"]), list(rows["label"]), fractions, seed)
    return finish(rows, str(path))


def build_fold_split(
    table_path: str | os.PathLike, folds: int, seed: int = 0, label_column: str = "label",
    group_column: str | None = None, holdout: float = 0.0,
) -> pd.DataFrame:
    """``slide_id,label,split,fold[,group]`` (+ the table's other columns): k folds drawn by
    :func:`pathtwt.mil.folds.assign_folds`, stratified by class and, with
    ``group_column``, keeping every group's slides in one fold (a copy of that column is
    written as ``group``, the column the evaluation resamples by). ``split`` is ``cv`` for
    a slide in a fold and ``compress`` for the compression-only hold-out (fold -1)."""
    from pathtwt.mil import folds as cv

    path = Path(table_path)
    raw = read_table(path, "label table")
    if group_column is not None and group_column not in raw.columns:
        raise ConfigError(
            f"{path}: group column {group_column!r} not in the label table (it has {', '.join(raw.columns)}); "
            "name the patient or case column, or draw without groups"
        )
    rows = read_unsplit_table(path, label_column)
    groups = None if group_column is None else [g.strip() for g in rows[group_column]]
    rows["fold"] = cv.assign_folds(list(rows["slide_id"]), list(rows["label"]), folds, seed, groups, holdout,
                                   where=str(path))
    rows["split"] = np.where(rows["fold"] == cv.HOLDOUT, cv.HOLDOUT_SPLIT, cv.FOLD_SPLIT)
    if groups is not None:
        rows["group"] = [g or s for g, s in zip(groups, rows["slide_id"])]
    out = finish(rows, str(path))
    first = ["slide_id", "label", "split", "fold"] + (["group"] if groups is not None else [])
    return out[first + [c for c in out.columns if c not in first]]


def fold_notes(table: pd.DataFrame, folds: int, holdout: float) -> dict:
    """What the command says about a fold table: slides per fold and class, where exact
    stratification was impossible, and the groups whose slides carry different labels."""
    from pathtwt.mil import folds as cv

    labels, fold = table["label"].to_numpy(), table["fold"].to_numpy()
    per_fold = {("holdout" if f == cv.HOLDOUT else f"fold{f}"): {str(k): int(v) for k, v in g["label"].value_counts().sort_index().items()}
                for f, g in table.groupby("fold")}
    groups = list(table["group"]) if "group" in table.columns else None
    return {
        "per_fold_label": per_fold,
        "groups": None if groups is None else len(set(groups)),
        "not_exactly_stratified": [str(g) for g in cv.stratification_gaps(labels, fold, holdout, folds)],
        "mixed_label_groups": cv.mixed_label_groups(labels, groups, list(table["slide_id"])),
    }


def write_stamp_splits(table: pd.DataFrame, folds: int, path: str | os.PathLike) -> Path:
    """STAMP's ``splits.json`` (``{"splits": [{"train_patients": [...], "test_patients":
    [...]}, ...]}``, one entry per test fold; STAMP's crossval reuses the file it finds in
    its output folder): the patients are the ``group`` column (each slide its own patient
    without one); STAMP draws its validation part from the train patients itself, so
    pathtwt's validation fold counts as training there. Hold-out slides are in none."""
    import json

    from pathtwt.io.atomic import write_text_atomic

    patient = table["group"] if "group" in table.columns else table["slide_id"]
    fold = table["fold"].to_numpy()
    splits = [{"train_patients": sorted(set(patient[(fold >= 0) & (fold != f)])),
               "test_patients": sorted(set(patient[fold == f]))} for f in range(folds)]
    write_text_atomic(path, json.dumps({"splits": splits}, indent=1))
    return Path(path)


def write_clam_splits(table: pd.DataFrame, folds: int, folder: str | os.PathLike) -> list[Path]:
    """CLAM's ``splits_{k}.csv`` (an unnamed index column, then ``train``, ``val``,
    ``test`` columns of slide ids, padded with empty cells), one per test fold, with the
    same train / val / test roles as pathtwt's folds (:func:`pathtwt.mil.folds.fold_roles`);
    hold-out slides are in none."""
    from pathtwt.io.atomic import atomic_output
    from pathtwt.mil.folds import fold_roles

    written = []
    for f in range(folds):
        roles = fold_roles(table["fold"].to_numpy(), f, folds)
        parts = {r: list(table["slide_id"][roles == r]) for r in ("train", "val", "test")}
        frame = pd.concat({r: pd.Series(ids, dtype=object) for r, ids in parts.items()}, axis=1)
        path = Path(folder) / f"splits_{f}.csv"
        with atomic_output(path) as tmp:
            frame.to_csv(tmp)
        written.append(path)
    return written


def build_camelyon17(
    stage_labels: str | os.PathLike,
    corrected: str | os.PathLike | None = None,
    split_file: str | os.PathLike | None = None,
    fractions: Sequence[float] = (0.6, 0.2, 0.2),
    seed: int = 0,
) -> pd.DataFrame:
    """One row per slide of ``stage_labels.csv``: label 0 = negative, 1 = metastasis
    (itc, micro or macro). ``corrected`` (same ``patient,stage`` format, e.g. the
    corrected labels of Ling et al.) overrides the stages of the slides it lists. The
    split comes from ``split_file`` or is drawn per patient (all five nodes of a patient
    in one split)."""
    path = Path(stage_labels)
    stages = c17_slide_stages(path)
    source = {sid: "stage_labels" for sid in stages}
    if corrected is not None:
        fixes = c17_slide_stages(Path(corrected))
        unknown = sorted(s for s in fixes if s not in stages)
        if unknown:
            raise ConfigError(f"{corrected}: corrected slide(s) not in {path}: {slide_listing(unknown)}")
        stages.update(fixes)
        source.update({sid: "corrected" for sid in fixes})
    if not stages:
        raise ConfigError(f"{path}: no slide rows (patient_XXX_node_Y.tif) in this table")
    if split_file is not None:
        splits = read_splits(split_file)
        missing = sorted(s for s in stages if s not in splits and patient_of(s) not in splits)
        if missing:
            raise ConfigError(f"{split_file}: no split for slide(s) {slide_listing(missing)}")
        split_of = {s: splits.get(s, splits.get(patient_of(s))) for s in stages}
    else:
        positive: dict[str, int] = {}
        for sid, (stage, _line) in stages.items():
            positive[patient_of(sid)] = max(positive.get(patient_of(sid), 0), C17_STAGES[stage])
        by_patient = split_patients(positive, fractions, seed)
        split_of = {s: by_patient[patient_of(s)] for s in stages}
    rows = [
        {"slide_id": sid, "label": C17_STAGES[stage], "split": split_of[sid], "stage": stage,
         "patient": patient_of(sid), "label_source": source[sid]}
        for sid, (stage, _line) in stages.items()
    ]
    return finish(pd.DataFrame(rows), str(path))


# -- CAMELYON16 ----------------------------------------------------------------------

C16_CLASSES = {"normal": 0, "negative": 0, "tumor": 1, "tumour": 1}


def build_camelyon16(
    reference: str | os.PathLike, training_slides: str | os.PathLike | None = None, split: str = "test"
) -> pd.DataFrame:
    """The test slides of ``reference.csv`` (no header: name, class Normal/Tumor, then
    the lesion type and more, ignored) and, optionally, the training slides named
    ``normal_NNN`` / ``tumor_NNN``, all with one ``split``."""
    path = Path(reference)
    if not path.is_file():
        raise ConfigError(f"{path}: CAMELYON16 reference.csv not found")
    split = SPLIT_NAMES.get(split.lower(), "")
    if not split:
        raise ConfigError("--split must be train, val or test")
    raw = pd.read_csv(path, header=None, dtype=str, keep_default_na=False)
    if raw.shape[1] < 2:
        raise ConfigError(f"{path}: expected at least two columns (name, class), found {raw.shape[1]}")
    start = 1 if raw.iloc[0, 1].strip().lower() not in C16_CLASSES else 0  # an optional header line
    rows, bad = [], []
    for i in range(start, len(raw)):
        name, cls = raw.iloc[i, 0].strip(), raw.iloc[i, 1].strip()
        if cls.lower() not in C16_CLASSES or not name:
            bad.append(f"line {i + 1} ({name or '<empty>'}: class={cls!r})")
            continue
        rows.append({"slide_id": strip_slide_suffix(name), "label": C16_CLASSES[cls.lower()], "split": split,
                     "source": "reference"})
    fail_rows(path, "class not Normal/Tumor", bad, "fix these rows")
    if training_slides is not None:
        names = slide_names(training_slides)
        unnamed = [n for n in names if n.split("_")[0].lower() not in ("normal", "tumor")]
        if unnamed:
            raise ConfigError(
                f"{training_slides}: training slide(s) not named normal_NNN or tumor_NNN: {slide_listing(unnamed)}"
            )
        rows += [{"slide_id": n, "label": C16_CLASSES[n.split("_")[0].lower()], "split": split, "source": "file name"}
                 for n in names]
    return finish(pd.DataFrame(rows), str(path))


def summary(table: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Slides per split and label, for the command's one-line report."""
    return {
        str(split): {str(k): int(v) for k, v in group["label"].value_counts().sort_index().items()}
        for split, group in table.groupby("split")
    }
