"""The contract (moemeter/contract/) against what the real programs write, and against what
moemeter's own code reads: every family declared once, and declared as its source writes it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from moemeter.contract import FAMILIES, KINDS, POOLS, ROLES, SOURCES, Family, markdown_table, of
from moemeter.contract.families import STEP_PHASES
from stack.gateway.metrics import GatewayMetrics
from stack.vllm_plugin.moemeter_vllm_plugin.exporter import PluginCollector
from stack.vllm_plugin.moemeter_vllm_plugin.state import PHASES, Hist, ProcessState, write_atomically
from warehouse import lake

ROOT = Path(__file__).parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
VLLM_PD = {"vllm-0.32.0-cpu-pd-prefill-nixl.metrics.txt": False, "vllm-0.32.0-cpu-pd-decode-spec.metrics.txt": True}
"""The real PD pair, and whether each ran with a speculative config (only then does vLLM export its
spec-decode families); the decode instance also loaded the moemeter plugin."""
DRAFTING = {f.name for f in of("vllm") if f.name.startswith("vllm:spec_decode_")}
NOT_DECLARED = ("python_", "process_", "http_")  # prometheus_client's own, stored as scraped


def declared(text: str) -> dict[str, tuple[str, str, tuple[str, ...] | None]]:
    """name as its TYPE line writes it -> (kind, HELP, label names): what a contract entry says.
    A family without samples shows no label names: None."""
    type_lines = {}  # the parser's family name -> the name on its TYPE line
    for name, kind in re.findall(r"^# TYPE (\S+) (\w+)$", text, re.M):
        type_lines[name.removesuffix("_total") if kind == "counter" else name] = name
    out = {}
    for fam in text_string_to_metric_families(text):
        name = type_lines[fam.name]
        if name.endswith("_created") or (name.startswith(NOT_DECLARED) and name not in FAMILIES):
            continue
        labels = {k for s in fam.samples for k in s.labels if k not in ("le", "quantile")}
        out[name] = (fam.type, fam.documentation, tuple(sorted(labels)) if fam.samples else None)
    return out


def contract(source: str) -> dict[str, tuple[str, str, tuple[str, ...] | None]]:
    return {f.name: (f.kind, f.help, f.labels) for f in of(source)}


def assert_as_declared(
    page: dict[str, tuple[str, str, tuple[str, ...] | None]],
    expected: dict[str, tuple[str, str, tuple[str, ...] | None]],
) -> None:
    """The same families, kinds and HELP; the same label names wherever the page has samples."""
    assert sorted(page) == sorted(expected)
    for name, (kind, help_text, labels) in page.items():
        assert (kind, help_text) == expected[name][:2], name
        assert labels is None or labels == expected[name][2], name


def test_every_entry_is_well_formed():
    for f in FAMILIES.values():
        assert f.source in SOURCES and f.kind in KINDS, f.name
        assert list(f.labels) == sorted(set(f.labels)) and "le" not in f.labels, f.name
        if f.source in ("vllm", "plugin", "gateway") and f.kind == "counter":  # prometheus_client's naming
            assert f.name.endswith("_total"), f.name
    assert set(POOLS) < set(ROLES)


@pytest.mark.parametrize("capture", VLLM_PD)
def test_vllm_families_are_declared_as_vllm_032_writes_them(capture):
    real = declared((FIXTURES / capture).read_text())
    process = {n: v for n, v in real.items() if n.startswith(NOT_DECLARED)}
    assert process == contract("process")
    plugin = {n: v for n, v in real.items() if n.startswith("moemeter_")}
    assert {n: v[:2] for n, v in plugin.items()} == {n: contract("plugin")[n][:2] for n in plugin}
    expected = {n: v for n, v in contract("vllm").items() if VLLM_PD[capture] or n not in DRAFTING}
    assert {n: v for n, v in real.items() if n not in process and n not in plugin} == expected


def test_a_third_real_vllm_page_holds_nothing_the_contract_lacks():
    """The tiny-DeepSeek capture (no KV connector: no NIXL families) has no family, kind, HELP or
    label the contract does not declare."""
    real = declared((FIXTURES / "vllm-0.32.0-cpu-tiny-deepseek.metrics.txt").read_text())
    for name, spec in real.items():
        if name == "vllm:cache_config_info":  # its labels are the engine's config: it had no KV connector
            assert spec[:2] == (FAMILIES[name].kind, FAMILIES[name].help)
            continue
        assert (FAMILIES[name].kind, FAMILIES[name].help, FAMILIES[name].labels) == spec, name


def test_router_families_are_declared_as_vllm_router_0117_writes_them():
    real = declared((FIXTURES / "vllm-router-0.1.17-pd.metrics.txt").read_text())
    assert real == contract("router")


def plugin_page(tmp_path: Path) -> str:
    """The real plugin's exporter over two hand-overs of an engine with expert load, so every
    family has samples (the window's balancedness and hot experts need a second one)."""
    state = ProcessState(model_name="tiny-moe", num_experts=2)
    state.steps.setdefault(0, Hist()).observe(0.01)
    state.phases.setdefault((0, "forward"), Hist()).observe(0.008)
    state.api_output.observe(0.001)
    registry = CollectorRegistry()
    registry.register(PluginCollector(tmp_path))
    for at, tokens in ((1.0, [1, 1]), (2.0, [3, 1])):
        state.experts[0] = {0: tokens}
        write_atomically(tmp_path, state.as_json(os.getpid(), at))
        page = generate_latest(registry).decode()
    return page


def test_the_plugins_own_families_are_the_contracts(tmp_path):
    """The plugin has no dependencies (it runs inside vLLM), so it declares its families itself:
    kind, HELP and labels must be the contract's, which the twin renders."""
    assert declared(plugin_page(tmp_path)) == contract("plugin")


def test_the_gateways_families_are_the_contracts():
    metrics = GatewayMetrics()
    metrics.requests[("alice", "ok")] = 1
    metrics.tokens[("alice", "prompt")] = 1
    metrics.tokens[("alice", "cached_prompt")] = 1
    metrics.tokens[("alice", "generation")] = 1
    metrics.errors["upstream_timeout"] = 1
    registry = CollectorRegistry()
    registry.register(metrics)
    assert declared(generate_latest(registry).decode()) == contract("gateway")


def families_read_by_moemeter() -> set[str]:
    """Every family name in the warehouse's SQL and in the collectors', warehouse's and pages' code."""
    texts = [p.read_text() for p in (ROOT / "warehouse" / "sql").glob("*.sql")]
    for part in ("collectors", "warehouse", "dashboard"):
        texts += [p.read_text() for p in (ROOT / part).rglob("*.py")]
    pattern = re.compile(r"['\"]((?:vllm:|vllm_router_|DCGM_FI_|moemeter_)[A-Za-z0-9_:]+)['\"]")
    catalog_names = {lake.PUBLISHERS, lake.READERS, lake.GUARD_TRIGGER}  # the lake's PostgreSQL roles and trigger
    return {m for t in texts for m in pattern.findall(t)} - catalog_names


def test_every_family_moemeter_reads_is_declared():
    read = families_read_by_moemeter()
    assert len(read) > 20, read
    sample_suffix = re.compile(r"_(bucket|count|sum)$")
    undeclared = [m for m in read if m not in FAMILIES and sample_suffix.sub("", m) not in FAMILIES]
    assert undeclared == []


def test_the_docs_table_is_the_contracts():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    begin = doc.index("<!-- families:")
    table = doc[doc.index("\n", begin) + 1 : doc.index("<!-- end of families -->")]
    assert table == markdown_table(), "regenerate it: python -m moemeter.contract"


def test_a_family_is_found_by_one_grep():
    """`grep -n '"<name>"' moemeter/contract/families.py` finds each family's one declaration."""
    source = (ROOT / "moemeter" / "contract" / "families.py").read_text()
    for name in FAMILIES:
        assert source.count(f'"{name}"') == 1, name


def test_base_is_what_prometheus_client_declares_a_counter_by():
    f = Family("gateway", "x_total", "counter", ())
    assert f.base == "x" and Family("gateway", "x_seconds", "histogram", ()).base == "x_seconds"


def test_the_plugins_step_phases_are_the_contracts():
    """The plugin is a distribution of its own (pip-installed into vLLM's environment) and cannot
    import the contract: its phases are held to the contract's here."""
    assert PHASES == STEP_PHASES
