"""The four token measures every page and report counts (docs/definitions.md)."""

from __future__ import annotations

PROMPT, CACHED, COMPUTED, GENERATED = "prompt", "cached", "computed", "generated"
TOKEN_MEASURES = {
    PROMPT: "prompt tokens, cache hits included (vLLM's vllm:prompt_tokens_total on the prefill pool)",
    CACHED: "prompt tokens served from the prefix cache (source local_cache_hit)",
    COMPUTED: "prompt tokens the prefill pool computed: prompt - cached",
    GENERATED: "tokens the decode pool generated (vllm:generation_tokens_total)",
}
"""The four token measures every page and report counts (docs/definitions.md)."""


def computed_tokens(prompt: float, cached: float) -> float:
    """Computed prompt tokens: the prompt tokens not served from the prefix cache."""
    return prompt - cached
