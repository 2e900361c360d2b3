"""libjpeg on the host, decoding a JPEG stream the way a GPU decoder does, and the test
JPEGs a GPU decoder is checked on when it is made.

Two correct decoders of one JPEG stream differ in two places. Measured by
``benchmarks/decode_tolerance.py`` (libjpeg-turbo 3.1, the largest absolute difference in
grey levels over every pixel and channel) on every native tile of the shared CMU SVS
(Aperio RGB tiles, not subsampled), the 200 BACH JPEGs (YCbCr 4:2:0) and a YCbCr 4:2:0
mosaic of the SVS (88 tiles of 256 px, quality 90):

- the chroma upsampling of a subsampled stream: libjpeg's default "fancy"
  (triangle-filter) upsampling against plain replication, what nvJPEG does unless asked
  for ``NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION`` (torchvision never asks): 55 on
  BACH, 46 on the mosaic, 0 on the SVS;
- the IDCT: libjpeg's accurate integer IDCT against its fast one, the same upsampling in
  both: 10 on BACH, 9 (fancy) and 10 (plain) on the mosaic, 2 on the SVS.

So a GPU decoder is compared with libjpeg upsampling the same way (:func:`fancy` or
:func:`plain`), at :data:`TOLERANCE` grey levels: the IDCT bound, 10. It also covers what
nvImageCodec's own tests allow its GPU decoders against OpenCV, 6
(``test/python/utils.py``: ``get_max_diff_threshold``, the decoder told
``:fancy_upsampling=1``), and stays far below a wrong upsampling (46-55 above, 89 on the
test JPEG of :func:`probes`) or RGB tiles read as YCbCr (up to 248). OpenCV, imagecodecs
and nvImageCodec's CPU backend (``:fancy_upsampling=1`` and ``=0``) decode every stream
above exactly as the matching reference does (difference 0).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

# grey levels two decodes of one stream may differ by with the same chroma upsampling:
# the IDCT bound measured above
TOLERANCE = 10

Reference = Callable[[Any], np.ndarray]


def fancy(stream: Any) -> np.ndarray:
    """libjpeg-turbo's default decode (accurate IDCT, fancy upsampling): uint8 (h, w, 3).
    An Adobe transform-0 marker makes three components RGB, as libjpeg reads it."""
    import imagecodecs

    return np.asarray(imagecodecs.jpeg8_decode(bytes(stream)))


def plain(stream: Any) -> np.ndarray:
    """libjpeg-turbo with the chroma replicated instead (``do_fancy_upsampling`` off, the
    TurboJPEG flag TJFLAG_FASTUPSAMPLE), accurate IDCT: uint8 (h, w, 3)."""
    import simplejpeg

    return simplejpeg.decode_jpeg(bytes(stream), colorspace="RGB", fastdct=False, fastupsample=True)


def max_difference(a: np.ndarray, b: np.ndarray) -> int:
    """The largest absolute difference of two decodes (a shape mismatch counts as 255)."""
    if a.shape != b.shape:
        return 255
    return int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())


@functools.cache
def probes() -> tuple[bytes, bytes]:
    """Two 256 px test JPEGs (a tile's size): YCbCr 4:2:0 whose chroma changes every two
    pixels, where fancy and plain upsampling differ by far more than :data:`TOLERANCE`, and
    the same pixels as an RGB JPEG with an Adobe transform-0 marker (Aperio's kind of tile),
    which a decoder taking three components for YCbCr gets wrong by up to 248 levels."""
    import imagecodecs

    y, x = np.mgrid[0:256, 0:256]
    image = np.empty((256, 256, 3), np.uint8)
    checker = ((y // 2 + x // 2) % 2).astype(bool)  # a colour per 2 x 2 block: one chroma sample each
    image[..., 0] = np.where(checker, 230, 40)
    image[..., 1] = (x + y) // 2
    image[..., 2] = np.where(checker, 30, 220)
    ycc = imagecodecs.jpeg8_encode(image, level=95, colorspace="RGB", outcolorspace="YCbCr", subsampling="420")
    rgb = imagecodecs.jpeg8_encode(image, level=95, colorspace="RGB", outcolorspace="RGB")  # writes Adobe, transform 0
    return bytes(ycc), bytes(rgb)
