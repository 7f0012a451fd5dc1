"""An order-preserving map over worker processes with a bounded number of tasks in flight.

`multiprocessing.Pool.imap` would keep results in order but its feeder thread drains the
input iterator as fast as it can, so memory would grow with the corpus; here at most
`in_flight` chunks are read ahead of the writer.
"""

import collections
import multiprocessing
from collections.abc import Callable, Iterable, Iterator


def ordered_map(
    fn: Callable,
    items: Iterable,
    workers: int,
    initializer: Callable,
    initargs: tuple,
    in_flight: int | None = None,
) -> Iterator:
    """Yields fn(item) for each item, in order; workers == 1 runs in this process."""
    if workers <= 1:
        initializer(*initargs)
        yield from map(fn, items)
        return
    # spawn, not fork: the parent may hold threads (JAX, tqdm) that fork would copy mid-lock.
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers, initializer, initargs) as pool:
        pending: collections.deque = collections.deque()
        for item in items:
            pending.append(pool.apply_async(fn, (item,)))
            if len(pending) >= (in_flight or 2 * workers):
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
