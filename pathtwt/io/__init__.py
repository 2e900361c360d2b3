"""The files between stages: HDF5 contracts, atomic writes, per-slide failure records."""
