"""Whole-slide images: readers, tissue detection, tiling and thumbnails (no torch)."""
