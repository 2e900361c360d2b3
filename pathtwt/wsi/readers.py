"""The slide readers, one row each: how a reader opens a path and what the slide layer
must know of it.

:class:`pathtwt.wsi.slides.Slide` reads every slide through a handle with OpenSlide's API
(:class:`SlideHandle`), but the readers behind it differ in ways that change pixels and
geometry: where a region of a reduced level starts, what lies outside the level, whether
the TIFF's own tiles may be read instead, which property holds the pixel size. Those
facts are the fields of :class:`SlideReader`, and :data:`READERS` is the one table of them:
``open_slide``, ``Slide``, :mod:`pathtwt.wsi.supertiles` and :mod:`pathtwt.wsi.formats` read
it and compare no reader's name. A new reader is its handle module (a class or function
taking the path and answering :class:`SlideHandle`) plus one row here
(``tests/test_registries.py`` fails when a reader's name is compared anywhere else).

How ``open_slide`` picks a reader is read from the rows too: the one named; else the one
whose ``claims`` knows the file by its bytes; else the reader of the file's format and the
``tried`` readers after it; else the ``tried`` readers in the table's order. Of these only
OpenSlide tells "none of my formats" apart from failing on a file it reads: its opener
raises :class:`NotThisReader`, and only then is the next reader asked. That is why a
reader tried before another must say so with that exception (tiffslide, tried last, fails
with whatever tifffile raises, and that failure is the one reported).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from pathtwt.wsi.images import DPI_KEY, ImageHandle, image_format
from pathtwt.wsi.ome_zarr import MPP_KEY as OME_ZARR_MPP_KEY
from pathtwt.wsi.ome_zarr import OmeZarrHandle


@runtime_checkable
class SlideHandle(Protocol):
    """An open slide as a reader hands it over: OpenSlide's API, which tiffslide copies and
    pathtwt's own handles (:mod:`pathtwt.wsi.images`, :mod:`pathtwt.wsi.ome_zarr`) answer."""

    @property
    def level_count(self) -> int: ...

    @property
    def level_dimensions(self) -> Sequence[tuple[int, int]]: ...

    @property
    def level_downsamples(self) -> Sequence[float]: ...

    @property
    def properties(self) -> Mapping[str, Any]: ...

    def read_region(self, location: tuple[int, int], level: int, size: tuple[int, int], **options: Any) -> Any:
        """The region whose top-left is level-0 ``location``, ``size`` pixels of ``level``, as
        anything ``numpy.asarray`` takes (RGB or RGBA; the raw channels for a channel map).
        A reader that does not pad (``SlideReader.pads`` False) is asked ``as_array=True``
        and only for regions inside the level."""
        ...

    def close(self) -> None: ...


class Placement(Enum):
    """Where a reader starts a region of a reduced level, asked for at level-0 (x, y)."""

    QUOTIENT = "quotient"  # at x / downsample exactly: a fraction of a level pixel where that is no whole number
    TRUNCATED = "truncated"  # at x / downsample rounded down to a whole level pixel


class NotThisReader(Exception):
    """The reader says the file is none of its formats (OpenSlide's "unsupported format"),
    as opposed to failing on a file it reads: ``open_slide`` asks the next reader."""


def _never(properties: Mapping[str, Any]) -> bool:
    return False


def _always(properties: Mapping[str, Any]) -> bool:
    return True


# OpenSlide vendors whose levels are the TIFF's own tiled pages, one to one (an NDPI, SCN
# or Philips TIFF lays its levels out otherwise)
_NATIVE_OPENSLIDE_VENDORS = ("aperio", "generic-tiff")


def _openslide_levels_are_pages(properties: Mapping[str, Any]) -> bool:
    return str(properties.get("openslide.vendor", "")) in _NATIVE_OPENSLIDE_VENDORS


@dataclass(frozen=True)
class SlideReader:
    """One reader's row: its opener and what the slide layer must do differently for it."""

    name: str  # the `--reader` choice, a format's `reader`, the coords file's `reader` attribute
    title: str  # as messages name it
    opener: Callable[[Path], SlideHandle]  # the slide's path -> its handle
    # where a region of a reduced level starts (pathtwt.wsi.supertiles.level_origins)
    placement: Placement
    # True: the reader fills what lies outside the level itself (OpenSlide: transparent pixels,
    # composited on white); False: it pads otherwise (tiffslide: black) or not at all, so the
    # slide reads only the part inside the level and fills the rest with its own fill
    pads: bool
    # whether a slide it opened may be read through its TIFF's native tiles
    # (pathtwt.wsi.native_tiles), given the slide's properties
    native_tiles: Callable[[Mapping[str, Any]], bool] = _never
    # the property with the reader's own level-0 pixel size (pathtwt.wsi.slides.mpp_from_properties)
    mpp_key: str | None = None
    mpp_in_dpi: bool = False  # the key holds dots per inch, not microns per pixel
    # the reader's own pixel size is trusted above the vendor's (aperio.MPP) and the TIFF tags';
    # otherwise below them (it copies one of them) and above DICOM's and OME's
    mpp_over_tags: bool = False
    # ``open_slide`` tries it, in the table's order, for a file no reader claims
    tried: bool = False
    # tells its files by their bytes: ``open_slide`` picks it outright for those
    claims: Callable[[Path], bool] | None = None
    # tiles side by side are read as one region (False: a region of an image held decoded
    # costs a slice, so each tile is read on its own)
    bands: bool = True
    # turns the slide's channels into RGB itself, so a channel map cannot pick them
    renders_rgb: bool = False
    # what the refusal says when the metadata states no plausible pixel size
    no_mpp: str = "no plausible microns-per-pixel in the slide metadata"


# the slide libraries are imported when a slide is opened (OpenSlide loads its C library)
def open_openslide(path: Path) -> SlideHandle:
    import openslide

    try:
        return openslide.OpenSlide(str(path))
    except (openslide.OpenSlideError, openslide.OpenSlideUnsupportedFormatError) as exc:
        raise NotThisReader(" ".join(str(exc).split()) or type(exc).__name__) from None


def open_tiffslide(path: Path) -> SlideHandle:
    import tiffslide

    return tiffslide.TiffSlide(str(path))


def _is_plain_image(path: Path) -> bool:
    return image_format(path) is not None


READERS: tuple[SlideReader, ...] = (
    SlideReader("openslide", "OpenSlide", open_openslide, Placement.QUOTIENT, pads=True,
                native_tiles=_openslide_levels_are_pages, mpp_key="openslide.mpp-x", mpp_over_tags=True,
                tried=True, renders_rgb=True),
    SlideReader("tiffslide", "tiffslide", open_tiffslide, Placement.TRUNCATED, pads=False,
                native_tiles=_always, mpp_key="tiffslide.mpp-x", tried=True),
    SlideReader("image", "the image reader", ImageHandle, Placement.TRUNCATED, pads=False,
                mpp_key=DPI_KEY, mpp_in_dpi=True, claims=_is_plain_image, bands=False,
                no_mpp="the image file states no pixel size"),
    SlideReader("ome-zarr", "the OME-Zarr reader", OmeZarrHandle, Placement.TRUNCATED,
                pads=False, mpp_key=OME_ZARR_MPP_KEY),
)

# the functions below read READERS when called, so a row added to it is a reader everywhere


def names() -> tuple[str, ...]:
    """The readers' names in the table's order (``pathtwt tile --reader``'s choices)."""
    return tuple(r.name for r in READERS)


def reader_named(name: str) -> SlideReader:
    row = next((r for r in READERS if r.name == name), None)
    if row is None:
        raise ValueError(f"reader {name!r} is unknown; use auto, {', '.join(names())}")
    return row


def claimed_by(path: Path) -> SlideReader | None:
    """The reader that tells ``path`` as one of its files by its bytes, if any."""
    return next((r for r in READERS if r.claims is not None and r.claims(path)), None)


def tried_in_order() -> tuple[SlideReader, ...]:
    """The readers ``open_slide`` tries in turn for a file no reader claims."""
    return tuple(r for r in READERS if r.tried)


def raw_channel_reader() -> SlideReader:
    """The first reader tried that hands over a slide's own channels (for a channel map)."""
    return next(r for r in tried_in_order() if not r.renders_rgb)
