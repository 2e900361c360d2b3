"""Backbone compression: calibration, discovery, TWT and the comparison methods."""
