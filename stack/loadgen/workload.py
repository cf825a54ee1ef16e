"""AgentX-like sessions as plain data: who asks what, turn by turn, all drawn from one seed.

A session belongs to a user and starts from one of a few shared system prompts (prefix-cache
reuse across users); each turn appends a user message to the growing context (reuse within the
session) and asks for either a short tool-call-like output or a long answer. Some turns fork a
subagent: a child session that starts from the parent's whole context so far, runs a few turns
of its own and ends. A session ends after its turns or when its context would pass the limit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class WorkloadSpec:
    users: int = 20
    """Distinct users (the OpenAI `user` field), user-0000 ..."""
    sessions: int = 40
    """Top-level sessions to run (subagents come on top)."""
    turns_mean: float = 5.0
    """Mean turns per session (geometric)."""
    system_prompts: int = 3
    """Distinct system prompts shared by all users."""
    system_prompt_words: int = 300
    """Words in each system prompt."""
    first_turn_words: int = 200
    """Mean words of a session's first user message."""
    turn_words: int = 80
    """Mean words each later turn adds (tool results, follow-ups)."""
    max_context_words: int = 2500
    """A session ends before its context passes this many words (keep under the model's length)."""
    tool_call_share: float = 0.6
    """Share of turns that ask for a short tool-call-like output."""
    tool_call_tokens: int = 24
    """max_tokens of a tool-call-like turn."""
    answer_tokens: int = 192
    """Mean max_tokens of a long-answer turn."""
    subagent_share: float = 0.15
    """Chance that a turn forks a subagent session from the parent's context."""
    subagent_turns: int = 2
    """Turns a subagent runs."""
    think_seconds: float = 1.0
    """Mean think time between a session's turns, seconds (exponential)."""

    def __post_init__(self) -> None:
        """Refuse a spec no session can be drawn from (a mean of 0 words, no system prompt, NaN)."""
        at_least = {
            "users": 1,
            "sessions": 1,
            "turns_mean": 1,
            "system_prompts": 1,
            "first_turn_words": 1,
            "turn_words": 1,
        }
        for f in fields(self):
            value, least = getattr(self, f.name), at_least.get(f.name, 0)
            most = 1 if f.name.endswith("_share") else 10**9
            if not least <= value <= most:  # NaN fails too
                raise ValueError(f"--{f.name.replace('_', '-')} must be from {least} to {most:,}, not {value}")


@dataclass
class Turn:
    words: list[str]  # the user message
    max_tokens: int
    fork: Session | None = None  # a subagent started after this turn's answer


@dataclass
class Session:
    sid: str
    user: str
    system: str
    turns: list[Turn] = field(default_factory=list)
    parent_context: list[dict[str, str]] | None = None  # set for subagents when they start


def _words(rng: random.Random, n: int) -> list[str]:
    return [f"w{rng.randrange(5000)}" for _ in range(max(1, n))]


def plan_sessions(spec: WorkloadSpec, seed: int) -> list[Session]:
    """Every session and its turns, decided up front from the seed (answers do not change the plan)."""
    rng = random.Random(seed)
    systems = [
        " ".join(_words(random.Random(f"system-{k}"), spec.system_prompt_words)) for k in range(spec.system_prompts)
    ]
    out = []
    for s in range(spec.sessions):
        out.append(
            _session(
                spec,
                rng,
                f"s{s}",
                f"user-{rng.randrange(spec.users):04d}",
                rng.choice(systems),
                spec.system_prompt_words,
                top=True,
            )
        )
    return out


def _session(
    spec: WorkloadSpec, rng: random.Random, sid: str, user: str, system: str, context: int, top: bool
) -> Session:
    session = Session(sid, user, system)
    n_turns = spec.subagent_turns if not top else 1 + int(rng.expovariate(1 / max(spec.turns_mean - 1, 1e-9)))
    for k in range(n_turns):
        n = int(rng.expovariate(1 / spec.first_turn_words if k == 0 else 1 / spec.turn_words)) + 8
        tool = rng.random() < spec.tool_call_share
        max_tokens = spec.tool_call_tokens if tool else int(rng.expovariate(1 / spec.answer_tokens)) + 16
        if context + n + max_tokens > spec.max_context_words:
            break
        context += n + max_tokens
        turn = Turn(_words(rng, n), max_tokens)
        if top and rng.random() < spec.subagent_share:
            turn.fork = _session(spec, rng, f"{sid}.{k}", user, system, context, top=False)
        session.turns.append(turn)
    return session
