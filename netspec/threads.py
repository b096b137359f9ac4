"""Which math libraries run where, and how many threads each may use, decided before NumPy loads.

oneDNN (``libdnnl.so.3``, from the ``onednn-cpu-gomp`` package, in the
environment's ``lib`` folder) runs convolutions on an OpenMP pool of every
core.  OpenBLAS, under NumPy, keeps its own pool; when both spin on the same
cores each slows the other down several times, so while oneDNN is in use
OpenBLAS gets one thread (:func:`size_pools`, called by ``import netspec``
before anything imports NumPy).  ``NETSPEC_ONEDNN=0`` turns oneDNN off, and
a value the user set for ``OPENBLAS_NUM_THREADS`` is kept.

:func:`use_threads` (the commands' ``--threads``) sizes the pools later,
while a process runs: oneDNN's OpenMP pool to the count and OpenBLAS to one
thread beside it, or OpenBLAS to the count when oneDNN is off.
:func:`in_parts` runs NumPy's single-threaded loops over slices of a batch
on as many Python threads.
"""

from __future__ import annotations

import ctypes
import functools
import os
import queue
import sys
import threading
import time
from collections.abc import Callable

ONEDNN_SWITCH = "NETSPEC_ONEDNN"
ONEDNN_LIBRARY = "libdnnl.so.3"
OPENBLAS_NAMES = (("scipy_openblas", "64_"), ("scipy_openblas", ""), ("openblas", ""), ("openblas", "64_"))  # builds


SPIN_COUNT = "3000"  # busy-wait loops an idle OpenMP thread makes before it sleeps (libgomp's default: 300 000)

def onednn_path() -> str:
    """Where ``onednn-cpu-gomp`` installs oneDNN's library."""
    return os.path.join(sys.prefix, "lib", ONEDNN_LIBRARY)


def onednn_wanted() -> bool:
    """Whether oneDNN will run: it is installed and ``NETSPEC_ONEDNN`` is not 0."""
    return os.environ.get(ONEDNN_SWITCH, "1") != "0" and os.path.isfile(onednn_path())


def size_pools() -> None:
    """Give OpenBLAS one thread while oneDNN takes the cores (only before NumPy has loaded OpenBLAS), and let idle
    OpenMP threads spin only briefly before they sleep (``GOMP_SPINCOUNT``, unless the environment sets it or a
    wait policy): spinning long, they take the cores from any other busy process, and a training beside one
    stalls; sleeping at once (``OMP_WAIT_POLICY=PASSIVE``) slows a training alone by half."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)
    if onednn_wanted() and "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def all_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@functools.cache
def _openmp() -> ctypes.CDLL | None:
    """oneDNN's library, through which its OpenMP runtime's functions resolve (None when oneDNN is off or has
    no OpenMP)."""
    try:
        library = ctypes.CDLL(onednn_path()) if onednn_wanted() else None
        return library if library is not None and hasattr(library, "omp_set_num_threads") else None
    except OSError:
        return None


def _openblas() -> tuple[ctypes.CDLL, str] | None:
    """NumPy's OpenBLAS, loaded in this process, and the suffix of its function names (None when NumPy uses
    another BLAS)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:  # the libraries loaded (Linux)
            fields = [line.split(maxsplit=5) for line in maps]
        paths = sorted({f[5].strip().removesuffix(" (deleted)") for f in fields if len(f) == 6})
    except OSError:
        return None
    for path in paths:
        if "openblas" not in os.path.basename(path).lower():
            continue
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in OPENBLAS_NAMES:
            if hasattr(library, f"{prefix}_set_num_threads{suffix}"):
                return library, f"{prefix}_{{}}_num_threads{suffix}"
    return None


IDLE_SAMPLE_SECONDS = 0.1  # how long :func:`idle_cores` watches the cores


def idle_cores(seconds: float = IDLE_SAMPLE_SECONDS) -> int:
    """The cores this process may run on that no other process kept busy over the next ``seconds`` (at least
    1; every core where Linux's ``/proc/stat`` cannot tell).

    A core counts as busy when other processes used more than half of it: the time the cores spent
    working, less this process's own.  An OpenMP pool with a thread on a core another process holds waits
    for that thread at every barrier, so a training beside one busy process on 2 cores runs 2.4 times slower
    on 2 threads and no slower on 1.
    """
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    try:
        before, own, started = _working_seconds(cores), os.times(), time.monotonic()
        time.sleep(seconds)
        after, now, elapsed = _working_seconds(cores), os.times(), time.monotonic() - started
    except (OSError, ValueError):
        return len(cores)
    others = (after - before) - ((now.user + now.system) - (own.user + own.system))
    return min(len(cores), max(1, len(cores) - int(others / elapsed + 0.5)))


def _working_seconds(cores: set[int]) -> float:
    """Seconds the ``cores`` have spent on anything but idling, from ``/proc/stat`` (OSError/ValueError where it
    cannot be read)."""
    with open("/proc/stat", encoding="ascii") as stat:
        lines = [line.split() for line in stat if line.startswith("cpu") and line[3].isdigit()]
    ticks = 0
    for fields in lines:
        if int(fields[0][3:]) in cores:
            counts = [int(value) for value in fields[1:9]]  # user nice system idle iowait irq softirq steal
            ticks += sum(counts) - counts[3] - counts[4]
    return ticks / os.sysconf("SC_CLK_TCK")


_sized = False
_note: str | None = None  # why the pools have the size they have, where it is not the obvious one


def pools_sized() -> bool:
    """Whether the pools were given a size: by :func:`use_threads` or ``OMP_NUM_THREADS`` (``OPENBLAS_NUM_THREADS``
    may be :func:`size_pools`' own)."""
    return _sized or "OMP_NUM_THREADS" in os.environ


def use_idle_cores() -> None:
    """Size the pools to the cores no other process keeps busy (:func:`idle_cores`), unless the user gave a
    count (``OMP_NUM_THREADS``): what the commands do without ``--threads``."""
    global _note
    if "OMP_NUM_THREADS" in os.environ:
        return
    count, cores = idle_cores(), all_cores()
    _size_pools(count)
    _note = f"{cores - count} of {cores} cores busy with other processes at the start" if count < cores else None


def use_threads(count: int | None, note: str | None = None) -> None:
    """Size the pools to ``count`` threads in all (None: every core): oneDNN's takes them and OpenBLAS keeps one;
    without oneDNN OpenBLAS takes them.  ``note`` says why, on the threads line (:func:`thread_counts`)."""
    global _sized, _note
    _sized, _note = True, note
    _size_pools(count or all_cores())


def pool_size() -> int:
    """The threads the math runs on: oneDNN's OpenMP pool, else OpenBLAS's (0 where neither can be asked)."""
    openmp, openblas = _openmp(), _openblas()
    if openmp is not None:
        return openmp.omp_get_max_threads()
    if openblas is not None:
        library, name = openblas
        return getattr(library, name.format("get"))()
    return 0


def in_parts(count: int, work: Callable[[slice], None]) -> None:
    """``work(part)`` for the slices that split ``range(count)`` (a batch) evenly among the threads oneDNN runs
    on (every core without it), at once on that many Python threads: NumPy lets go of the interpreter in its
    loops, so array code that NumPy runs on one core runs on all of them.  ``work`` must write only its part; the
    first exception it raises is raised here.

    The calling thread runs the first part itself and hands the others to resident worker threads, one each,
    through queues (a hand-off of some 20 microseconds, where a thread pool's futures take five times as long),
    so parts of a tenth of a millisecond pay.  A call from a worker's own part runs its parts one after another.
    """
    openmp = _openmp()
    threads = min(openmp.omp_get_max_threads() if openmp is not None else all_cores(), count)
    if threads <= 1 or getattr(_local, "worker", False):
        work(slice(0, count))
        return
    bounds = [count * index // threads for index in range(threads + 1)]
    parts = [slice(start, stop) for start, stop in zip(bounds, bounds[1:])]
    finished: queue.SimpleQueue = queue.SimpleQueue()
    for inbox, part in zip(_workers(threads - 1), parts[1:]):
        inbox.put((work, part, finished))
    failure = None
    try:
        work(parts[0])
    except BaseException as exc:  # noqa: BLE001 - raised below, once every part has finished with the arrays
        failure = exc
    for _ in parts[1:]:
        raised = finished.get()
        failure = failure or raised
    if failure is not None:
        raise failure


_local = threading.local()  # .worker: this thread is one of in_parts' workers
_inboxes: list[queue.SimpleQueue] = []
_starting = threading.Lock()


def _workers(count: int) -> list[queue.SimpleQueue]:
    """The inboxes of ``count`` resident worker threads (started on first need; daemons, so they never keep the
    process alive)."""
    with _starting:
        while len(_inboxes) < count:
            inbox: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_work, args=(inbox,), name=f"netspec-part-{len(_inboxes)}", daemon=True).start()
            _inboxes.append(inbox)
        return _inboxes[:count]


def _work(inbox: queue.SimpleQueue) -> None:
    """A worker: run each part it is handed, then say how it ended (None, or the exception it raised)."""
    _local.worker = True
    while True:
        work, part, finished = inbox.get()
        try:
            work(part)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, which raises it
            finished.put(exc)
        else:
            finished.put(None)


def _size_pools(count: int) -> None:
    """oneDNN's OpenMP pool to ``count`` threads and OpenBLAS to one beside it, or OpenBLAS to ``count``."""
    openmp, openblas = _openmp(), _openblas()
    if openmp is not None:
        openmp.omp_set_num_threads(count)
    if openblas is not None:
        library, name = openblas
        getattr(library, name.format("set"))(1 if openmp is not None else count)


def thread_counts() -> str:
    """The pools' sizes in a few words (``4 (oneDNN), OpenBLAS 1``)."""
    openmp, openblas = _openmp(), _openblas()
    words = [f"{openmp.omp_get_max_threads()} (oneDNN)"] if openmp is not None else []
    if openblas is not None:
        library, name = openblas
        words.append(f"OpenBLAS {getattr(library, name.format('get'))()}")
    return (", ".join(words) or "NumPy's default") + (f" ({_note})" if _note else "")
