"""Label tables (``slide_id,label,split[,...]``) and the Gleason -> ISUP grade group map
used to label TCGA-PRAD for the grading task."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from pathtwt.errors import ConfigError
from pathtwt.io.slide_ids import check_slide_ids

REQUIRED_COLUMNS = ("slide_id", "label")
BENIGN_NAMES = {"benign", "negative", "0+0", "none"}


def gleason_to_isup(primary: int | str, secondary: int | str | None = None) -> int:
    """ISUP grade group from a Gleason primary + secondary pattern.

    3+3 (and any total <= 6) -> 1, 3+4 -> 2, 4+3 -> 3, total 8 -> 4, total 9-10 -> 5,
    benign -> 0. ``primary`` may also be a string such as "4+3" or "benign".
    """
    if secondary is None:
        text = str(primary).strip().lower()
        if text in BENIGN_NAMES:
            return 0
        if "+" not in text:
            raise ValueError(f"Gleason score {primary!r} is not 'P+S' or 'benign'")
        primary, secondary = (part.strip() for part in text.split("+", 1))
    try:
        p, s = int(primary), int(secondary)
    except (TypeError, ValueError):
        raise ValueError(f"Gleason patterns {primary!r}+{secondary!r} are not integers") from None
    if p == 0 and s == 0:
        return 0
    if not (1 <= p <= 5 and 1 <= s <= 5):
        raise ValueError(f"Gleason patterns must lie in 1..5, got {p}+{s}")
    total = p + s
    if total <= 6:
        return 1
    if total == 7:
        return 2 if p <= 3 else 3
    if total == 8:
        return 4
    return 5


def read_label_table(path: str | os.PathLike, *, need_split: bool = True) -> pd.DataFrame:
    """Read and check a label table: required columns, unique slide ids, integer labels.
    Extra columns are kept. Errors list the offending rows' slide ids."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: label table not found; pass a CSV with columns slide_id,label,split")
    try:
        table = pd.read_csv(path, dtype={"slide_id": str, "split": str, "group": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not a readable CSV ({exc})") from None
    needed = REQUIRED_COLUMNS + (("split",) if need_split else ())
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise ConfigError(f"{path}: label table lacks column(s) {', '.join(missing)}; expected slide_id,label,split")
    # ids as written (a slide named NA is not a missing value)
    table["slide_id"] = pd.read_csv(path, usecols=["slide_id"], dtype=str, keep_default_na=False)["slide_id"].str.strip()
    check_slide_ids(list(table["slide_id"]), path, rows=[f"line {i + 2}" for i in range(len(table))])
    dupes = sorted(table.loc[table["slide_id"].duplicated(), "slide_id"].unique())
    if dupes:
        raise ConfigError(f"{path}: duplicated slide_id(s): {slide_listing(dupes)}; keep one row per slide")
    numeric = pd.to_numeric(table["label"], errors="coerce")
    bad = table.loc[numeric.isna() | (numeric != np.round(numeric)), "slide_id"].tolist()
    if bad:
        raise ConfigError(
            f"{path}: non-integer label for slide(s) {slide_listing(bad)}; labels are class indices 0..C-1"
        )
    table["label"] = numeric.astype(np.int64)
    if "split" in table.columns:
        table["split"] = table["split"].fillna("").str.strip().str.lower()
    return table


def slide_listing(items, limit: int = 10) -> str:
    items = [str(i) for i in items]
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more
