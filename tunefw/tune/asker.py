"""Asks each problem's sampler ahead of the driver, on a background thread.

A TPE ask costs milliseconds and several may be spent on configs check() rejects; done on the
driver's loop, that time is taken from every GPU waiting on a result. Here the asks run while
the driver waits on Ray, and the driver only takes ready proposals. The database stays the
driver's: rejected configs are handed over to be recorded, never written here.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

from tunefw.tune.search import ProblemSearch, Proposal


@dataclass
class AskState:
    """What the asker shares with the driver about one problem. The counts and ``ready`` change
    under ``lock`` (the driver claims a proposal and counts a result inside it), so the asker's
    view of the room left in the budget is never larger than the truth."""

    search: ProblemSearch
    budget: int
    known: set = field(default_factory=set)  # driver: measured, rejected or in flight
    values: dict = field(default_factory=dict)  # driver: config key -> ratio to cuBLAS if OK
    ready: deque = field(default_factory=deque)  # asker appends, driver pops
    reserved: set = field(default_factory=set)  # asker: keys of proposals not yet taken
    evaluated: int = 0  # driver
    in_flight: int = 0  # driver
    exhausted: bool = False  # asker: the valid space has nothing new
    recorded: frozenset | None = None  # replay: the only keys the search may propose
    lock: threading.Lock = field(default_factory=threading.Lock)

    def room(self) -> int:
        """Configs still to ask for (call with ``lock`` held)."""
        return self.budget - self.evaluated - self.in_flight - len(self.ready)


class _Known:
    """Membership in the driver's known keys or the asker's reserved ones."""

    def __init__(self, st: AskState) -> None:
        self.st = st

    def __contains__(self, key: object) -> bool:
        # A replay's unrecorded configs count as known: screened out, skipped by a grid.
        return (key in self.st.known or key in self.st.reserved
                or (self.st.recorded is not None and key not in self.st.recorded))

    def __iter__(self):
        # list() of a set runs without releasing the GIL: the driver cannot change it midway
        return iter(list(self.st.known) + list(self.st.reserved))


class Asker:
    """Threads keeping up to ``ahead`` proposals ready per problem that still needs them; with
    several threads each owns every n-th problem (its sampler process, if any, serves only
    those), so asks for different problems run at once."""

    def __init__(self, states: Iterable[AskState], ahead: int, threads: int = 1) -> None:
        self.states = list(states)
        self.ahead = ahead
        self.rejected: queue.SimpleQueue[tuple[AskState, Proposal]] = queue.SimpleQueue()
        self.produced = threading.Event()  # set when a proposal became ready
        self.asks, self.ask_s = 0, 0.0  # sampler asks made and the seconds they took
        self._counts = threading.Lock()
        self._stop = threading.Event()
        n = max(1, min(threads, len(self.states)))
        self._wakes = [threading.Event() for _ in range(n)]
        self._threads = [threading.Thread(target=self._run, args=(self.states[i::n], self._wakes[i]),
                                          name=f"tunefw-asker-{i}", daemon=True) for i in range(n)]
        self.error: BaseException | None = None

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.wake()
        for thread in self._threads:
            thread.join()

    def wake(self) -> None:
        """Something changed (a result came in): look again at which problems need asks."""
        for event in self._wakes:
            event.set()

    def wants(self, st: AskState) -> bool:
        with st.lock:
            return not st.exhausted and len(st.ready) < self.ahead and st.room() > 0

    def _run(self, states: list[AskState], wake: threading.Event) -> None:
        try:
            while not self._stop.is_set():
                needy = [st for st in states if self.wants(st)]
                if not needy:
                    wake.wait(0.05)
                    wake.clear()
                    continue
                self._ask(max(needy, key=AskState.room))  # most room first (unlocked: an order only)
        except BaseException as exc:  # surfaced on the driver's thread by check()
            self.error = exc

    def check(self) -> None:
        """Re-raise, on the driver's thread, whatever stopped the asker."""
        if self.error is not None:
            raise self.error

    def _ask(self, st: AskState) -> None:
        """One ask: a new valid config becomes ready, anything else is answered at once."""
        start = time.perf_counter()
        prop = st.search.ask(_Known(st))
        with self._counts:
            self.asks += 1
            self.ask_s += time.perf_counter() - start
        if prop is None:
            st.exhausted = True
            return
        if prop.invalid_reason is None and st.recorded is not None and prop.key not in st.recorded:
            from tunefw.evaluate.replay import NOT_RECORDED_REASON
            prop.invalid_reason = NOT_RECORDED_REASON  # answered NOT_RECORDED, like a reject
        if prop.invalid_reason is not None:
            st.search.tell(prop.trial, None)
            if prop.key not in st.known and prop.key not in st.reserved:
                st.reserved.add(prop.key)  # recorded once, by the driver
                self.rejected.put((st, prop))
            return
        if prop.key in st.known or prop.key in st.reserved:  # a repeat: answer from the row
            st.search.tell(prop.trial, st.values.get(prop.key))
            return
        with st.lock:
            if st.room() <= 0:  # the budget filled while asking: leave this trial unanswered
                return
            st.reserved.add(prop.key)
            st.ready.append(prop)
        self.produced.set()

    def drain_rejected(self) -> list[tuple[AskState, Proposal]]:
        out = []
        while True:
            try:
                out.append(self.rejected.get_nowait())
            except queue.Empty:
                return out
