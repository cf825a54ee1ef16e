"""Fast-forward's source: the twin in a process of its own, one scrape round ahead of the ingest.

The twin's simulation and the warehouse's writer each take most of a core for a round of the
reference rack; in one process they took turns at the GIL (fast-forward: about 1.2 s of wall time
a simulated minute). Here the child advances the twin to each round's time and sends that round's
pages, the expert snapshots due and the gateway feed's new records. The pipe holds a round: the
child simulates the next round while the parent parses and stores this one.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import subprocess
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from types import TracebackType

from moemeter.contract.errors import MoemeterError
from moemeter.contract.requests import ColumnPage

from .config import TwinProfile
from .faults import Fault
from .server import WARMUP_SECONDS, Twin


class TwinProcessError(MoemeterError, RuntimeError):
    """The twin's process failed (its traceback is the message) or ended early."""


@dataclass(frozen=True)
class Target:
    """An endpoint as the collector names it."""

    name: str
    role: str
    gpus: int
    hostname: str


@dataclass(frozen=True)
class Round:
    """What a collector's round at `at` (epoch seconds) reads from the twin."""

    at: float
    pages: dict[str, str]  # endpoint -> its /metrics text
    snapshots: dict[str, dict[str, object]]  # endpoint -> its expert snapshot, on the rounds that pull them
    feed: ColumnPage  # the gateway feed's records new since the round before


class TwinRounds:
    """`with TwinRounds(...) as rounds:` starts the twin's process; `rounds.targets` names its
    endpoints; iterating gives one Round per time in `times`, in order."""

    def __init__(
        self,
        profile: TwinProfile,
        times: list[float],
        *,
        seed: int,
        tick: float,
        faults: tuple[Fault, ...] = (),
        snapshot_every: int = 1,
    ) -> None:
        # A plain child process (multiprocessing's would leave its resource tracker running after
        # it), talking over a socket pair: messages framed by their length, whatever else the child
        # writes to its stdout. main() is imported, not run as __main__, so that both ends pickle this
        # module's classes.
        self._conn, child_end = multiprocessing.Pipe()
        self._child = subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import main; main({child_end.fileno()})"],
            pass_fds=(child_end.fileno(),),
        )
        child_end.close()
        self._conn.send((profile, times, seed, tick, faults, snapshot_every))
        self._times = times
        self.targets: list[Target] = self._receive()

    def __iter__(self) -> Iterator[Round]:
        for _ in self._times:
            yield self._receive()

    def _receive(self):  # type: ignore[no-untyped-def]
        try:
            kind, body = self._conn.recv()
        except (EOFError, OSError):
            code = self._child.wait(10)
            raise TwinProcessError(f"the twin's process ended early (exit code {code})") from None
        if kind == "error":
            raise TwinProcessError(f"the twin's process failed:\n{body}")
        return body

    def close(self) -> None:
        if self._child.poll() is None:
            self._child.terminate()
        self._child.wait(10)
        self._conn.close()

    def __enter__(self) -> TwinRounds:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def main(fd: int) -> None:
    """The child: the twin warmed up to the first time, then a round per time, sent on `fd`."""
    conn = Connection(fd)
    profile, times, seed, tick, faults, snapshot_every = conn.recv()

    def send(kind: str, body: object) -> None:
        conn.send((kind, body))

    try:
        twin = Twin(profile, seed=seed, start=times[0] - WARMUP_SECONDS, tick=tick, faults=faults)
        twin.pages(times[0])  # builds the model and warms it up
        assert twin.model is not None
        endpoints = twin.endpoints()
        send("targets", [Target(e.name, e.role, e.gpus, e.hostname) for e in endpoints])
        snapshots = {e.name: e.snapshot for e in endpoints if e.snapshot is not None}
        feed, after = twin.model.gateway, 0  # a new twin's log: its records from the first
        for k, at in enumerate(times):
            pages = twin.pages(at)
            snaps = {name: take() for name, take in snapshots.items()} if k % snapshot_every == 0 else {}
            page = feed.column_page(after)
            after = int(page["next"])  # type: ignore[call-overload]
            send("round", Round(at, pages, snaps, page))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the parent says so
        pass
    except BaseException:
        with contextlib.suppress(OSError):  # unless the parent is gone
            send("error", traceback.format_exc())
