"""What the slide readers cannot do, said by name before they try.

OpenSlide and tiffslide read most whole-slide formats, but a few files look readable
and are not: an Olympus VSI is a small TIFF holding only the overview and label images
(the pyramid lives in ``.ets`` files in a folder beside it, which neither reader
opens), a MIRAX ``.mrxs`` is only an index into its data folder, and some exports carry
only a label or overview image. Tiling those would silently tile the wrong picture, so
they are refused here with the format and the tool that converts them.

Truncated files are recognised from the TIFF header: a first image directory that lies
beyond the end of the file means the copy was cut short.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

from pathtwt.errors import SlideError

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
