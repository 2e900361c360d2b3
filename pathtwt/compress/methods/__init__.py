"""Comparison methods, each a ``compress(teacher, calib, options) -> Path | None`` entry of
the method registry (:mod:`pathtwt.compress.registry`): ``raptor`` (block-recurrent),
``wdpruning`` (first K layers + probe), ``nose`` (attention-free layers), ``linear``
(closed-form linear block surrogates) and ``subset`` (layer-subset search)."""
