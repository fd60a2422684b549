"""Several runners sharing one search (one isolated worker per GPU): each slot drives the
driver's loop on a thread of its own, trial by trial, while the thread that called run_search
waits, so that Ctrl-C reaches it, and stores the catalogue rows the slots leave for it (a SQLite
connection is bound to the thread that opened it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from omnitune.store import TrialRecord, TrialSink

Reason = TypeVar("Reason")

# How long the waiting thread waits on a slot's thread before storing the rows it has left.
FLUSH_EVERY_S = 0.2


class HomeSink:
    """A sink that any thread may call and only the thread that built it writes to: rows from
    another thread wait until that one flushes."""

    def __init__(self, sink: TrialSink):
        self.sink = sink
        self.home = threading.current_thread()
        self.pending: list[TrialRecord] = []
        self.lock = threading.Lock()

    def __call__(self, records: Sequence[TrialRecord]) -> None:
        if threading.current_thread() is self.home:
            self.sink(records)
        else:
            with self.lock:
                self.pending.extend(records)

    def flush(self) -> None:
        with self.lock:
            records, self.pending = self.pending, []
        if records:
            self.sink(records)


def run_slots(loop: Callable[[int], Reason], slots: int, *, stopping: threading.Event,
              waiting: Callable[[], None], interrupted: Callable[[], None]) -> dict[int, Reason]:
    """`loop(slot)` for every slot, each on a thread of its own: what each returned, by slot.
    The calling thread waits, calling `waiting` between looks; on Ctrl-C it sets `stopping`,
    calls `interrupted` and lets the interrupt go on. A slot's error sets `stopping` (the other
    slots stop asking) and is raised again once every thread has ended."""
    reasons: dict[int, Reason] = {}
    errors: list[BaseException] = []

    def work(slot: int) -> None:
        try:
            reasons[slot] = loop(slot)
        except BaseException as exc:  # noqa: BLE001 — raised again by the calling thread
            errors.append(exc)
            stopping.set()

    threads = [threading.Thread(target=work, args=(slot,), name=f"omnitune-slot-{slot}", daemon=True)
               for slot in range(slots)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(FLUSH_EVERY_S)
                waiting()
    except KeyboardInterrupt:
        stopping.set()
        interrupted()
        raise
    if errors:
        raise errors[0]
    return reasons
