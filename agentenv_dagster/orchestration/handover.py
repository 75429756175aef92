"""Shard runs on one core that take turns at the agent, handing their lanes over row by row.

A run's ops are barriers: its grading waits for its last prompt, and the agent waits while it
grades. With a core's rows split between runs in a chain, each later run starts as the run
before it begins prompting (its start, sandboxes and agents overlap those prompts), and its
prompt op takes each lane the earlier run's last rows leave (so the rows in flight stay the
core's share, with no drain between them); the earlier run grades while the later one
prompts. A run in the middle of a chain is both: it says its prompts began once it has its
first lane, and hands its lanes on as its own last rows end. Only the steps that talk to the
agent are gated (``GATED_STEP_TYPES``).

Two pipes join each link of the chain, made before the processes fork: "my prompts began" (a
byte, or the end of the pipe), and a byte for each lane handed over. However the earlier run
ends (done, failed, killed), its ends close and the later run sees the end of both pipes: it
goes on with the lanes the runs before that one hand over (each later run also holds the read
ends of the lanes pipes further up the chain, for when a middle run dies while an earlier one
still prompts), and with every lane once none is left to come: a dying run cannot leave the
next waiting, nor give it lanes an earlier run still holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field
from typing import AsyncIterator, Iterator, Sequence

GATED_STEP_TYPES = frozenset({"prompt_agent"})


@dataclass
class Handover:
    """One run's ends of its links' pipes: to the next run (``began_w``, ``lanes_w``) and from
    the one before (``began_r``, ``lanes_r``); the read ends of the lanes pipes into the run
    before and those before it, nearest first (``lanes_beyond``: where lanes come from once
    the run before has ended); ``gated`` are its plan's gated steps, in plan order."""

    gated: tuple[str, ...]
    began_w: int | None = None
    lanes_w: int | None = None
    began_r: int | None = None
    lanes_r: int | None = None
    lanes_beyond: list[int] = field(default_factory=list)
    received: int = 0  # lanes handed over to this (later) run so far
    sources_ended: int = 0  # of lanes_r and lanes_beyond, how many pipes have ended

    @property
    def ended(self) -> bool:
        """No earlier run will hand over more: every lane is this run's."""
        return not self._sources()

    def _sources(self) -> list[int]:
        """The lanes pipes still to read, in turn: from the run before, then from those before it."""
        return [] if self.lanes_r is None else [self.lanes_r, *self.lanes_beyond][self.sources_ended:]

    def waits_at(self, step_id: str) -> bool:
        return self.lanes_r is not None and step_id in self.gated

    def hands_over_at(self, step_id: str) -> bool:
        return self.lanes_w is not None and step_id in self.gated[-1:]

    def prompts_begin(self, step_id: str) -> None:
        """A run with lanes of its own, at a gated step: the next run may start now (once). A
        run that waits for its lanes says so as it gets the first (``lanes_handed_over``)."""
        if step_id in self.gated and self.lanes_r is None:
            self._say_began()

    def _say_began(self) -> None:
        if self.began_w is not None:
            with contextlib.suppress(BrokenPipeError):  # the next run has ended
                os.write(self.began_w, b"b")
            os.close(self.began_w)
            self.began_w = None

    def wait_for_turn(self) -> None:
        """The later run, before it starts: until the earlier run's prompts begin, or it ended."""
        if self.began_r is not None:
            os.read(self.began_r, 1)
            os.close(self.began_r)
            self.began_r = None

    def hand_over(self) -> None:
        """The earlier run, at its last gated step: one lane its rows no longer need."""
        if self.lanes_w is not None:
            with contextlib.suppress(BrokenPipeError):  # the later run has ended
                os.write(self.lanes_w, b"l")

    def close(self) -> None:
        """Every end still open: the later run sees the end of the pipes and takes every lane
        the runs before it no longer hold."""
        for name in ("began_w", "lanes_w", "began_r", "lanes_r"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)
        while self.lanes_beyond:
            os.close(self.lanes_beyond.pop())

    @contextlib.asynccontextmanager
    async def lanes_handed_over(self, lanes: asyncio.Queue) -> AsyncIterator[None]:
        """The later run, at a gated step: of the lanes in ``lanes``, only those handed over so
        far; the others as they are handed over (all of them once every pipe they come by has
        ended). A run before that ends with lanes it was handed and did not hand on (it died)
        leaves them unused until the runs before it are done: the core's lanes stay its share."""
        held = [lanes.get_nowait() for _ in range(lanes.qsize())]

        def release(count: int) -> None:
            if count:
                self._say_began()
            for _ in range(min(count, len(held))):
                lanes.put_nowait(held.pop())

        release(len(held) if self.ended else self.received)
        loop = asyncio.get_running_loop()

        def readable() -> None:
            fd = self._sources()[0]
            data = os.read(fd, 64)
            if data:
                self.received += len(data)
                release(len(data))
                return
            loop.remove_reader(fd)
            self.sources_ended += 1
            if self.ended:
                release(len(held))
            else:  # the run before ended: the lanes the one before it hands over are this run's
                loop.add_reader(self._sources()[0], readable)

        if not self.ended:
            loop.add_reader(self._sources()[0], readable)
        try:
            yield
        finally:
            if not self.ended:
                loop.remove_reader(self._sources()[0])
            for lane in held:  # never used: back, for their owner to close
                lanes.put_nowait(lane)


def chain(gated: tuple[str, ...], runs: int) -> list[Handover]:
    """A core's ``runs`` runs in the order they take turns, each joined to the next by two new
    pipes, each later one also holding the read ends of the lanes pipes into the runs before it."""
    chained = [Handover(gated) for _ in range(runs)]
    for earlier, later in zip(chained, chained[1:]):
        later.began_r, earlier.began_w = os.pipe()
        later.lanes_r, earlier.lanes_w = os.pipe()
        later.lanes_beyond = [os.dup(fd) for fd in (earlier.lanes_r, *earlier.lanes_beyond) if fd is not None]
    return chained


_current: Handover | None = None


def current() -> Handover | None:
    """This process's run's part in a pair (set by ``taking_turns``), if any."""
    return _current


@contextlib.contextmanager
def taking_turns(handover: Handover | None, every: Sequence[Handover]) -> Iterator[None]:
    """In a shard's process: its own ends of the pipes open, every other pair's closed (so
    that each pipe ends when its one writer does), its turn waited for; closed as it ends."""
    global _current
    for other in every:
        if other is not handover:
            other.close()
    if handover is None:
        yield
        return
    _current = handover
    try:
        handover.wait_for_turn()
        yield
    finally:
        _current = None
        handover.close()

