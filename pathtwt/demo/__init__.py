"""Synthetic H&E whole-slide images for the demo workflow, tests and benchmarks.

- ``tiff_writer.write_pyramidal_tiff``: streaming JPEG-tiled pyramidal TIFF writer that
  OpenSlide and tiffslide both read, with the mpp in the resolution tags.
- ``synthetic.SyntheticSlide``: renders any region of a slide recipe at any downsample,
  plus its true tissue mask and label map.
- ``cohorts`` / ``make``: the demo cohorts (grading, metastasis and their external,
  differently stained counterparts) written by ``pathtwt demo make-slides``.
"""

from pathtwt.demo.synthetic import SlideRecipe, SyntheticSlide
from pathtwt.demo.tiff_writer import pyramid_dims, write_pyramidal_tiff

__all__ = ["SlideRecipe", "SyntheticSlide", "pyramid_dims", "write_pyramidal_tiff"]
