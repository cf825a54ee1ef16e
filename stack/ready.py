"""Waiting for servers this process started: until each URL answers 200, or one of them exits."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping

import httpx

from moemeter.contract.errors import MoemeterError

PLANNED_CORES = 2  # start-up deadlines are set for the project's 2-core machines


def scaled(seconds: float) -> float:
    """A start-up deadline set for PLANNED_CORES, for the cores this process may run on: on one
    core (`taskset -c 0`) everything starts about twice as slowly, so it waits twice as long."""
    return seconds * max(1.0, PLANNED_CORES / len(os.sched_getaffinity(0)))


class NotReady(MoemeterError, RuntimeError):
    def __init__(self, message: str, child: str | None = None) -> None:
        super().__init__(message)
        self.child = child  # the name of the child that exited, if that is why


def wait_http(urls: str | list[str], within: float, children: Mapping[str, subprocess.Popen] | None = None) -> None:  # type: ignore[type-arg]
    """Until every URL answers 200 (in order). Raises NotReady naming the URL that did not answer
    within `within` seconds, or at once the child that exited meanwhile."""
    deadline = time.monotonic() + within
    pending = [urls] if isinstance(urls, str) else list(urls)
    while pending and time.monotonic() < deadline:
        for name, c in (children or {}).items():
            if c.poll() is not None:
                raise NotReady(f"{name} exited with {c.returncode}", child=name)
        try:
            if httpx.get(pending[0], timeout=2).status_code == 200:
                pending.pop(0)
                continue
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    if pending:
        raise NotReady(f"{pending[0]} did not answer within {within:g} s")
