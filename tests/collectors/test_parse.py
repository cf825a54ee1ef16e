"""Parsing follows prometheus_client's parsers exactly; anything malformed is a clear error."""

from __future__ import annotations

from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

import collectors.parse as parse_module
from collectors.parse import (
    MAX_SAMPLES,
    ExpositionError,
    PageCache,
    _parse_plain_text,
    parse_page,
    parse_reference,
)
from moemeter.contract import Page

CAPTURES = [
    "vllm-0.32.0-cpu-tiny-deepseek.metrics.txt",
    "vllm-0.32.0-cpu-pd-prefill-nixl.metrics.txt",
    "vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt",
    "vllm-router-0.1.17-pd.metrics.txt",
]


@pytest.mark.parametrize("name", CAPTURES)
def test_real_captures_give_exactly_the_reference_samples(capture, name):
    text = capture(name)
    ref = [
        (s.name, tuple(sorted(s.labels.items())), s.value, f.name, f.type)
        for f in text_string_to_metric_families(text)
        for s in f.samples
    ]
    got = [(s.name, s.labels, s.value, s.family, s.kind) for s in parse_page(text.encode())]
    assert got == ref
    assert len(got) > 70


def test_openmetrics_is_parsed_by_the_openmetrics_parser():
    page = b'# TYPE a counter\na_total 3.0\n# TYPE b gauge\nb{x="1"} 2.5\n# EOF\n'
    got = parse_page(page, "application/openmetrics-text; version=1.0.0")
    assert [(s.name, s.value, s.kind) for s in got] == [("a_total", 3.0, "counter"), ("b", 2.5, "gauge")]


@pytest.mark.parametrize(
    "body,match",
    [
        (b"this is not a metric page\n", "parse error"),
        (b'# TYPE a counter\na_total{x="1" 3\n', "parse error"),
        (b"# TYPE a counter\na_total 3\nb_total 4", "truncated"),
        (b"\xff\xfe\x00garbage\n", "not UTF-8"),
    ],
)
def test_malformed_pages_are_refused_with_the_reason(body, match):
    with pytest.raises(ExpositionError, match=match):
        parse_page(body)


def test_sample_limit_refuses_a_page_with_too_many_series():
    page = "".join(f'x{{i="{i}"}} 1\n' for i in range(50)).encode()
    with pytest.raises(ExpositionError, match="more than 10 samples"):
        parse_page(page, max_samples=10)


def test_sample_limit_holds_for_a_page_read_from_the_scrape_cache():
    cache, page = PageCache(), "".join(f'x{{i="{i}"}} 1\n' for i in range(50))
    assert len(cache.parse(page.encode())) == 50
    with pytest.raises(ExpositionError, match="more than 10 samples"):
        cache.parse(page.replace(" 1\n", " 2\n").encode(), max_samples=10)


def test_nan_and_inf_values_pass_through():
    got = parse_page(b"a NaN\nb +Inf\nc -Inf\n")
    assert [str(s.value) for s in got] == ["nan", "inf", "-inf"]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_bytes_either_parse_or_raise_exposition_error(body):
    try:
        parse_page(body)
    except ExpositionError:
        pass


# ---------------------------------------------------------------- the fast path agrees with the reference
PIECES = st.sampled_from(
    [
        "# TYPE a counter",
        "# TYPE a_total counter",
        "# TYPE h histogram",
        "# TYPE s summary",
        "# TYPE g gauge",
        "# TYPE a",
        '# HELP a some "quoted" help',
        "# HELP g",
        "# HELP",
        "# comment",
        "#",
        '# TYPE "a" counter',
        "# TYPE g\xa0gauge",
        "# TYPE a counter extra",
        "# HELP a_total x",
        "a_total 1",
        "a 2",
        'a_total{x="1"} 3',
        'a_total{x="1",y="2"} 4 1700000000000',
        "g 1.5",
        "g{} 2",
        'g{x="a,b}c"} 3',
        'g{x="\\"q\\""} 4',
        'g{x="1",} 5',
        'g{ x="1"} 6',
        'g {x="1"} 7',
        'g{x="1"}8',
        'g{x="1",x="2"} 9',
        'g{__x="1"} 1',
        'g{__name__="g"} 1',
        'g{a:b="1"} 1',
        "g 1_000",
        "g 1 1_0",
        "g 1 zz",
        "g NaN",
        "g +Inf",
        "g -inf",
        "g nan",
        "g 0x10",
        "g 1e3",
        "g 12345678901234567890123",
        "g\t1",
        "g 1\t2",
        "g 1 2 3",
        'g 1 # {t="1"} 2',
        'h_bucket{le="1"} 1',
        'h_bucket{le="+Inf"} 2',
        "h_count 2",
        "h_sum 3",
        "h 4",
        "s 1",
        "s_count 1",
        "s_sum 2",
        's{quantile="0.5"} 1',
        "other 1",
        "  g   1  ",
        "\u00e9 1",
        "g \u2003 1",
        'g{x="\u00e9"} 1',
        "g\x1c1",
        "",
    ]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(PIECES, max_size=12))
def test_fast_path_agrees_with_the_reference_parser(lines):
    text = "\n".join(lines) + "\n"

    def comparable(parse) -> object:  # type: ignore[no-untyped-def]  # NaN compares by its text
        try:
            return [(s.name, s.labels, repr(s.value), s.family, s.kind) for s in parse()]
        except ExpositionError:
            return ExpositionError

    assert comparable(lambda: parse_page(text.encode())) == comparable(lambda: parse_reference(text, openmetrics=False))


def test_fast_path_takes_the_real_pages(capture):
    """The captures are plain: no fallback to the slow reference scan."""
    for name in CAPTURES:
        assert _parse_plain_text(capture(name), MAX_SAMPLES)


def test_a_pages_repeated_names_and_labels_are_kept_once():
    """The scrape cache keeps a page's samples for as long as its layout holds: a label pair or a
    name the page repeats (its model and engine on every line) is one object, not one per line
    (the largest captures kept 1,303 bytes a sample before, 878 after)."""
    page = "".join(
        f'vllm:kv_cache_usage_perc{{engine="{e}",model_name="tiny-deepseek",pod="{e % 3}"}} 0.{e}\n' for e in range(9)
    )
    samples = PageCache().parse(page.encode())
    pairs = {id(p): p for s in samples for p in s.labels}
    assert len(samples) == 9 and len(pairs) == 9 + 1 + 3  # each engine, the model, each pod
    assert len({id(s.name) for s in samples}) == 1
    assert [dict(s.labels)["engine"] for s in samples] == [str(e) for e in range(9)]


# ---------------------------------------------------------------- the scrape cache gives parse_page's samples
def reference(text: str) -> object:
    """parse_reference's samples, comparable (NaN by its text), or ExpositionError."""
    try:
        return [(s.name, s.labels, repr(s.value), s.family, s.kind) for s in parse_reference(text, openmetrics=False)]
    except ExpositionError:
        return ExpositionError


def cached(cache: PageCache, text: str) -> object:
    try:
        return [(s.name, s.labels, repr(s.value), s.family, s.kind) for s in cache.parse(text.encode())]
    except ExpositionError:
        return ExpositionError


def revalued(text: str, value) -> str:  # type: ignore[no-untyped-def]
    """The page with each sample line's last token replaced by value(old token)."""
    lines = []
    for line in text.split("\n"):
        head, space, last = line.rpartition(" ")
        lines.append(f"{head}{space}{value(last)}" if space and not line.startswith("#") else line)
    return "\n".join(lines)


VALUE_TEXTS = st.sampled_from(["1", "2.5", "1_000", "NaN", "zz", "1 2", "1\t2", "\t3", "", "1e3", "+Inf", "1 1_0"])


@st.composite
def edited(draw, lines: list[str]) -> list[str]:  # type: ignore[no-untyped-def]
    """The page's lines after a few edits: values changed, a line dropped, replaced or added."""
    out = list(lines)
    for _ in range(draw(st.integers(1, 3))):
        edit = draw(st.sampled_from(["values", "drop", "replace", "insert"]))
        at = draw(st.integers(0, max(len(out) - 1, 0)))
        if edit == "values":
            out = revalued("\n".join(out), lambda _: draw(VALUE_TEXTS)).split("\n")
        elif edit == "drop" and out:
            del out[at]
        elif edit == "replace" and out:
            out[at] = draw(PIECES)
        else:
            out.insert(at, draw(PIECES))
    return out


@settings(max_examples=800, deadline=None)
@given(st.lists(PIECES, max_size=12), st.data())
def test_the_scrape_cache_agrees_with_the_reference_parser(first, data):
    """A page, then edited pages, through one cache: each gives the reference's samples or its
    refusal, whether read from the cache or parsed afresh."""
    cache = PageCache()
    text = "\n".join(first) + "\n"
    assert cached(cache, text) == reference(text)
    then = first
    for _ in range(3):
        then = data.draw(edited(then))
        page = "\n".join(then) + "\n"
        assert cached(cache, page) == reference(page), page


@pytest.mark.parametrize(
    "first,then",
    [
        (['g{x="1"} 5'], ['g{x="2"} 5']),  # a label changed, the line's length not
        (["g 1", "a 2"], ["g 1"]),  # the last line gone (a plain page's first lines give its first samples)
        (["g 1"], ["g 1 2 zz"]),  # more than a value and a timestamp: the reference refuses this one
        (["# TYPE g gauge", "g 1"], ["# TYPE g counter", "g 1"]),
        (["g 1"], ["g  1"]),
    ],
)
def test_the_scrape_cache_sees_what_changed_besides_the_values(first, then):
    cache = PageCache()
    for lines in (first, then):
        page = "\n".join(lines) + "\n"
        assert cached(cache, page) == reference(page), page


@pytest.mark.parametrize("name", CAPTURES)
def test_the_scrape_cache_reads_only_the_values_of_an_unchanged_page(capture, name, monkeypatch):
    text = capture(name)
    cache = PageCache()
    assert cached(cache, text) == reference(text)
    again = revalued(text, lambda v: repr(float(v) + 1.5))
    assert again != text
    monkeypatch.setattr(parse_module, "_parse_plain_text", None)  # a page parsed afresh fails
    monkeypatch.setattr(PageCache, "_reread", None)  # nor read line by line: its bytes against the kept ones
    assert cached(cache, again) == reference(again)


def test_a_page_with_a_new_series_is_parsed_afresh_and_kept(capture, monkeypatch):
    text = capture(CAPTURES[2])
    cache = PageCache()
    cache.parse(text.encode())
    calls = []
    real = parse_module._parse_plain_text
    monkeypatch.setattr(parse_module, "_parse_plain_text", lambda *a: calls.append(1) or real(*a))
    line = next(x for x in text.split("\n") if x.startswith("vllm:num_requests_running{"))
    grown = text.replace(line, line + "\n" + line.replace('engine="0"', 'engine="9"'))
    assert grown != text and cached(cache, grown) == reference(grown) and calls == [1]
    later = revalued(grown, lambda v: repr(float(v) * 2))
    assert cached(cache, later) == reference(later) and calls == [1]  # kept: read from the cache
    assert cached(cache, text) == reference(text) and calls == [1, 1]  # the series went: afresh again


def test_an_openmetrics_page_goes_to_its_parser_and_empties_the_cache(monkeypatch):
    cache = PageCache()
    cache.parse(b"# TYPE a counter\na_total 3\n")
    om = cache.parse(b"# TYPE a counter\na_total 3\n# EOF\n", "application/openmetrics-text; version=1.0.0")
    assert [(s.name, s.value) for s in om] == [("a_total", 3.0)]
    calls = []
    real = parse_module._parse_plain_text
    monkeypatch.setattr(parse_module, "_parse_plain_text", lambda *a: calls.append(1) or real(*a))
    assert [s.value for s in cache.parse(b"# TYPE a counter\na_total 4\n")] == [4.0] and calls == [1]
    with pytest.raises(ExpositionError, match="truncated"):
        cache.parse(b"# TYPE a counter\na_total 5")


def test_a_series_that_moved_within_its_family_is_read_alone_and_kept(capture, monkeypatch):
    """The plugin's hot-expert gauge names other experts as the load moves: the lines that changed
    are parsed, the others read from the cache, and the next page reads them from the cache too."""
    text = capture(CAPTURES[2])
    cache = PageCache()
    cache.parse(text.encode())
    line = next(x for x in text.split("\n") if x.startswith("vllm:num_requests_running{"))
    moved = text.replace(line, line.replace('engine="0"', 'engine="7"'))
    assert moved != text
    calls = []
    real = parse_module._sample_line
    monkeypatch.setattr(parse_module, "_sample_line", lambda line: calls.append(line) or real(line))
    monkeypatch.setattr(parse_module, "_parse_plain_text", None)  # the page is never parsed afresh
    monkeypatch.setattr(PageCache, "_reread", None)  # nor line by line: compared in whole, the moved line alone
    assert cached(cache, moved) == reference(moved) and len(calls) == 1
    later = revalued(moved, lambda v: repr(float(v) + 1))
    assert cached(cache, later) == reference(later) and len(calls) == 1  # the kept bytes have the moved line's


def test_a_cache_whose_lines_keep_moving_holds_two_layouts_not_every_one(capture):
    """Each page whose lines moved makes a layout from the last; the cache, and whoever keeps the
    newest layout, must not hold the whole line of them (serve grew ~50 MB a minute on the twin)."""
    text = capture(CAPTURES[2])
    line = next(x for x in text.split("\n") if x.startswith("vllm:num_requests_running{"))
    cache = PageCache()
    first = cache.parse(text.encode())
    assert isinstance(first, Page)
    layouts = [first.layout]
    for engine in range(1, 50):
        page = cache.parse(text.replace(line, line.replace('engine="0"', f'engine="{engine}"')).encode())
        assert isinstance(page, Page) and page.layout.parent is layouts[-1]  # made from the last
        layouts.append(page.layout)
    assert layouts[-1].parent is layouts[-2] and layouts[-2].parent is None
    assert all(layout.parent is None for layout in layouts[:-1])


@pytest.mark.slow("300 edits of a real page, each parsed by both parsers")
@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_real_page_edited_anywhere_reads_as_the_reference_reads_it(capture, data):
    """The scrape cache against the reference parser on a real page whose sample lines get other
    label values (longer, shorter, the same length), other values or names, or lose their value or
    space, and whose comment lines change, anywhere on the page, the first and last lines included."""
    text = capture(CAPTURES[2])
    cache = PageCache()
    cache.parse(text.encode())
    lines = text.split("\n")[:-1]
    plain = True  # only label values and plain values changed: the template reads the page alone
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.sampled_from([0, 1, len(lines) - 2, len(lines) - 1, *range(len(lines))]))
        line = lines[i]
        edit = data.draw(st.sampled_from(["label", "value", "no value", "no space", "comment", "name"]))
        if edit == "label" and '="' in line:
            name, _, rest = line.partition('="')
            lines[i] = f'{name}="{data.draw(st.sampled_from(["", "9", "12345", "ü"]))}{rest}'
        elif edit == "value":
            value = data.draw(st.sampled_from(["7", "1e3", "-Inf", "1_0", "x"]))
            lines[i] = line.rpartition(" ")[0] + " " + value
            plain &= value in ("7", "1e3", "-Inf")
        elif edit == "no value":
            lines[i] = line.rpartition(" ")[0] + " "
        elif edit == "no space":
            lines[i] = line.replace(" ", "")
        elif edit == "comment" and line.startswith("#"):
            lines[i] = line + "."
        elif edit == "name" and not line.startswith("#"):
            lines[i] = "x" + line  # differs from its first byte: the line before ends where it starts
        plain &= edit in ("label", "value") and not line.startswith("#")
    page = "\n".join(lines) + "\n"
    otherwise: list[str] = []
    reread, afresh = PageCache._reread, parse_module._parse_plain_text
    with (
        patch.object(PageCache, "_reread", lambda *a: otherwise.append("line by line") or reread(*a)),
        patch.object(parse_module, "_parse_plain_text", lambda *a: otherwise.append("afresh") or afresh(*a)),
    ):
        assert cached(cache, page) == reference(page)
    if plain:
        assert otherwise == []  # its bytes with numpy, the lines that moved alone
