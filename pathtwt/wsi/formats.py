"""What the slide readers cannot do, said by name before they try.

OpenSlide and tiffslide read most whole-slide formats, but a few files look readable
and are not: an Olympus VSI is a small TIFF holding only the overview and label images
(the pyramid lives in ``.ets`` files in a folder beside it, which neither reader
opens), a MIRAX ``.mrxs`` is only an index into its data folder, and some exports carry
only a label or overview image. Tiling those would silently tile the wrong picture, so
they are refused here with the format and the tool that converts them.

Truncated files are recognised from the TIFF header: a first image directory that lies
beyond the end of the file means the copy was cut short.

:data:`FORMATS` is the one table of slide formats: each format's suffixes, the reader
that opens it, whether its tiles are read natively (:mod:`pathtwt.wsi.native_tiles`) and
whether the workflow looks for it by default. Every suffix list of the package
(:data:`SLIDE_SUFFIXES`, :data:`WORKFLOW_SUFFIXES`) is read from it; a new format is one
row here (and, for a new reader, its handle module and one row of
:data:`pathtwt.wsi.readers.READERS`, which holds what each reader does).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

from pathtwt.errors import SlideError


@dataclass(frozen=True)
class SlideFormat:
    name: str
    suffixes: tuple[str, ...]
    reader: str  # the name of the reader (pathtwt.wsi.readers.READERS) that reads it by default
    native_tiles: bool  # its tiled pages are decoded natively, each native tile once
    workflow_default: bool = True  # a cohort folder is searched for it by default (`extensions`)
    folder: bool = False  # the slide is a folder (a zarr store), not a file


FORMATS: tuple[SlideFormat, ...] = (
    SlideFormat("Aperio SVS", (".svs",), "openslide", True),
    SlideFormat("tiled TIFF / OME-TIFF", (".tif", ".tiff"), "openslide", True),
    SlideFormat("Hamamatsu NDPI", (".ndpi",), "openslide", False),
    SlideFormat("MIRAX", (".mrxs",), "openslide", False),
    SlideFormat("Leica SCN", (".scn",), "openslide", False),
    SlideFormat("Hamamatsu VMS", (".vms",), "openslide", False),
    SlideFormat("Ventana BIF", (".bif",), "openslide", False),
    SlideFormat("DICOM WSI", (".dcm",), "openslide", False),
    SlideFormat("JPEG / PNG image", (".jpg", ".jpeg", ".png"), "image", False, workflow_default=False),
    SlideFormat("OME-Zarr (NGFF)", (".zarr",), "ome-zarr", False, workflow_default=False, folder=True),
)

# every suffix a slide file may have (a folder given to `pathtwt predict`)
SLIDE_SUFFIXES: tuple[str, ...] = tuple(s for f in FORMATS for s in f.suffixes)
# the suffixes a cohort folder is searched for by default (schema.yaml: a cohort's `extensions`)
WORKFLOW_SUFFIXES: tuple[str, ...] = tuple(s for f in FORMATS if f.workflow_default for s in f.suffixes)
# a slide name in a clinical table may carry one of these too (a GDC download's archive)
ARCHIVE_SUFFIXES: tuple[str, ...] = (".zip",)


def format_of(path: str | Path) -> SlideFormat | None:
    suffix = Path(path).suffix.lower()
    return next((f for f in FORMATS if suffix in f.suffixes), None)


def is_folder_slide(path: str | Path) -> bool:
    """Whether ``path`` is a folder that is one slide (a format stored as a folder, e.g. an
    OME-Zarr store), not a folder of slides."""
    named = format_of(path)
    return named is not None and named.folder and Path(path).is_dir()


# The conversion advice shared by the formats pathtwt has no reader for.
CONVERT = (
    "convert it to a pyramidal OME-TIFF, e.g. `bfconvert -noflat -pyramid-resolutions 6 -pyramid-scale 2 "
    "-tilex 512 -tiley 512 SLIDE OUT.ome.tiff` (Bio-Formats) or QuPath's File > Export images > OME TIFF, "
    "and tile that file"
)

# A description line that starts with one of these words marks an associated image, not the scan.
_ASSOCIATED = re.compile(r"^\s*(label|macro|overview|thumbnail)\b", re.IGNORECASE | re.MULTILINE)


def refuse_unsupported(path: Path) -> None:
    """Raise :class:`SlideError` for a path that is a folder or a format pathtwt cannot
    read faithfully (checked before any reader opens it)."""
    if is_folder_slide(path):
        return
    if path.is_dir():
        hint = ""
        if any(path.glob("*.ets")) or any(path.glob("*/*.ets")):
            hint = f" (it holds Olympus .ets files: give the .vsi file beside it, and {CONVERT})"
        elif (path / "Slidedat.ini").is_file():
            hint = " (it is a MIRAX data folder: give the .mrxs file beside it)"
        raise SlideError(f"{path}: is a folder, not a slide file; give the slide file itself{hint}")
    suffix = path.suffix.lower()
    if suffix in (".vsi", ".ets"):
        raise SlideError(
            f"{path}: Olympus VSI/ETS: the pyramid lives in .ets files that neither OpenSlide nor tiffslide reads "
            f"(the .vsi itself holds only overview and label images); {CONVERT}"
        )
    if suffix == ".mrxs":
        folder = path.with_suffix("")
        if not (folder / "Slidedat.ini").is_file():
            raise SlideError(
                f"{path}: MIRAX without its data folder: the .mrxs is only an index, the pixels live in "
                f"{folder.name}/ (Slidedat.ini and Data*.dat) beside it; copy that folder too, or {CONVERT}"
            )


def refuse_associated_image(path: Path, description: str, level0: tuple[int, int]) -> None:
    """Refuse a file whose largest image is a label, macro, overview or thumbnail."""
    found = _ASSOCIATED.search(description or "")
    if found:
        kind = found.group(1).lower()
        raise SlideError(
            f"{path}: its largest image ({level0[0]}x{level0[1]}) is a {kind} image, not the scan; "
            f"the scan is stored elsewhere (another file or folder): {CONVERT}"
        )


def truncation_note(path: Path) -> str:
    """'truncated (...)' when the TIFF header points past the end of the file, otherwise
    'truncated or damaged': what a user can tell of a file both readers refuse."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError:
        return "unreadable"
    if size == 0:
        return "empty (0 bytes)"
    order = {b"II": "<", b"MM": ">"}.get(head[:2])
    if order is None or len(head) < 8:
        return "truncated or damaged"
    magic = struct.unpack(order + "H", head[2:4])[0]
    if magic == 42:
        offset = struct.unpack(order + "I", head[4:8])[0]
    elif magic == 43 and len(head) >= 16:
        offset = struct.unpack(order + "Q", head[8:16])[0]
    else:
        return "truncated or damaged"
    if offset >= size:
        return f"truncated (its first image directory is at byte {offset}, past the end of the file at {size} bytes)"
    return "truncated or damaged"
