"""Backbones: the registry of timm ViTs, weight loading and conversion, the tile transform
and embedding, cost counting, and the structural layers of every exported variant."""
