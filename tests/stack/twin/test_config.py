"""Profiles load by name or path; a bad profile is refused with the reason."""

from __future__ import annotations

import pytest

from stack.twin.config import ProfileError, load_profile


def test_default_profile_is_the_reference_deployment():
    p = load_profile("deepseek-v4.1-flash")
    assert (p.model.num_layers, p.model.prefill_layers, p.model.routed_experts, p.model.shared_experts) == (
        40,
        20,
        384,
        1,
    )
    assert (p.topology.total_gpus, p.topology.prefill_gpus, p.topology.decode_gpus) == (72, 8, 64)


def test_unknown_profile_lists_the_available_ones():
    with pytest.raises(ProfileError, match="available: .*deepseek-v4.1-flash"):
        load_profile("nope")


@pytest.mark.parametrize(
    "text,match",
    [
        ("[model]\nlayers = 3\n", "unknown keys \\['layers'\\]"),
        ("[topology]\ntrays = 1\n", "exceed the rack"),
        ("name = \n", "not valid TOML"),
        ("[custom_histogram_buckets]\ninter_token_latency = [0.2, 0.1]\n", "positive and increasing"),
        ("colour = 'red'\n", "unknown top-level keys"),
        ("[speculative]\nmethod = 'eagle9'\n", "method must be one of dspark, mtp, none"),
        ("[speculative]\nnum_speculative_tokens = 4096\n", "num_speculative_tokens must be 0..16"),
        ("[speculative]\nclass_shares = [0.5, 0.5]\n", "one value per class"),
        ("[speculative]\nclass_shares = [0.9, 0.9, -0.8]\n", "non-negative and add up to 1"),
        ("[speculative]\nclass_acceptance = [1.0, 0.5, 0.5]\n", "strictly between 0 and 1"),
        ("[speculative]\ncollapsed_acceptance = -1e308\n", "strictly between 0 and 1"),
        ("[speculative]\nacceptance_concentration = 0\n", "concentration must be positive"),
    ],
)
def test_bad_profiles_are_refused_with_the_reason(tmp_path, text, match):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ProfileError, match=match):
        load_profile(str(path))
