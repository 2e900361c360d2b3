"""Slide ids are names, never paths.

A slide id becomes a file name in every stage (``results/tiles/{cohort}/{slide}.h5``, the
features, the heatmaps, an HDF5 group of attention), so it is refused, in one line naming
the table, the row and the id, when it could name another place or no file at all: a path
separator, ``.``/``..`` or any name starting with ``.`` (the hidden names of temporary files,
which folder scans skip), a NUL or another control character (a tab splits the extraction
manifest, a newline the calibration list), more bytes than a file name holds beside its
suffixes, or two ids that one file system stores as one file (the same up to case or
Unicode normalisation, as on macOS and Windows). Everything else is carried: spaces,
brackets, quotes, ``#``, ``;``, ``$``, backticks and non-ASCII letters are quoted wherever a
command line is built (the workflow's rules quote every path and wildcard).

The workflow adds Snakemake's own limit: braces, which its file patterns read as wildcards
(:data:`WORKFLOW_RESERVED`).
"""

from __future__ import annotations

import unicodedata
from typing import Iterable, Sequence

from pathtwt.errors import ConfigError

# the longest id in bytes: a file name holds 255, and the longest one made from an id is a
# temporary heatmap, ".{id}.heatmap.png.tmp-{host}-{pid}-{8 random}.png" (host up to 64)
MAX_ID_BYTES = 150
# characters Snakemake reads in a file path as the start or end of a wildcard
WORKFLOW_RESERVED = "{}"
# ids listed in one error line before it is cut short
_LISTED = 5


def id_problem(slide_id: object) -> str | None:
    """Why ``slide_id`` cannot name a slide's files, or None when it can."""
    if not isinstance(slide_id, str) or not slide_id.strip():
        return "it is empty"
    if "/" in slide_id or "\\" in slide_id:
        return "it holds a path separator"
    if slide_id.startswith("."):
        return "it starts with '.' (a path component or a hidden file name)"
    if any(unicodedata.category(ch) == "Cc" for ch in slide_id):
        return "it holds a NUL, tab, newline or other control character"
    if len(slide_id.encode("utf-8")) > MAX_ID_BYTES:
        return f"it is longer than {MAX_ID_BYTES} bytes, too long for the file names made from it"
    return None


def workflow_problem(text: str) -> str | None:
    """Why the workflow cannot carry ``text`` (an id or a slide's path), or None."""
    if any(ch in text for ch in WORKFLOW_RESERVED):
        return "it holds a brace, which Snakemake reads as a wildcard"
    if any(unicodedata.category(ch) == "Cc" for ch in text):
        return "it holds a NUL, tab, newline or other control character"
    return None


def same_file_key(slide_id: str) -> str:
    """Ids with the same key are one file on a case-insensitive or normalising file system."""
    return unicodedata.normalize("NFC", slide_id).casefold()


def check_slide_ids(ids: Sequence[object], table: object, rows: Sequence[str] | None = None,
                    workflow: bool = False) -> None:
    """Refuse the ids of ``table`` (a file, or a description of where the ids come from)
    that cannot name files, and pairs that would be one file; ``rows`` names each id's row
    (e.g. "line 3"), by default its data row. With ``workflow``, the workflow's own limits
    (:func:`workflow_problem`) too."""
    where = list(rows) if rows is not None else [f"row {i + 1}" for i in range(len(ids))]
    bad = []
    for i, slide_id in enumerate(ids):
        why = id_problem(slide_id) or (workflow_problem(slide_id) if workflow else None)
        if why:
            bad.append(f"{where[i]} ({slide_id!r}: {why})")
    if bad:
        raise ConfigError(f"{table}: slide_id that cannot name a file: {_listing(bad)}; slide ids are names, not "
                          "paths: rename the slide (and its row)")
    first: dict[str, int] = {}
    clashes = []
    for i, slide_id in enumerate(ids):
        j = first.setdefault(same_file_key(str(slide_id)), i)
        if j != i and ids[j] != slide_id:
            clashes.append(f"{where[j]} ({ids[j]!r}) and {where[i]} ({slide_id!r})")
    if clashes:
        raise ConfigError(f"{table}: slide ids that differ only in case or Unicode form, which many file systems "
                          f"store as one file: {_listing(clashes)}; rename one of each pair")


def check_workflow_path(path: object, what: str) -> None:
    """Refuse a path (of a slide, or of a config key ``what``) that the workflow cannot carry
    (:func:`workflow_problem`)."""
    why = workflow_problem(str(path))
    if why:
        raise ConfigError(f"{path!s}: the workflow cannot carry this path of {what} ({why}); rename the file or "
                          "its folder")


def _listing(items: Iterable[str]) -> str:
    items = list(items)
    shown = "; ".join(items[:_LISTED])
    return shown + (f" ... ({len(items)} in all)" if len(items) > _LISTED else "")
