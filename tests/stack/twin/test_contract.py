"""The twin speaks exactly what the real stack speaks: families, types, labels, buckets."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stack.twin.config import load_profile
from stack.twin.server import Twin
from stack.twin.stats import HIST_BUCKET_FAMILY, family_buckets
from tests.test_contract import assert_as_declared, contract, declared

FIXTURES = Path(__file__).parents[2] / "fixtures"


def shape(text: str, prefix: str) -> dict[str, dict[str, object]]:
    """family -> type, label names per sample name, histogram bucket bounds."""
    out: dict[str, dict[str, object]] = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith(prefix):
            continue
        labels: dict[str, set[frozenset[str]]] = defaultdict(set)
        les: list[str] = []
        for s in fam.samples:
            labels[s.name].add(frozenset(k for k in s.labels if k != "le"))
            if s.name.endswith("_bucket") and s.labels.get("engine", "0") == "0" and "le" in s.labels:
                if s.labels["le"] not in les:
                    les.append(s.labels["le"])
        out[fam.name] = {"type": fam.type, "labels": dict(labels), "le": les}
    return out


def floats(les: object) -> list[float]:
    return [float(x) for x in les]  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def profile():
    return load_profile("deepseek-v4.1-flash")


@pytest.fixture(scope="module")
def pages(profile):
    return Twin(profile, seed=7, start=0.0).pages(90.0)


@pytest.mark.parametrize(
    "role,capture",
    [
        ("prefill-0", "vllm-0.32.0-cpu-pd-prefill-nixl.metrics.txt"),
        ("decode-0", "vllm-0.32.0-cpu-pd-decode-spec.metrics.txt"),  # with a draft path, as the twin's
    ],
)
def test_vllm_families_labels_and_types_match_the_real_capture(pages, role, capture):
    real = shape((FIXTURES / capture).read_text(), "vllm:")
    twin = shape(pages[role], "vllm:")
    assert sorted(twin) == sorted(real)
    for name, spec in real.items():
        assert twin[name]["type"] == spec["type"], name
        assert twin[name]["labels"] == spec["labels"], name


def test_the_twin_renders_every_family_of_the_contract_as_declared(pages):
    """Kind, HELP and label names, family by family, for every source the twin stands in for;
    the contract itself is held to the real captures in tests/test_contract.py."""
    rendered: dict[str, dict[str, tuple[str, str, tuple[str, ...] | None]]] = defaultdict(dict)
    for name, text in pages.items():
        rendered[name.split("-")[0]].update(declared(text))
    assert_as_declared(rendered["decode"], contract("vllm") | contract("process") | contract("plugin"))
    steps = {n: v for n, v in contract("plugin").items() if n.startswith(("moemeter_step", "moemeter_api"))}
    drafting = {n for n in contract("vllm") if n.startswith("vllm:spec_decode_")}  # decode's draft path only
    undrafted = {n: v for n, v in contract("vllm").items() if n not in drafting}
    assert_as_declared(rendered["prefill"], undrafted | contract("process") | steps)  # experts: EPLB ones
    assert_as_declared(rendered["router"], contract("router"))
    assert_as_declared(rendered["gpu"], contract("dcgm"))
    assert_as_declared(rendered["gateway"], contract("gateway"))


def test_histogram_buckets_are_vllms_own_except_the_profiles_custom_family(pages, profile):
    real = shape((FIXTURES / "vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt").read_text(), "vllm:")
    twin = shape(pages["decode-0"], "vllm:")
    custom = profile.custom_histogram_buckets
    assert set(custom) == {"inter_token_latency"}
    for name, spec in real.items():
        if spec["type"] != "histogram":
            continue
        key = HIST_BUCKET_FAMILY.get(name)
        if key == "request_tokens":
            # vLLM builds these 1-2-5 bounds up to max_model_len; the capture's model had 2048.
            assert floats(real[name]["le"]) == [*family_buckets(key, 2048, {}), float("inf")], name
            expected = [*family_buckets(key, profile.model.max_model_len, {}), float("inf")]
            assert floats(twin[name]["le"]) == expected, name
        elif key == "inter_token_latency":
            assert floats(twin[name]["le"]) == [*custom["inter_token_latency"], float("inf")], name
            assert floats(twin[name]["le"])[:20] == pytest.approx([i / 1000 for i in range(1, 21)])
        else:
            assert twin[name]["le"] == spec["le"], name


def test_engine_label_is_the_data_parallel_rank(pages, profile):
    engines = {
        s.labels["engine"]
        for f in text_string_to_metric_families(pages["decode-0"])
        if f.name == "vllm:num_requests_running"
        for s in f.samples
    }
    assert engines == {str(i) for i in range(profile.topology.decode_dp)}
    prefill = {
        s.labels["engine"]
        for f in text_string_to_metric_families(pages["prefill-0"])
        if f.name == "vllm:num_requests_running"
        for s in f.samples
    }
    assert prefill == {"0", "1"}


def test_router_families_match_vllm_router_capture(pages):
    real = shape((FIXTURES / "vllm-router-0.1.17-pd.metrics.txt").read_text(), "vllm_router_")
    twin = shape(pages["router"], "vllm_router_")
    assert sorted(twin) == sorted(real)
    for name, spec in real.items():
        assert twin[name]["type"] == spec["type"], name
        assert twin[name]["labels"] == spec["labels"], name
        if spec["type"] == "histogram":
            assert twin[name]["le"] == spec["le"], name


def test_gpu_exporter_uses_dcgm_names_labels_and_blank_sentinel(pages, profile):
    fams = {f.name: f for f in text_string_to_metric_families(pages["gpu-tray-00"])}
    util = fams["DCGM_FI_DEV_GPU_UTIL"]
    assert {frozenset(s.labels) for s in util.samples} == {
        frozenset({"gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id"})
    }
    assert len(util.samples) == profile.topology.gpus_per_tray
    assert {s.labels["modelName"] for s in util.samples} == {"NVIDIA GB300"}
    assert fams["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"
    assert all(s.value > 9.2e18 for s in fams["DCGM_FI_DEV_MEMORY_TEMP"].samples)  # GB300: blank
    trays = [k for k in pages if k.startswith("gpu-tray-")]
    assert len(trays) == profile.topology.trays == 18


def test_counts_are_whole_numbers_as_the_real_processes_count_them(pages):
    """A histogram counts observations and the plugin counts tokens: whole numbers on every real
    page, however the twin's model divides its steps."""
    counted = 0
    for text in pages.values():
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name.endswith(("_bucket", "_count")) or s.name == "moemeter_expert_rank_tokens_total":
                    assert float(s.value).is_integer(), (s.name, s.labels, s.value)
                    counted += 1
    assert counted > 10_000
