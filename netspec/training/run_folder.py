"""The run folder of ``netspec train``: the one module that knows its layout and file formats.

::

    RUN/                                  the folder of the solver's snapshot_prefix (or --out)
      metrics.jsonl                       one JSON event a line (below); a resumed run appends
      tensorboard/events.out.tfevents.*   their scalars for TensorBoard (--tensorboard); a resumed run adds a file
      config/<solver file>                the solver text exactly as read
      config/<net file>                   each net file the solver names, as read
      config/sources.json                 {"solver": path, "train_net": path or null}: where they were read
      <prefix>_iter_<N>.weights.h5        snapshot of iteration N: weights ...
      <prefix>_iter_<N>.solverstate.h5    ... and everything else a resumed run needs
      <prefix>_best.weights.h5            the weights of snapshot_best's best test pass
      outcome.json                        how the last training here ended (below); none while one runs
      train.log                           the output of a training the dashboard started (its stdout and stderr)
      .lock                               the pid of the training that writes here, locked while it runs

A folder holds one run: a fresh run refuses a folder with another run's
metrics or snapshots in it (:func:`refuse_used`); ``--resume`` continues it.
While a training writes to the folder it holds an OS lock on ``.lock``
(:func:`locked`; the OS releases it when the process ends, however it ends),
and a second training there is refused.  Taking the lock removes the
temporary files a killed run left (:func:`remove_leftovers`); a resumed run
drops the events after its snapshot from metrics.jsonl (:func:`truncate_metrics`).
Who holds the lock can be asked without taking it (:func:`lock_holder`).

``outcome.json`` is ``{"state": finished|stopped|diverged|failed, "message": text}``,
written when a training ends by itself, is stopped or fails; a run that was
killed leaves none (:func:`run_state` calls it stopped).

An event is ``{"iter", "phase": TRAIN|TEST, "lr", ["epoch"], ["test_net"], <output>: value, ...}``;
TRAIN events add ``smoothed_loss``, ``images_per_s`` and, distributed, ``communication_ms``.
Non-finite values are written as strings (``"nan"``), since JSON has no such numbers.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import stat
from typing import BinaryIO

from netspec.atomic import TEMPORARY_NAME, atomic_open, make_folder, open_for_writing, write_bytes
from netspec.data.files import one_line, read_small
from netspec.errors import DataError, NetspecError

METRICS = "metrics.jsonl"
SNAPSHOT_ENDINGS = (".weights.h5", ".solverstate.h5")
STATE_NAME = re.compile(r".+_iter_(\d+)\.solverstate\.h5")
WEIGHTS_NAME = re.compile(r".+_iter_(\d+)\.weights\.h5")
CONFIG = "config"
TENSORBOARD = "tensorboard"
SOURCES = "sources.json"
LOCK = ".lock"
OUTCOME = "outcome.json"
MAX_OUTCOME_BYTES = 64 * 1024  # an outcome is a line; the runs list reads every run's on each poll
MPI_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")  # set by mpirun in every process it starts
TRAIN_LOG = "train.log"
OUTCOMES = ("finished", "stopped", "diverged", "failed")
PROC_LOCKS = "/proc/locks"  # Linux's table of the locks held, with their holders
# keys of an event that are not outputs of a net
EVENT_KEYS = {"iter", "epoch", "phase", "lr", "test_net", "smoothed_loss", "images_per_s", "communication_ms",
              "per_class"}


def folder_of(prefix: str) -> str:
    """The run folder of a snapshot prefix: the folder it names."""
    return os.path.dirname(os.path.abspath(prefix))


def prefix_in(folder: str, prefix: str) -> str:
    """``prefix`` moved into ``folder`` (``netspec train --out``), keeping its file-name part."""
    return os.path.join(os.path.abspath(folder), os.path.basename(prefix))


def snapshot_paths(prefix: str, iteration: int) -> tuple[str, str]:
    """The weights and solver-state files of the snapshot of ``iteration``."""
    stem = f"{prefix}_iter_{iteration}"
    return f"{stem}.weights.h5", f"{stem}.solverstate.h5"


def best_weights_path(prefix: str) -> str:
    """Where ``snapshot_best`` keeps the best weights."""
    return f"{prefix}_best.weights.h5"


def last_snapshot_weights(folder: str) -> str | None:
    """The weights of the run's latest snapshot (the highest iteration), or None when it has none."""
    names = os.listdir(folder) if os.path.isdir(folder) else []
    found = sorted((int(match.group(1)), name) for name in names if (match := WEIGHTS_NAME.fullmatch(name)))
    return os.path.join(folder, found[-1][1]) if found else None


def metrics_path(folder: str) -> str:
    """The run's metrics.jsonl."""
    return os.path.join(folder, METRICS)


def train_log_path(folder: str) -> str:
    """Where a training the dashboard started writes its output (``netspec train``'s stdout and stderr)."""
    return os.path.join(folder, TRAIN_LOG)


def tensorboard_folder(folder: str) -> str:
    """The run's TensorBoard event files' folder (:mod:`netspec.training.tensorboard` writes them)."""
    return os.path.join(folder, TENSORBOARD)


def snapshot_files(names: list[str]) -> list[str]:
    """The snapshot files among a folder's ``names`` (weights, states, best weights), by name."""
    return sorted(name for name in names if name.endswith(SNAPSHOT_ENDINGS))


def is_run_folder(folder: str, names: list[str]) -> bool:
    """Whether ``folder``, holding ``names``, is a run folder: a training logged or snapshotted there, or is
    starting there now (it holds the lock)."""
    return METRICS in names or bool(snapshot_files(names)) or (LOCK in names and lock_holder(folder) is not None)


def refuse_used(folder: str, from_python: bool = False) -> None:
    """Refuse a fresh run in ``folder`` when it holds another run's metrics or snapshots, saying what to do (on the
    command line, or ``from_python`` to a solver made there)."""
    names = os.listdir(folder) if os.path.isdir(folder) else []
    metrics = METRICS in names and os.path.getsize(metrics_path(folder)) > 0
    snapshots = snapshot_files(names)
    if not metrics and not snapshots:
        return
    held = [METRICS] if metrics else []
    held += [f"{len(snapshots)} snapshot file(s)"] if snapshots else []
    states = sorted((int(found.group(1)), name) for name in names if (found := STATE_NAME.fullmatch(name)))
    newest = os.path.join(folder, states[-1][1]) if states else None
    if from_python:
        resume = f"continue it with solver.restore('{newest}'), " if newest else ""
        elsewhere = "give the solver another snapshot_prefix"
    else:
        resume = f"continue it with --resume {newest}, " if newest else ""
        elsewhere = "train into another folder with --out DIR"
    raise NetspecError(f"{folder} already holds a run ({', '.join(held)}); {resume}{elsewhere}, or move it away")


@contextlib.contextmanager
def locked(folder: str):
    """Hold the run folder's lock while the block runs; NetspecError naming the holder's pid if another has it.

    A folder the lock created is removed again when the run wrote nothing into it.
    """
    created = not os.path.isdir(folder)
    lock = os.path.join(folder, LOCK)
    try:
        os.makedirs(folder, exist_ok=True)  # (the folder the user named may be a link; nothing inside it may)
        handle = open_for_writing(lock, "a+")
    except OSError as exc:
        raise NetspecError(f"{folder}: cannot use it as the run folder: {exc.strerror}") from None
    try:
        if os.fstat(handle.fileno()).st_nlink != 1:  # (another folder's lock too: a stop there would stop this run)
            raise NetspecError(f"{lock} has other names (a hard link to another file): remove it, or train into "
                               "another folder with --out DIR")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            launched = any(name in os.environ for name in MPI_RANK_VARIABLES)
            raise NetspecError(f"{folder} is in use by another training (pid {holder}); " + (
                "started by mpirun? Its ranks train one run together with netspec train --distributed" if launched
                else "wait for it to end, or train into another folder with --out DIR")) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        handle.close()  # closing releases the lock
        if created and os.listdir(folder) == [LOCK]:
            os.remove(lock)
            os.rmdir(folder)


def lock_holder(folder: str) -> int | None:
    """The pid of the training holding ``folder``'s lock, or None when none does; the lock is never taken.

    Linux's table of locks names the process holding it.  Without that table
    (other systems) the pid the lock file records counts while such a process exists.  Only the folder's own
    lock counts: a symbolic link, a file of other names too (a hard link) or anything but a regular file there
    names no holder (the process holding what a link points to is no training of this folder).  Before
    signalling it, ask :func:`is_training`.
    """
    lock = os.path.join(folder, LOCK)
    try:
        info = os.lstat(lock)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        return None
    try:
        with open(PROC_LOCKS, encoding="ascii") as handle:
            table = handle.read()
    except FileNotFoundError:
        return _recorded_holder(lock)
    except OSError:
        return None
    # a line reads "1: FLOCK  ADVISORY  WRITE <pid> <major>:<minor>:<inode> 0 EOF"; a waiting one has "->"
    place = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        if "FLOCK" in fields and "->" not in fields and place in fields:
            pid = fields[fields.index(place) - 1]
            return int(pid) if pid.isdigit() and int(pid) > 0 else _recorded_holder(lock)
    return None


def is_training(pid: int) -> bool:
    """Whether process ``pid`` runs ``netspec train`` (its command line, where Linux shows it; True elsewhere)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            words = handle.read().split(b"\0")
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")  # (gone; or no /proc, so nothing to check against)
    except OSError:
        return False
    return b"train" in words and any(word == b"netspec" or word.endswith(b"/netspec") for word in words)


def loop_started(folder: str) -> bool:
    """Whether the training holding ``folder``'s lock has opened metrics.jsonl since taking it: it is in its loop,
    where SIGHUP and SIGINT ask for a snapshot or a stop (before, SIGHUP would end the process)."""
    try:
        return os.stat(metrics_path(folder)).st_mtime_ns >= os.stat(os.path.join(folder, LOCK)).st_mtime_ns
    except OSError:
        return False


def _recorded_holder(lock: str) -> int | None:
    """The pid a lock file records, while a process of that pid exists."""
    try:
        with open(lock, encoding="utf-8") as handle:
            recorded = handle.read().strip()
    except OSError:
        return None
    return int(recorded) if recorded.isdigit() and _running(int(recorded)) else None


def remove_leftovers(folder: str) -> list[str]:
    """Delete the temporary files a killed process left in ``folder`` (call it holding the lock); their names.

    A temporary file whose writer is still running (another command writing
    into the same folder) is left alone.
    """
    names = os.listdir(folder) if os.path.isdir(folder) else []
    left = [name for name in names if (found := TEMPORARY_NAME.fullmatch(name)) and not _running(int(found[1]))]
    for name in left:
        os.remove(os.path.join(folder, name))
    return left


def _running(pid: int) -> bool:
    """Whether a process ``pid`` exists."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process, or a number no pid can be
        return False
    except PermissionError:  # another user's
        return True
    return True


# ---- how a run ended ---------------------------------------------------------------------------
def write_outcome(folder: str, state: str, message: str) -> None:
    """Record how the training in ``folder`` ended: ``state`` is one of OUTCOMES.  On a disk too full to hold it,
    nothing is recorded (the run then reads as ended without saying how) and the error that ended it stands."""
    with contextlib.suppress(OSError):
        write_bytes(os.path.join(folder, OUTCOME), json.dumps({"state": state, "message": message}).encode("utf-8"))


def clear_outcome(folder: str) -> None:
    """Forget how an earlier training in ``folder`` ended (a resumed one is starting)."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(folder, OUTCOME))


def run_state(folder: str) -> tuple[str, str]:
    """``(state, message)`` of the run in ``folder``: ``running`` while a training holds its lock, else the
    recorded outcome, else ``stopped`` (the process ended without saying how: killed)."""
    holder = lock_holder(folder)
    if holder is not None:
        return "running", f"pid {holder}"
    try:
        outcome = json.loads(read_small(os.path.join(folder, OUTCOME), MAX_OUTCOME_BYTES))
    except FileNotFoundError:
        return "stopped", "the training ended without recording how (killed?)"
    except (OSError, ValueError, RecursionError, DataError):  # (a FIFO, a huge file, bad or too deeply nested JSON)
        return "stopped", f"{OUTCOME} cannot be read"
    if not isinstance(outcome, dict) or outcome.get("state") not in OUTCOMES:
        return "stopped", f"{OUTCOME} holds no outcome"
    return outcome["state"], str(outcome.get("message", ""))


# ---- metrics ------------------------------------------------------------------------------------
def open_metrics(folder: str) -> BinaryIO:
    """metrics.jsonl opened for appending (a resumed run adds to its events), its time set to now (see
    :func:`loop_started`)."""
    try:
        os.makedirs(folder, exist_ok=True)
        handle = open_for_writing(metrics_path(folder), "ab", buffering=0)
    except OSError as exc:
        raise NetspecError(f"{folder}: cannot write the run's metrics: {exc.strerror}") from None
    os.utime(handle.fileno())
    return handle


def write_event(handle: BinaryIO, event: dict) -> None:
    """Append one event as a JSON line (non-finite floats as strings) to a file :func:`open_metrics` opened, in one
    write: one that fails (a full disk) leaves no part of the line behind and is a NetspecError naming the file."""
    clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in event.items()}
    line = (json.dumps(clean) + "\n").encode("utf-8")
    end = os.lseek(handle.fileno(), 0, os.SEEK_END)
    try:
        if handle.write(line) != len(line):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError as exc:
        os.ftruncate(handle.fileno(), end)
        raise NetspecError(f"{handle.name}: cannot add the event of iteration {event.get('iter')}: {exc.strerror}; "
                           "the file keeps the events before it. Training stopped") from None


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The events of a metrics.jsonl, one per (phase, test net, iteration), sorted by iteration.

    A resumed run appends to the file; where it repeats an iteration, its
    later event wins.  A run that neither displayed nor tested has none.  A
    line that is not a JSON event is a NetspecError naming the file and line.
    """
    path = os.fspath(path)
    latest: dict[tuple, dict] = {}
    try:
        with open(path, "rb") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except (ValueError, RecursionError) as exc:  # (not UTF-8, not JSON, nested or numbers too long)
                    reason = getattr(exc, "msg", None) or ("nested too deeply" if isinstance(exc, RecursionError)
                                                            else one_line(exc))
                    raise NetspecError(f"{path}:{number}: not a JSON line ({reason})") from None
                if not isinstance(event, dict) or not isinstance(event.get("iter"), int) or "phase" not in event:
                    raise NetspecError(f"{path}:{number}: not a training event (needs 'iter' and 'phase')")
                latest[(event["phase"], event.get("test_net", 0), event["iter"])] = event
    except OSError as exc:
        raise NetspecError(f"{path}: cannot read metrics: {exc.strerror}") from None
    return sorted(latest.values(), key=lambda e: e["iter"])


def truncate_metrics(folder: str, iteration: int, retest: bool) -> list[dict]:
    """Drop from metrics.jsonl the events a run resumed at ``iteration`` writes again; return those it keeps
    from ``iteration`` on.

    Those are its training events from ``iteration`` on and its tests after
    it; the test at ``iteration`` too when the resumed run ``retest``s there.
    When it does not, that test stays, and is what this returns.
    """
    path = metrics_path(folder)
    if not os.path.isfile(path):
        return []
    with open(path, "rb") as handle:
        lines = handle.readlines()
    kept = [line for line in lines if not line.strip() or _kept(_event(line), iteration, retest)]
    if len(kept) != len(lines):
        with atomic_open(path, "wb") as handle:
            handle.writelines(kept)
    return [event for event in map(_event, kept) if event is not None and event["iter"] >= iteration]


def _event(line: bytes) -> dict | None:
    """The event of a metrics.jsonl line, or None when it is none."""
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):  # (not UTF-8, not JSON, nested or numbers too long)
        return None
    return event if isinstance(event, dict) and isinstance(event.get("iter"), int) else None


def _kept(event: dict | None, iteration: int, retest: bool) -> bool:
    """Whether an event stays in a run resumed at ``iteration`` (a line that is no event stays, for
    :func:`read_metrics` to report)."""
    if event is None:
        return True
    if event.get("phase") == "TEST" and not retest:
        return event["iter"] <= iteration
    return event["iter"] < iteration


def event_outputs(event: dict) -> list[str]:
    """The names of the net outputs an event holds, in its order."""
    return [key for key in event if key not in EVENT_KEYS]


# ---- configs ------------------------------------------------------------------------------------
def write_configs(folder: str, spec) -> None:
    """Save the exact solver text and the text of every net file it names, as read, into ``folder/config``.

    ``sources.json`` there records where they were read from (``netspec zoo publish --run`` uses it).
    """
    config = os.path.join(folder, CONFIG)
    texts = {os.path.basename(spec.file) if spec.file else "solver.yaml": spec.text, SOURCES: ""}
    copies = {}  # each net file read -> its copy's name (train and test nets of one file name kept apart)
    for path, text in spec.net_texts.items():
        name, number = os.path.basename(path), 1
        while name in texts:
            number += 1
            stem, extension = os.path.splitext(os.path.basename(path))
            name = f"{stem}.{number}{extension}"
        texts[name], copies[path] = text, name
    sources = {"solver": os.path.abspath(spec.file) if spec.file else None,
               "train_net": spec.train_net.file if spec.train_net.file in spec.net_texts else None, "copies": copies}
    texts[SOURCES] = json.dumps(sources, indent=1)
    try:
        make_folder(config)
        for name, text in texts.items():
            write_bytes(os.path.join(config, name), text.encode("utf-8"))
    except OSError as exc:
        raise NetspecError(f"{folder}: cannot keep the run's config files: {exc.strerror}") from None


def read_sources(folder: str) -> dict:
    """Where the run read its solver and train net (``config/sources.json``), or {} when it does not say."""
    path = os.path.join(folder, CONFIG, SOURCES)
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def config_copy(folder: str, sources: dict, source: str | None) -> str | None:
    """The run's copy of the config file ``source`` (as ``sources``, :func:`read_sources`, names it), when it
    exists: the name sources.json gives it, else (the solver, older runs) its own name."""
    if not source:
        return None
    copies = sources.get("copies") if isinstance(sources.get("copies"), dict) else {}
    name = copies.get(source) if isinstance(copies.get(source), str) else os.path.basename(source)
    copy = os.path.join(folder, CONFIG, os.path.basename(name))
    return copy if os.path.isfile(copy) else None
