"""Signals during training: SIGINT, SIGHUP and SIGTERM ask the solver to snapshot or stop at the next iteration.

A run stopped by a signal snapshots first and then reports the signal
(:attr:`netspec.training.solver.Solver.interrupted`); ``netspec train`` exits
with 128 + its number (130 for SIGINT, 143 for SIGTERM), so a pipeline never
mistakes an interrupted run for a finished one.
"""

from __future__ import annotations

import contextlib
import signal

EFFECTS = ("stop", "snapshot", "none")


def exit_status(number: int) -> int:
    """The shell's exit status of a process ended by signal ``number``."""
    return 128 + number


@contextlib.contextmanager
def signal_effects(solver, sigint: str = "stop", sighup: str = "snapshot"):
    """While inside, SIGINT and SIGHUP call ``solver.request(effect)``, SIGTERM a stop; ``none`` ignores a signal.

    The solver acts between iterations, so a signal never interrupts a file being written.
    """
    wanted = {signal.SIGINT: sigint, signal.SIGTERM: "stop"}
    if hasattr(signal, "SIGHUP"):
        wanted[signal.SIGHUP] = sighup
    previous = {}
    for number, effect in wanted.items():
        handler = signal.SIG_IGN if effect == "none" else (
            lambda received, _frame, effect=effect: solver.request(effect, signal.Signals(received)))
        previous[number] = signal.signal(number, handler)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
