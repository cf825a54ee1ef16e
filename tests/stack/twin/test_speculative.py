"""The twin's draft path: acceptance drawn per turn from its class, per-user speed following from
it, vLLM's own invariants on the spec-decode counters, and the `draft-collapse` fault."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stack.twin.config import load_profile
from stack.twin.faults import Fault
from stack.twin.model import RackModel, p90_per_user_tokens_per_second
from stack.twin.server import Twin

COLLAPSED = 11


@pytest.fixture(scope="module")
def profile():
    return load_profile("deepseek-v4.1-flash")


def acceptance_length(model: RackModel) -> np.ndarray:
    """Per decode engine: 1 + accepted / drafts (vLLM's mean acceptance length)."""
    c = model.decode_pool.counters
    return 1.0 + c["spec_accepted_per_pos"].sum(axis=1) / c["spec_drafts"]


@pytest.fixture(scope="module")
def collapsed(profile):
    m = RackModel(profile, seed=4, start=0.0, faults=(Fault.parse(f"draft-collapse:decode-0:{COLLAPSED}"),))
    m.advance(90.0)
    return m


def expected_length(profile) -> float:
    """1 + E[p + ... + p^k] over the class mix, each p ~ Beta with the class's mean: what the drafts
    would accept if every request took as many steps (slow requests take more, so the pool's
    figure lies a little below it)."""
    spec = profile.speculative
    total = 0.0
    for share, mean in zip(spec.class_shares, spec.class_acceptance, strict=True):
        a, b = mean * spec.acceptance_concentration, (1 - mean) * spec.acceptance_concentration
        moment, sum_moments = 1.0, 0.0
        for j in range(spec.num_speculative_tokens):  # E[p^(j+1)] of a Beta(a, b)
            moment *= (a + j) / (a + b + j)
            sum_moments += moment
        total += share * sum_moments
    return 1.0 + total


def test_the_pool_accepts_what_its_class_mix_draws(profile, collapsed):
    lengths = np.delete(acceptance_length(collapsed), COLLAPSED)
    assert expected_length(profile) * 0.9 < lengths.mean() < expected_length(profile)
    assert lengths.min() > 2.0  # every healthy engine: about 2.7 tokens a step at the default mix
    # per position, each drafted token is accepted less often than the one before it
    c = collapsed.decode_pool.counters
    rates = c["spec_accepted_per_pos"].sum(axis=0) / c["spec_drafts"].sum()
    assert (np.diff(rates) < 0).all() and 0.6 < rates[0] < 0.9


def test_tool_calls_and_code_accept_more_than_free_text(profile):
    m = RackModel(profile, seed=5, start=0.0)
    m.advance(20.0)
    drawn = m.acceptance[m.state != 0]
    cls = m.workload_class[m.state != 0]
    tool_call, code, text = (drawn[cls == i].mean() for i in range(3))
    assert tool_call > code > text


def test_per_user_speed_follows_acceptance(profile):
    """The same rack with drafts that accept less serves each user slower: tokens/s per user is
    acceptance length over step time, not a number painted on."""

    def p90(spec_changes: dict) -> float:
        changed = dataclasses.replace(profile, speculative=dataclasses.replace(profile.speculative, **spec_changes))
        m = RackModel(changed, seed=6, start=0.0)
        m.advance(40.0)
        m.finished_tpot.clear()
        m.advance(160.0)
        return p90_per_user_tokens_per_second(m.finished_tpot)

    usual = p90({})
    worse = p90({"class_acceptance": (0.5, 0.45, 0.3)})
    assert worse < 0.75 * usual


def test_a_collapsed_draft_path_drags_down_its_engine_only(collapsed):
    lengths = acceptance_length(collapsed)
    assert lengths[COLLAPSED] < 1.25  # 1 + 0.15 + 0.15^2 + 0.15^3
    assert np.delete(lengths, COLLAPSED).min() > 2.0
    # a straggler's queue grows; a collapsed draft path's does not: it emits fewer tokens a step
    waiting = collapsed.decode[0].gauges["waiting"]
    assert waiting[COLLAPSED] <= np.delete(waiting, COLLAPSED).max()


def samples(text: str, name: str) -> dict[tuple[str, ...], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[(s.labels["engine"], s.labels.get("position", ""))] = s.value
    return out


def test_the_counters_keep_vllms_invariants_in_whole_numbers(profile):
    page = Twin(profile, seed=8, start=0.0).pages(60.0)["decode-0"]
    drafts = samples(page, "vllm:spec_decode_num_drafts_total")
    tokens = samples(page, "vllm:spec_decode_num_draft_tokens_total")
    accepted = samples(page, "vllm:spec_decode_num_accepted_tokens_total")
    per_pos = samples(page, "vllm:spec_decode_num_accepted_tokens_per_pos_total")
    k = profile.speculative.num_speculative_tokens
    assert len(drafts) == profile.topology.decode_dp and sum(drafts.values()) > 1000
    for (engine, _), n in drafts.items():
        positions = [per_pos[(engine, str(i))] for i in range(k)]
        assert all(float(v).is_integer() for v in (n, *positions))
        assert tokens[(engine, "")] == k * n
        assert accepted[(engine, "")] == sum(positions)
        assert n >= positions[0] and all(a >= b for a, b in zip(positions, positions[1:]))


def test_a_profile_without_a_draft_path_exports_no_spec_decode_family(profile):
    plain = dataclasses.replace(profile, speculative=dataclasses.replace(profile.speculative, method="none"))
    page = Twin(plain, seed=8, start=0.0).pages(20.0)["decode-0"]
    assert "spec_decode" not in page
