"""Measuring this machine: the primitives every throughput measurement shares (mosaics of a
real slide, timers and steady-state differences, result files rewritten atomically), and
the checks and measurements of ``pathtwt doctor`` and ``pathtwt bench`` built on them.

This package sits above features, models, wsi, compress and io (it measures them), and
below cli only."""
