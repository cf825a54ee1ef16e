"""Parse a scraped page into typed samples, with prometheus_client's parsers as the reference.

Prometheus text format 0.0.4 and OpenMetrics 1.0 (chosen by Content-Type, or by a final
`# EOF`). Anything the reference parser rejects is an `ExpositionError` with its reason.

Text-format pages take a fast path first: the reference's own family rules, with one regular
expression per sample line instead of its character-by-character scan. The first line that is
not plain (escapes, quoted names, odd spacing, exemplars...) sends the whole page to the
reference parser, so results are the reference's by construction (tests/collectors check both
on the real captures and on generated pages).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from prometheus_client.metrics_core import METRIC_TYPES
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from moemeter.contract import Layout, Page, Sample
from moemeter.contract.errors import MoemeterError

MAX_PAGE_BYTES = 64 * 1024 * 1024
MAX_SAMPLES = 500_000  # a DP64 decode instance with the plugin serves ~36,000
MAX_LABEL_VALUE_BYTES = 4096  # label values are names and URLs, not payloads


class ExpositionError(MoemeterError, ValueError):
    """The page is not a valid exposition, or is over the limits."""


def is_openmetrics(content_type: str, body: str) -> bool:
    end = len(body)
    while end and body[end - 1].isspace():  # body.rstrip() without copying a whole page
        end -= 1
    return "application/openmetrics-text" in content_type.lower() or body.endswith("# EOF", 0, end)


def parse_page(body: bytes, content_type: str = "text/plain", max_samples: int = MAX_SAMPLES) -> list[Sample]:
    """Decode and parse one page. Raises ExpositionError on anything malformed or too big."""
    text, openmetrics = _decode(body, content_type)
    if not openmetrics:
        try:
            return _parse_plain_text(text, max_samples)
        except _NotPlain:
            pass
    return parse_reference(text, openmetrics, max_samples)


def _decode(body: bytes, content_type: str) -> tuple[str, bool]:
    """The page's text, and whether it is OpenMetrics; ExpositionError if too big or not text."""
    if len(body) > MAX_PAGE_BYTES:
        raise ExpositionError(f"page of {len(body)} bytes is over the {MAX_PAGE_BYTES}-byte limit")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ExpositionError(f"page is not UTF-8: {exc}") from exc
    openmetrics = is_openmetrics(content_type, text)
    if text and not openmetrics and not text.endswith("\n"):
        raise ExpositionError("page does not end with a newline: truncated")
    return text, openmetrics


class _Template:
    """A kept page's bytes without its values, for a page whose sample lines are as plain as they
    come: no whitespace around a line, one space before each value, no timestamp (comment and
    blank lines may be anything). `values` takes the next page's values with numpy when its bytes
    are the kept ones' but for them, and names the sample lines that differ in more; any other page
    gets None."""

    __slots__ = ("position", "kept_at", "skeleton", "newlines", "sample_lines")

    def __init__(self, position: dict[int, int], kept_at: dict[int, int], skeleton: bytes) -> None:
        self.position = position  # a sample line's number -> its sample's position on the page
        self.kept_at = kept_at  # a sample line's number -> its place in PageCache's kept lines
        self.skeleton = skeleton  # the page's bytes with each sample line's value cut out, its last space kept
        self.newlines = np.flatnonzero(np.frombuffer(skeleton, np.uint8) == 10)  # where the skeleton's lines end
        self.sample_lines = np.fromiter(position, np.int64, len(position))  # the sample lines' numbers, in page order

    @classmethod
    def of(cls, text: str, kept: list[tuple[str, Sample | None]]) -> _Template | None:
        """The template of a page parsed into `kept` (PageCache's lines); None where a sample line
        is not plain."""
        lines = text.split("\n")
        lines.pop()  # the text ends with a newline (_decode)
        position: dict[int, int] = {}
        kept_at: dict[int, int] = {}
        cut: list[str] = []
        k = 0
        for i, line in enumerate(lines):
            cut.append(line)
            if not line.strip():  # a blank line, which the parser skips
                continue
            head, sample = kept[k]
            if sample is not None:
                if not _plain_line(line, head):
                    return None
                position[i], kept_at[i] = len(position), k
                cut[i] = head  # its text up to the value, the space included
            k += 1
        return cls(position, kept_at, ("\n".join(cut) + "\n").encode())

    def values(self, body: bytes) -> tuple[list[float], dict[int, str]] | None:
        """The page's values, and the sample lines whose text before the value differs from the
        kept one's (by number, with their text); None for a page of other lines, or of values the
        reference may read otherwise. Each sample line's last space is the last space before its
        newline; the page with the bytes between them cut out is compared with the skeleton in
        whole. Where it differs, the lines that do lie between the longest common start and the
        longest common end of the two, and only those are compared one by one. A line the same in
        both is the kept comment or blank line, or a sample line with its kept text before the
        value, one space, and a value with no space in it."""
        if not len(self.sample_lines):
            return ([], {}) if body == self.skeleton else None
        page = np.frombuffer(body, np.uint8)
        newlines = np.flatnonzero(page == 10)
        spaces = np.flatnonzero(page == 32)
        if len(newlines) != len(self.newlines) or not len(spaces):
            return None
        ends = newlines[self.sample_lines]
        last = spaces[np.searchsorted(spaces, ends) - 1]
        starts = np.where(self.sample_lines > 0, newlines[self.sample_lines - 1], -1)
        if not (np.all(last > starts) and np.all(last < ends)):
            return None  # a sample line with no space (the last space found is on another line)
        edges = np.empty(2 * len(ends) + 1, np.int64)
        edges[0], edges[1::2], edges[2::2] = 0, last + 1, ends
        cut = np.zeros(len(edges), bool)
        cut[1::2] = True  # the runs alternate: kept text, a value, kept text...
        in_value = np.repeat(cut, np.diff(edges, append=len(page)))
        skeleton = page[~in_value]
        moved: dict[int, str] = {}
        if skeleton.tobytes() != self.skeleton:
            found = self._moved_lines(skeleton, body, newlines)
            if found is None:
                return None
            moved = found
        in_value[ends] = True  # each value with its newline
        texts = page[in_value].tobytes()
        if not _PLAIN_BYTES.fullmatch(texts):
            return None  # what float() reads and the reference may not: underscores, whitespace, other digits
        try:
            return list(map(float, texts.split(b"\n")[:-1])), moved
        except ValueError:  # an empty value, or letters that are no number
            return None

    def _moved_lines(self, skeleton: np.ndarray, body: bytes, newlines: np.ndarray) -> dict[int, str] | None:
        """The sample lines whose text before the value differs from the kept one's, by number,
        with their text; None where a comment or blank line differs. Both skeletons have as many
        lines; lines within their common start or their common end are the same."""
        kept = np.frombuffer(self.skeleton, np.uint8)
        n = min(len(kept), len(skeleton))
        differ = np.flatnonzero(kept[:n] != skeleton[:n])
        same_start = int(differ[0]) if len(differ) else n
        differ = np.flatnonzero(kept[::-1][:n] != skeleton[::-1][:n])
        same_end = int(differ[0]) if len(differ) else n
        old, new = self.newlines, np.flatnonzero(skeleton == 10)
        first = int(np.searchsorted(old, same_start))  # lines that end before the first byte that differs: the same
        # lines that start after a newline within the common end: the same
        last = len(old) - 1 - int(np.count_nonzero(old[:-1] >= len(kept) - same_end))
        moved: dict[int, str] = {}
        for i in range(first, last + 1):
            a, b = (old[i - 1] + 1 if i else 0), (new[i - 1] + 1 if i else 0)
            if self.skeleton[a : old[i]] == skeleton[b : new[i]].tobytes():
                continue
            if i not in self.position:
                return None  # a comment or blank line changed
            moved[i] = body[(newlines[i - 1] + 1 if i else 0) : newlines[i]].decode()
        return moved or None  # none differs, though the skeletons do (no such page is known): parsed otherwise

    def moved(self, lines: dict[int, str]) -> _Template:
        """This template with the given lines' text before the value replaced (lines that are plain)."""
        pieces, at = [], 0
        for i in sorted(lines):
            start = int(self.newlines[i - 1]) + 1 if i else 0
            pieces += [self.skeleton[at:start], lines[i][: lines[i].rindex(" ") + 1].encode()]
            at = int(self.newlines[i])
        pieces.append(self.skeleton[at:])
        return _Template(self.position, self.kept_at, b"".join(pieces))


_PLAIN_VALUES = re.compile(r"[0-9A-Za-z.+\-\n]*")
_PLAIN_BYTES = re.compile(_PLAIN_VALUES.pattern.encode())


def _plain_line(line: str, head: str) -> bool:
    """A sample line, parsed with `head` its text before the value, as a template takes it: no
    whitespace around it, one space before the value, no timestamp."""
    before, space, after = line.rpartition(" ")
    return (
        bool(space) and line == line.strip() and head == before + space and _PLAIN_VALUES.fullmatch(after) is not None
    )


class PageCache:
    """One target's scrape cache, as Prometheus keeps one: its last plain-text page, line by line,
    without the values, and the samples it gave (a `Layout`). A page with the same comment lines
    and sample names, line for line, takes its samples' names, labels and families from there,
    reading only the values, and parsing alone the sample lines whose labels changed; any other
    page is parsed afresh and becomes the one kept. The result is parse_page's by construction: a
    line is read from the cache only when it is the kept line's text up to its value (whitespace
    included) followed by what the fast path takes as a value, and the families and kinds the fast
    path gives follow from the comment lines and the sample names alone. A page as plain as vLLM's
    is compared with the kept one in whole (`_Template`), not line by line."""

    def __init__(self) -> None:
        self._lines: list[tuple[str, Sample | None]] = []  # (comment line, None) or (text before the value, sample)
        self._layout: Layout | None = None

    def parse(self, body: bytes, content_type: str = "text/plain", max_samples: int = MAX_SAMPLES) -> Sequence[Sample]:
        text, openmetrics = _decode(body, content_type)
        if openmetrics:
            self._lines, self._layout = [], None
            return parse_reference(text, openmetrics, max_samples)
        layout = self._layout
        if layout is not None and isinstance(layout.template, _Template):
            got = layout.template.values(body)
            page = None if got is None or len(got[0]) > max_samples else self._moved(layout, layout.template, *got)
            if page is not None:
                return page
        if self._lines:
            again = self._reread(text, max_samples)
            if again is not None:
                return again
        self._lines, self._layout = [], None
        kept: list[tuple[str, Sample | None]] = []
        try:
            out = _parse_plain_text(text, max_samples, kept)
        except _NotPlain:
            return parse_reference(text, openmetrics, max_samples)
        self._lines, self._layout = kept, Layout(out, _Template.of(text, kept))
        return Page(self._layout, [s.value for s in out])

    def _moved(self, layout: Layout, template: _Template, values: list[float], moved: dict[int, str]) -> Page | None:
        """The page the layout's template read, its moved sample lines parsed alone; None where one
        of them is not plain or names another sample."""
        if not moved:
            return Page(layout, values)
        samples = list(layout.samples)
        heads: dict[int, str] = {}
        for i, line in moved.items():
            at = template.position[i]
            try:
                name, labels, _, heads[i] = _sample_line(line)
            except (_NotPlain, ExpositionError):
                return None
            was = samples[at]
            if name != was.name or not _plain_line(line, heads[i]):
                return None
            samples[at] = Sample(name, labels, values[at], was.family, was.kind)
        for i, head in heads.items():
            self._lines[template.kept_at[i]] = (head, samples[template.position[i]])
        changed = tuple(sorted(template.position[i] for i in moved))
        self._layout = Layout(samples, template.moved(moved), layout, changed)
        return Page(self._layout, values)

    def _reread(self, text: str, max_samples: int) -> Sequence[Sample] | None:
        """The page's samples from the kept lines; None when a comment line differs, or a sample
        line's name, or the number of lines grows. A sample line that differs in more than its
        value but keeps its name (another label value) is read alone and kept in its place: the
        page reads as before, its families and kinds following from the comment lines and the
        sample names alone."""
        kept = self._lines
        values: list[float] = []
        changed: list[int] = []
        i = 0
        for raw in text.split("\n"):
            line = raw.strip()
            if not line:
                continue
            if i == len(kept):
                return None
            head, sample = kept[i]
            i += 1
            if sample is None:
                if line != head:
                    return None
                continue
            number = _value(line[len(head) :]) if line.startswith(head) else None
            if number is None:
                try:
                    name, labels, number, head = _sample_line(line)
                except (_NotPlain, ExpositionError):
                    return None  # parsed afresh, the page gives the reference's answer
                if _NAME_RE.match(kept[i - 1][0]).group() != name:  # type: ignore[union-attr]  # a kept head starts with its name
                    return None
                if labels != sample.labels:
                    changed.append(len(values))
                kept[i - 1] = (head, Sample(sample.name, labels, number, sample.family, sample.kind))
            values.append(number)
        if len(values) > max_samples:
            return None
        samples = [s for _, s in kept if s is not None]
        if len(values) < len(samples):  # fewer lines than kept: the kept page's first lines give its first samples
            return [Sample(s.name, s.labels, v, s.family, s.kind) for s, v in zip(samples, values, strict=False)]
        layout = self._layout
        assert layout is not None
        if changed:
            layout = self._layout = Layout(samples, _Template.of(text, kept), layout, tuple(changed))
        return Page(layout, values)


def parse_reference(text: str, openmetrics: bool, max_samples: int = MAX_SAMPLES) -> list[Sample]:
    """prometheus_client's parsers, with our limits."""
    parser = parse_openmetrics if openmetrics else parse_text
    out: list[Sample] = []
    try:
        for fam in parser(text):
            for s in fam.samples:
                for key, value in s.labels.items():
                    if len(value) > MAX_LABEL_VALUE_BYTES:
                        raise ExpositionError(f"label {key} of {s.name} has a {len(value)}-character value: refused")
                out.append(Sample(s.name, tuple(sorted(s.labels.items())), float(s.value), fam.name, fam.type))
                if len(out) > max_samples:
                    raise ExpositionError(f"more than {max_samples} samples: refused")
    except ExpositionError:
        raise
    except Exception as exc:  # the reference parser raises ValueError, TypeError, IndexError...
        raise ExpositionError(f"{'OpenMetrics' if openmetrics else 'text format'} parse error: {exc}") from exc
    return out


class _NotPlain(Exception):
    """A line the fast path does not take; the reference parser reads the page instead."""


_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(
    rf'({_NAME})(?:\{{((?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*")(?:,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*")*)?\}})?'
    r"[ \t]+([^ \t]+)(?:[ \t]+([^ \t]+))?"
)
_VALUE = re.compile(r"([^ \t]+)(?:[ \t]+([^ \t]+))?")  # a sample line's value and timestamp, as _SAMPLE's
_NAME_RE = re.compile(_NAME)
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')
_PLAIN_HEAD = re.compile(r"[\x20\x21\x23-\x7e\t\x0b\x0c\r]*")  # ASCII, no quote, whitespace as the reference splits
_ALLOWED = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}


def _value(tail: str) -> float | None:
    """The value of a sample line's text after its series and whitespace, as _SAMPLE and _number
    read it (None: not a plain value)."""
    if " " not in tail and "\t" not in tail:  # no timestamp: all of it (the line is stripped)
        return _number(tail, None)
    m = _VALUE.fullmatch(tail)
    return _number(*m.groups()) if m is not None else None


def _number(value: str, stamp: str | None) -> float | None:
    """A sample's value as the reference reads it; None where the fast path leaves it to the
    reference (Python's float() takes 1_000, the reference refuses it; a bad timestamp)."""
    if "_" in value or (stamp is not None and "_" in stamp):
        return None
    try:
        number = float(value)
        if stamp is not None:
            float(stamp)  # the reference refuses a page with a bad timestamp
    except ValueError:
        return None
    return number


def _sample_line(
    line: str, shared: dict[Any, Any] | None = None
) -> tuple[str, tuple[tuple[str, str], ...], float, str]:
    """A plain sample line's name, sorted labels, value, and its text before the value; _NotPlain
    where the reference decides, ExpositionError over a limit. `shared`: the page's names and label
    pairs so far; a repeated one is that object, not a copy (a page of 2,000 series repeats its
    model and engine labels on every line, and the scrape cache keeps the page's samples)."""
    m = _SAMPLE.fullmatch(line)
    if m is None:
        raise _NotPlain
    name, inner, value, stamp = m.groups()
    labels: tuple[tuple[str, str], ...] = ()
    if inner:
        pairs = _PAIR.findall(inner)
        if inner.startswith("__") or ",__" in inner or (len(pairs) > 1 and len(dict(pairs)) != len(pairs)):
            raise _NotPlain  # reserved or duplicate label names: the reference's error
        if len(inner) > MAX_LABEL_VALUE_BYTES:
            for key, v in pairs:
                if len(v) > MAX_LABEL_VALUE_BYTES:
                    raise ExpositionError(f"label {key} of {name} has a {len(v)}-character value: refused")
        labels = tuple(sorted(pairs if shared is None else [shared.setdefault(p, p) for p in pairs]))
    number = _number(value, stamp)
    if number is None:
        raise _NotPlain
    if shared is not None:
        name = shared.setdefault(name, name)
    return name, labels, number, line[: m.start(3)]


def _parse_plain_text(text: str, max_samples: int, kept: list[tuple[str, Sample | None]] | None = None) -> list[Sample]:
    """prometheus_client.parser.text_fd_to_metric_families, line for line, for plain pages. With
    `kept`, each line is appended to it: (the line, None) for a comment, (the text before its
    value, its sample) for a sample (for PageCache)."""
    out: list[Sample] = []
    shape: list[tuple[str, bool]] = []  # per line: (the comment, False) or (the text before the value, True)
    family, kind, start = "", "unknown", 0  # the family being read and where its samples start
    allowed: tuple[str, ...] = ()
    shared: dict[Any, Any] = {}  # this page's names and label pairs, each kept once (_sample_line)

    def close() -> None:  # the reference's build_metric: counters named without _total
        if kind == "counter" and family:
            name = family[:-6] if family.endswith("_total") else family
            for i in range(start, len(out)):
                s = out[i]
                out[i] = Sample(
                    s.name if family.endswith("_total") else s.name + "_total", s.labels, s.value, name, kind
                )

    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            continue
        if line[0] == "#":
            shape.append((line, False))
            parts = line.split(None, 3)
            if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
                if len(parts) == 2 and parts[1] in ("HELP", "TYPE"):
                    raise _NotPlain
                continue
            candidate, head = parts[2], line[: len(line) - len(parts[3])] if len(parts) == 4 else line
            if not (_PLAIN_HEAD.fullmatch(line if parts[1] == "TYPE" else head) and _NAME_RE.fullmatch(candidate)):
                raise _NotPlain  # quoted or escaped names, other whitespace: the reference decides
            if parts[1] == "TYPE" and (len(parts) < 4 or (candidate == family and len(out) > start)):
                raise _NotPlain  # retyping a family after its samples: rare; the reference decides
            if candidate != family:
                close()
                family, kind, start, allowed = candidate, "unknown", len(out), (candidate,)
            if parts[1] == "TYPE":
                kind = "unknown" if parts[3] == "untyped" else parts[3]
                if kind not in METRIC_TYPES or (kind == "counter" and family == "_total"):
                    raise _NotPlain
                allowed = tuple(family + suffix for suffix in _ALLOWED.get(kind, ("",)))
            continue
        name, labels, number, head = _sample_line(line, shared)
        shape.append((head, True))
        if name in allowed:
            out.append(Sample(name, labels, number, family, kind))
        else:  # the reference yields it at once as an untyped family of its own
            close()
            out.append(Sample(name, labels, number, name, "unknown"))
            family, kind, start, allowed = "", "unknown", len(out), ()
        if len(out) > max_samples:
            raise ExpositionError(f"more than {max_samples} samples: refused")
    close()
    if kept is not None:  # the samples as close() left them, in page order
        samples = iter(out)
        kept.extend((text, next(samples) if is_sample else None) for text, is_sample in shape)
    return out
