"""Using a trained slide head on a slide: per-tile scores (attention), heatmaps drawn at a
chosen resolution, the top and bottom tiles, and QuPath GeoJSON of the tissue and tiles.

Layering: imports mil (heads), io and wsi; never compress or cli."""
