"""The virtual clock and its event queue: time only moves when an event is taken, never backwards.

Events at the same instant are taken by kind (arrivals, then iteration ends, then iteration starts:
a request arriving when an iteration ends is in the inbox the next iteration takes, as in the engine
loop), then in the order they were pushed, so a run is a pure function of its inputs and seed.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class Kind(IntEnum):
    ARRIVAL = 0
    END = 1  # an iteration's simulated end: the scheduler learns its result
    WAKE = 2  # an idle replica looks for work


@dataclass(order=True)
class Event:
    time: float
    kind: Kind
    order: int
    payload: Any = field(compare=False, default=None)


class EventQueue:
    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[Event] = []
        self._order = itertools.count()

    def push(self, time: float, kind: Kind, payload: Any = None) -> None:
        if time < self.now:
            raise ValueError(f"event at {time} is before now ({self.now})")
        heapq.heappush(self._heap, Event(time, kind, next(self._order), payload))

    def pop(self) -> Event:
        ev = heapq.heappop(self._heap)
        self.now = ev.time
        return ev

    def peek_time(self) -> float | None:
        return self._heap[0].time if self._heap else None

    def __len__(self) -> int:
        return len(self._heap)
