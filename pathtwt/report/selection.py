"""What a report shows: the tasks, backbones, variants and heads its study names. A
study's results folder can still hold the files of a task, variant or head its config
has since dropped; the workflow names the study's own, and the report leaves the rest
out. Each part left as None shows everything found."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


def _names(values: Iterable[str] | None) -> frozenset[str] | None:
    return None if values is None else frozenset(values)


@dataclass(frozen=True)
class Selection:
    tasks: frozenset[str] | None = None
    backbones: frozenset[str] | None = None
    variants: frozenset[str] | None = None
    heads: frozenset[str] | None = None

    @classmethod
    def of(cls, *, tasks: Iterable[str] | None = None, backbones: Iterable[str] | None = None,
           variants: Iterable[str] | None = None, heads: Iterable[str] | None = None) -> "Selection":
        return cls(_names(tasks), _names(backbones), _names(variants), _names(heads))

    def keeps(self, *, task: str | None = None, backbone: str | None = None, variant: str | None = None,
              head: str | None = None) -> bool:
        """Whether every part given is one the report shows."""
        return all(value is None or names is None or value in names
                   for value, names in ((task, self.tasks), (backbone, self.backbones), (variant, self.variants),
                                        (head, self.heads)))


EVERYTHING = Selection()
