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

from prometheus_client.metrics_core import METRIC_TYPES
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from moemeter.contract import Sample
from moemeter.errors import MoemeterError

MAX_PAGE_BYTES = 64 * 1024 * 1024
MAX_SAMPLES = 500_000  # a DP64 decode instance with the plugin serves ~36,000
MAX_LABEL_VALUE_BYTES = 4096  # label values are names and URLs, not payloads


class ExpositionError(MoemeterError, ValueError):
    """The page is not a valid exposition, or is over the limits."""


def is_openmetrics(content_type: str, body: str) -> bool:
    return "application/openmetrics-text" in content_type.lower() or body.rstrip().endswith("# EOF")


def parse_page(body: bytes, content_type: str = "text/plain", max_samples: int = MAX_SAMPLES) -> list[Sample]:
    """Decode and parse one page. Raises ExpositionError on anything malformed or too big."""
    if len(body) > MAX_PAGE_BYTES:
        raise ExpositionError(f"page of {len(body)} bytes is over the {MAX_PAGE_BYTES}-byte limit")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ExpositionError(f"page is not UTF-8: {exc}") from exc
    openmetrics = is_openmetrics(content_type, text)
    if text and not openmetrics and not text.endswith("\n"):
        raise ExpositionError("page does not end with a newline: truncated")
    if not openmetrics:
        try:
            return _parse_plain_text(text, max_samples)
        except _NotPlain:
            pass
    return parse_reference(text, openmetrics, max_samples)


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
_NAME_RE = re.compile(_NAME)
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')
_PLAIN_HEAD = re.compile(r"[\x20\x21\x23-\x7e\t\x0b\x0c\r]*")  # ASCII, no quote, whitespace as the reference splits
_ALLOWED = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}


def _parse_plain_text(text: str, max_samples: int) -> list[Sample]:
    """prometheus_client.parser.text_fd_to_metric_families, line for line, for plain pages."""
    out: list[Sample] = []
    family, kind, start = "", "unknown", 0  # the family being read and where its samples start
    allowed: tuple[str, ...] = ()

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
            labels = tuple(sorted(pairs))
        if "_" in value or (stamp is not None and "_" in stamp):
            raise _NotPlain  # Python's float() takes 1_000; the reference refuses it
        try:
            number = float(value)
            if stamp is not None:
                float(stamp)  # the reference refuses a page with a bad timestamp
        except ValueError:
            raise _NotPlain from None
        if name in allowed:
            out.append(Sample(name, labels, number, family, kind))
        else:  # the reference yields it at once as an untyped family of its own
            close()
            out.append(Sample(name, labels, number, name, "unknown"))
            family, kind, start, allowed = "", "unknown", len(out), ()
        if len(out) > max_samples:
            raise ExpositionError(f"more than {max_samples} samples: refused")
    close()
    return out
