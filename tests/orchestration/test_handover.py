"""A core's shard runs take turns at the agent over two pipes a link, and a run that dies leaves
the next every lane the runs before it no longer hold (real processes, forked as the shard runs
are)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import select

from agentenv_dagster.orchestration.handover import Handover, chain, taking_turns


def _earlier_run(earlier: Handover, later: Handover, go, then) -> None:
    """The earlier run: its prompts begin, it hands one lane over when told, then it dies
    without handing over the rest."""
    with taking_turns(earlier, [earlier, later]):
        earlier.prompts_begin("prompt")
        go.wait(10)
        earlier.hand_over()
        then.wait(10)
        os._exit(0)  # killed, say: its ends close with the process


async def _until(predicate, seconds: float = 10.0) -> None:
    async with asyncio.timeout(seconds):
        while not predicate():
            await asyncio.sleep(0.01)


def test_the_later_run_takes_each_lane_handed_over_and_every_lane_when_the_earlier_run_dies():
    fork = multiprocessing.get_context("fork")
    go, then = fork.Event(), fork.Event()
    earlier, later = chain(("prompt",), 2)
    child = fork.Process(target=_earlier_run, args=(earlier, later, go, then))
    child.start()
    earlier.close()  # this process's copies of the earlier run's ends, as the shards' parent does
    try:
        later.wait_for_turn()  # returns once the earlier run's prompts began
        assert later.began_r is None

        async def lanes_as_handed_over() -> list[int]:
            lanes: asyncio.Queue[str] = asyncio.Queue()
            for lane in ("a", "b", "c"):
                lanes.put_nowait(lane)
            seen = []
            async with later.lanes_handed_over(lanes):
                seen.append(lanes.qsize())  # none handed over yet
                go.set()
                await _until(lambda: lanes.qsize() == 1)
                seen.append(lanes.qsize())
                then.set()  # it dies: the end of the pipe hands over the rest
                await _until(lambda: lanes.qsize() == 3)
                seen.append(lanes.qsize())
            return seen

        assert asyncio.run(lanes_as_handed_over()) == [0, 1, 3]
        assert (later.received, later.ended) == (1, True)
    finally:
        go.set()
        then.set()
        child.join(10)
        later.close()
    assert child.exitcode == 0


def test_a_later_run_s_next_gated_step_starts_with_the_lanes_it_was_handed_and_gives_back_the_rest():
    earlier, later = chain(("prompt", "follow_up"), 2)
    for _ in range(2):
        earlier.hand_over()

    async def lanes() -> tuple[int, int]:
        """Of four lanes, how many a gated step of the later run has; how many it gives back."""
        lanes: asyncio.Queue[int] = asyncio.Queue()
        for lane in range(4):
            lanes.put_nowait(lane)
        async with later.lanes_handed_over(lanes):
            await asyncio.sleep(0.05)  # the two bytes are read
            during = lanes.qsize()
        return during, lanes.qsize()

    try:
        assert later.waits_at("prompt") and later.waits_at("follow_up") and not later.waits_at("criteria")
        assert earlier.hands_over_at("follow_up") and not earlier.hands_over_at("prompt")
        assert asyncio.run(lanes()) == (2, 4)  # at its first gated step; the unused back to their owner
        assert asyncio.run(lanes()) == (2, 4)  # at the next, what was handed over still counts
        earlier.close()
        assert asyncio.run(lanes()) == (4, 4)  # and at the end of the pipe, all
    finally:
        earlier.close()
        later.close()


def test_a_middle_run_says_its_prompts_began_once_it_has_a_lane_and_hands_its_lanes_on():
    """In a chain of three, the middle run opening its prompt op starts nothing; its first lane
    from the first run starts the last run, and the lanes it no longer needs go on to it."""
    first, middle, last = chain(("prompt",), 3)
    assert (first.began_r, last.began_w) == (None, None)  # the chain's ends

    def began(run: Handover) -> bool:
        return bool(select.select([run.began_r], [], [], 0.05)[0])

    async def middle_prompts() -> list[int]:
        lanes: asyncio.Queue[int] = asyncio.Queue()
        for lane in range(2):
            lanes.put_nowait(lane)
        middle.prompts_begin("prompt")
        seen = [lanes.qsize(), began(last)]
        async with middle.lanes_handed_over(lanes):
            first.hand_over()
            await _until(lambda: lanes.qsize() == 1)
            seen += [lanes.qsize(), began(last)]
            middle.hand_over()  # a row of its own ended with none waiting
        return seen

    try:
        assert asyncio.run(middle_prompts()) == [2, False, 1, True]
        last.wait_for_turn()
        assert os.read(last.lanes_r, 8) == b"l"
    finally:
        for run in (first, middle, last):
            run.close()


def _middle_run(middle: Handover, every, lanes: int, then) -> None:
    """The middle run: once the first run's prompts began, it takes ``lanes`` lanes, hands one
    on, and dies holding the others."""
    async def prompts() -> None:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for lane in range(4):
            queue.put_nowait(lane)
        async with middle.lanes_handed_over(queue):  # its first lane says its prompts began
            await _until(lambda: queue.qsize() == lanes)
            middle.hand_over()
            then.wait(10)
            os._exit(0)

    with taking_turns(middle, every):
        asyncio.run(prompts())


def test_when_the_middle_run_dies_the_last_takes_only_the_lanes_the_first_no_longer_holds():
    """Four lanes: the first run hands two to the middle run, which hands one on and dies. The
    last run goes on with that one (the middle run's other lane is not counted on), then with
    each lane the first run hands over, and with all four once the first run is done: never more
    lanes at the agent than the core's four."""
    fork = multiprocessing.get_context("fork")
    then = fork.Event()
    first, middle, last = every = chain(("prompt",), 3)
    child = fork.Process(target=_middle_run, args=(middle, every, 2, then))
    child.start()
    middle.close()  # this process's copies, as the shards' parent does: here it is the first and last runs
    try:
        first.prompts_begin("prompt")
        first.hand_over()
        first.hand_over()

        async def lanes_of_the_last_run() -> list[int]:
            lanes: asyncio.Queue[int] = asyncio.Queue()
            for lane in range(4):
                lanes.put_nowait(lane)
            seen = []
            async with last.lanes_handed_over(lanes):
                await _until(lambda: lanes.qsize() == 1)  # the one the middle run handed on
                then.set()  # it dies with the other
                await _until(lambda: not child.is_alive())
                await asyncio.sleep(0.2)  # the end of its pipe read
                seen.append(lanes.qsize())
                first.hand_over()
                await _until(lambda: lanes.qsize() == 2)
                seen.append(lanes.qsize())
                first.close()  # the first run is done: no lane is held before the last run
                await _until(lambda: lanes.qsize() == 4)
                seen.append(lanes.qsize())
            return seen

        last.wait_for_turn()  # once the middle run has its first lane
        assert asyncio.run(lanes_of_the_last_run()) == [1, 2, 4]
        assert (last.received, last.ended) == (2, True)
    finally:
        then.set()
        child.join(10)
        for run in every:
            run.close()
    assert child.exitcode == 0
