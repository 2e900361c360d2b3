"""Compression methods, each a ``compress(teacher, calib, options) -> Path | None`` entry of
the method registry (:mod:`pathtwt.compress.registry`): ``twt`` (one layer per discovered
block) and the comparison methods it is measured against, ``truncation`` (first K layers),
``raptor`` (block-recurrent), ``wdpruning`` (first K layers + probe), ``nose``
(attention-free layers), ``linear`` (closed-form linear block surrogates) and ``subset``
(layer-subset search). Every one goes through the same distil -> measure -> export route
(:func:`pathtwt.compress.pipeline.export_variant`)."""
