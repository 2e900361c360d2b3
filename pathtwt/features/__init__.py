"""Tile features: frozen-backbone extraction from slides to HDF5."""
