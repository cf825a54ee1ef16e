"""The load generator: sessions planned from a seed, sent through the real gateway, summarised."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from stack.loadgen.run import LoadGen, Result, summarise
from stack.loadgen.workload import WorkloadSpec, plan_sessions
from stack.twin.upstream import SimulatedUpstream

from ..gateway.conftest import start_rig

SPEC = WorkloadSpec(
    users=5,
    sessions=12,
    turns_mean=4,
    system_prompt_words=64,
    first_turn_words=40,
    turn_words=20,
    max_context_words=600,
    answer_tokens=24,
    subagent_share=0.3,
    think_seconds=0.0,
)


def test_the_plan_follows_the_seed_and_the_context_limit() -> None:
    a, b = plan_sessions(SPEC, 7), plan_sessions(SPEC, 7)
    assert [(s.user, [t.words for t in s.turns]) for s in a] == [(s.user, [t.words for t in s.turns]) for s in b]
    assert [s.user for s in a] != [s.user for s in plan_sessions(SPEC, 8)]
    assert len({s.system for s in a}) <= SPEC.system_prompts
    for s in a:
        used = SPEC.system_prompt_words + sum(len(t.words) + t.max_tokens for t in s.turns)
        assert used <= SPEC.max_context_words
    forks = [t.fork for s in a for t in s.turns if t.fork]
    assert forks and all(f.user in {s.user for s in a} for f in forks)
    assert {t.max_tokens for s in a for t in s.turns} >= {SPEC.tool_call_tokens}  # short tool-call-like turns


def test_through_the_gateway_every_request_is_recorded_with_its_usage(tmp_path: Path) -> None:
    rig = start_rig(tmp_path, upstream=SimulatedUpstream(model="twin-moe", itl_seconds=0.002))
    try:
        out = io.StringIO()
        gen = LoadGen(rig.url, "twin-moe", SPEC, seed=3, concurrency=4, stream_share=0.7, progress=out)
        results = gen.run()
        rig.flush()
        records = {r["request_id"]: r for r in rig.records.page(0, 10_000)["records"]}
    finally:
        rig.loop.close()
    assert results and all(r.error is None and r.status == 200 for r in results)
    assert {r.request_id for r in results} == set(records)
    for r in results:
        rec = records[r.request_id]
        assert (rec["user"], rec["prompt_tokens"], rec["generated_tokens"], rec["cached_prompt_tokens"]) == (
            r.user,
            r.prompt_tokens,
            r.completion_tokens,
            r.cached_prompt_tokens,
        )
    # later turns and subagents reuse their session's prefix
    assert sum(r.cached_prompt_tokens or 0 for r in results) > 0.3 * sum(r.prompt_tokens or 0 for r in results)
    assert any(r.session.count(".") for r in results)  # subagents ran
    assert "12/12 sessions" in out.getvalue()


def test_summary_p90_is_the_slow_tail() -> None:
    results = [
        Result(f"r{i}", f"u{i % 3}", "s", True, 200, None, 10, 0, 5, 0.1, itl, 1.0)
        for i, itl in enumerate([0.01] * 9 + [0.02])
    ]
    results.append(Result("bad", "u9", "s", True, 504, "upstream_timeout", None, None, None, None, None, 1.0))
    s = summarise(results, wall_seconds=2.0)
    assert s["requests"] == 11 and s["ok"] == 10 and s["errors"] == {"upstream_timeout": 1}
    assert s["per_user_tokens_per_second_p50"] == pytest.approx(100.0)
    assert s["per_user_tokens_per_second_p90"] == pytest.approx(
        1 / 0.011, abs=1e-3
    )  # numpy's linear quantile of the ITLs
    assert s["generated_tokens"] == 50 and s["output_tokens_per_second"] == 25.0
