"""What a target is, and what the parser and the collectors hand the warehouse: `TargetInfo`, a
`Sample`, and a `Page` (a page's samples as columns: its `Layout` and its values)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload
from urllib.parse import urlsplit

ROLES = ("prefill", "decode", "router", "gateway", "gpu")
"""What a target in a targets file is. prefill and decode targets are vLLM API servers."""

POOLS = ("prefill", "decode")
"""The two GPU pools of a disaggregated deployment: a target's pool is its role."""


@dataclass(frozen=True)
class TargetInfo:
    """One entry of a targets file."""

    name: str
    url: str
    role: str
    gpus: int
    stack: str = ""
    hostname: str = ""


@dataclass(frozen=True)
class Sample:
    """One line of an exposition page, parsed."""

    name: str
    labels: tuple[tuple[str, str], ...]  # sorted (key, value) pairs, le included
    value: float
    family: str
    kind: str


class Layout:
    """What a page's samples are besides their values: names, labels, families and kinds, in page
    order (each sample's value is that of the page the layout was read from). A scrape cache keeps
    one while the target's series stay the same, so its pages share it. A layout made from another
    by sample lines whose labels changed (a series that moved within its family) names that one as
    `parent`, and the positions that may differ as `changed`. `template` is what the parser that
    made it keeps to read the next page (collectors/parse.py)."""

    __slots__ = ("samples", "template", "parent", "changed")

    def __init__(
        self,
        samples: list[Sample],
        template: object,
        parent: Layout | None = None,
        changed: tuple[int, ...] = (),
    ) -> None:
        self.samples, self.template, self.parent, self.changed = samples, template, parent, changed
        if parent is not None:  # a layout keeps only the one it was made from: a cache that outlives
            parent.parent = None  # thousands of moved lines must not hold every layout since its first


class Page(Sequence[Sample]):
    """A plain page's samples as its layout and its values, in page order. A `Sample` is made only
    when one is asked for: the ingestor reads the values and the layout as columns."""

    __slots__ = ("layout", "values")

    def __init__(self, layout: Layout, values: list[float]) -> None:
        self.layout, self.values = layout, values

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, i: int) -> Sample: ...
    @overload
    def __getitem__(self, i: slice) -> list[Sample]: ...
    def __getitem__(self, i: int | slice) -> Sample | list[Sample]:
        if isinstance(i, slice):
            return list(self)[i]
        s = self.layout.samples[i]
        return Sample(s.name, s.labels, self.values[i], s.family, s.kind)

    def __iter__(self) -> Iterator[Sample]:
        for s, v in zip(self.layout.samples, self.values, strict=True):
            yield Sample(s.name, s.labels, v, s.family, s.kind)


def instance_of(url: str) -> str:
    """A target's Prometheus `instance` label: its URL's host:port."""
    return urlsplit(url).netloc
