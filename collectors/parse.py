"""Parse a scraped page into typed samples, with prometheus_client's parsers as the reference.

Prometheus text format 0.0.4 and OpenMetrics 1.0 (chosen by Content-Type, or by a final
`# EOF`). Anything the reference parser rejects is an `ExpositionError` with its reason.
"""

from __future__ import annotations

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from warehouse.ingest import Sample

MAX_PAGE_BYTES = 64 * 1024 * 1024
MAX_SAMPLES = 500_000  # a DP64 decode instance with the plugin serves ~36,000
MAX_LABEL_VALUE_BYTES = 4096  # label values are names and URLs, not payloads


class ExpositionError(ValueError):
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
