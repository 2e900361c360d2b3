"""pathtwt: compress pathology ViT foundation models with Transformer-Within-Transformer
(TWT) and evaluate every backbone variant on slide-level tasks.

The stages talk through files (docs/pipeline.md and docs/formats.md): tiling writes coords
HDF5 files, compression writes ``model.safetensors`` + ``model.json``, extraction writes
features HDF5 files, MIL training writes metrics, and the report reads them all.
"""

__version__ = "0.1.0"
