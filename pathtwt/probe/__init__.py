"""Tile-level probes of frozen backbone features on labelled tiles: a folder of class
subfolders of images, split into train and test, embedded with a backbone, and read out
by a logistic-regression probe and a cosine kNN (the cheap downstream check that
pathology benchmarks use)."""
