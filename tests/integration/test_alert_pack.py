"""The alert pack end to end: the twin carries a straggler, failing NIXL transfers and a full KV
cache on named decode engines; a real Prometheus scrapes it through the file_sd file `moemeter
rules --sd-out` writes and evaluates the pack. Its own ALERTS series must name those engines and
no other (pending while an alert's `for` runs, firing after), but for a healthy engine's KV cache
passing the line for a moment: pending, never held."""

from __future__ import annotations

import subprocess
import time

import httpx
import pytest

from moemeter.cli import main
from stack.ready import scaled
from stack.twin.server import write_targets
from tests.integration.test_prometheus_source import PROMETHEUS, start_prometheus, start_twin
from warehouse.alerts import AlertRules

pytestmark = pytest.mark.integration
STRAGGLER, FAILING, SATURATED, COLLAPSED = "7", "5", "3", "11"
FAULTS = [
    f"straggler:decode-0:{STRAGGLER}",
    f"nixl-failures:decode-0:{FAILING}",
    f"kv-saturated:decode-0:{SATURATED}",
    f"draft-collapse:decode-0:{COLLAPSED}",
]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    if PROMETHEUS is None:
        pytest.skip("needs Debian's prometheus package (make test installs it)")
    tmp = tmp_path_factory.mktemp("pack")
    faults = [a for f in FAULTS for a in ("--fault", f)]
    procs: list[subprocess.Popen] = []
    try:
        chosen = [t for t in start_twin(tmp, procs, "--seed", "6", *faults) if t["role"] in ("prefill", "decode")]
        write_targets(chosen, tmp / "targets.json")
        assert (
            main(
                [
                    "rules",
                    "--targets",
                    str(tmp / "targets.json"),
                    "--out",
                    str(tmp / "rules.yml"),
                    "--sd-out",
                    str(tmp / "sd.json"),
                ]
            )
            == 0
        )
        scrape = {"job_name": "rack", "file_sd_configs": [{"files": [str(tmp / "sd.json")]}]}
        url = start_prometheus(tmp, [scrape], procs)
        yield url
    finally:
        for p in procs:
            p.terminate()
            p.wait(20)


def alerts(url: str) -> dict[str, list[dict[str, str]]]:
    """alertname -> the label sets Prometheus holds it for, pending or firing."""
    result = httpx.get(url + "/api/v1/query", params={"query": "ALERTS"}).json()["data"]["result"]
    out: dict[str, list[dict[str, str]]] = {}
    for r in result:
        out.setdefault(r["metric"]["alertname"], []).append(r["metric"])
    return out


def test_the_injected_faults_raise_their_alerts_on_their_engines_only(prometheus):
    expected = ("DPEngineStraggler", "NIXLFailedTransfers", "KVCacheSaturated", "EnginePreempting", "SpecAcceptanceLow")
    within = scaled(360)  # a queue is judged on 2 minutes of scrapes: the straggler is pending after that
    deadline = time.monotonic() + within
    seen: dict[str, list[dict[str, str]]] = {}
    while time.monotonic() < deadline:
        seen = alerts(prometheus)
        if all(name in seen for name in expected):
            break
        time.sleep(2)
    missing = [name for name in expected if name not in seen]
    assert not missing, f"within {within:g} s Prometheus raised {sorted(seen)}, not {missing}"

    def engines(name: str) -> list[tuple[str, str]]:
        return sorted((m["role"], m.get("engine", "")) for m in seen[name])

    assert engines("DPEngineStraggler") == [("decode", STRAGGLER)], seen["DPEngineStraggler"]
    # A healthy engine's cache touches 95% at a scrape now and then (the twin's decode engines run
    # about 63% full; one or another passed 95% at 1 to 7 of 479 1-s ticks, for at most 3 s): pending,
    # which the rule's 5-min `for` is there to absorb. Only the saturated engine's stays over the line.
    assert ("decode", SATURATED) in engines("KVCacheSaturated")
    assert all(m["alertstate"] == "pending" for m in seen["KVCacheSaturated"] if m.get("engine") != SATURATED)
    held = f"max by (role, engine) (min_over_time(vllm:kv_cache_usage_perc[1m])) > {AlertRules().kv_usage_max:g}"
    full = httpx.get(prometheus + "/api/v1/query", params={"query": held}).json()["data"]["result"]
    assert sorted((r["metric"]["role"], r["metric"]["engine"]) for r in full) == [("decode", SATURATED)]
    assert engines("EnginePreempting") == [("decode", SATURATED)]
    # the collapsed draft path, on its engine alone: the pool's acceptance length stays above the line
    assert engines("SpecAcceptanceLow") == [("decode", COLLAPSED)], seen["SpecAcceptanceLow"]
    # per instance, and without `for`: firing at once, on decode-0 alone
    assert [(m["role"], m["alertstate"]) for m in seen["NIXLFailedTransfers"]] == [("decode", "firing")]
    for quiet in ("MoemeterSLOFastBurn", "PoolAbsent", "TargetDown", "PoolIdle"):
        assert quiet not in seen, f"{quiet} raised on the twin: {seen[quiet]}"
