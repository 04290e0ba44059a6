"""``bounded_map``: a thread pool's ``map`` that keeps at most ``window`` items in flight.

``ThreadPoolExecutor.map`` submits every item at once: for a plate of thousands of fields or a
cache of a million items, every item and result would be held together. The plate build and
``verify`` both stream through this one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def bounded_map(
    pool: ThreadPoolExecutor, fn: Callable[[T], R], items: Iterable[T], window: int
) -> Iterator[R]:
    """``pool.map`` in order, with at most ``window`` items submitted and not yet consumed."""
    pending: deque[Future[R]] = deque()
    for item in items:
        if len(pending) >= window:
            yield pending.popleft().result()
        pending.append(pool.submit(fn, item))
    while pending:
        yield pending.popleft().result()
