"""SIGINT and SIGHUP during training: ask the solver to snapshot or stop at the next iteration boundary."""

from __future__ import annotations

import contextlib
import signal

EFFECTS = ("stop", "snapshot", "none")


@contextlib.contextmanager
def signal_effects(solver, sigint: str = "stop", sighup: str = "snapshot"):
    """While inside, SIGINT and SIGHUP call ``solver.request(effect)``; ``none`` ignores the signal.

    The solver acts between iterations, so a signal never interrupts a file being written.
    """
    wanted = {signal.SIGINT: sigint}
    if hasattr(signal, "SIGHUP"):
        wanted[signal.SIGHUP] = sighup
    previous = {}
    for number, effect in wanted.items():
        handler = signal.SIG_IGN if effect == "none" else (lambda _n, _f, effect=effect: solver.request(effect))
        previous[number] = signal.signal(number, handler)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
