"""Running netspec on hostile input: bounded time and memory, a non-zero exit, one message, no traceback.

Each test in this folder builds its hostile input itself (no binary fixtures)
and runs the ``netspec`` command in a subprocess under an address-space limit
(``RLIMIT_AS``) and a wall-clock timeout, so a bomb fails the test instead of
the machine.
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys

MEMORY_LIMIT = 2 << 30  # bytes of address space; netspec itself needs far less than this
TIME_LIMIT = 120  # seconds; every hostile input here is refused in a few


def run(*args, cwd=None, env=None, timeout: float = TIME_LIMIT, memory: int = MEMORY_LIMIT):
    """``netspec ARGS`` in a subprocess limited to ``memory`` bytes of address space and ``timeout`` seconds."""
    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return subprocess.run([sys.executable, "-m", "netspec", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=environment(env), timeout=timeout, preexec_fn=limit_memory)


def environment(extra: dict | None = None) -> dict:
    """The environment every command here runs in: one thread per math library (results depend on the count)."""
    return {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", **(extra or {})}


def refuses(*args, **kwargs) -> str:
    """Run a command that must be refused: exit status 1..127, one line on stderr, no traceback; that line."""
    result = run(*args, **kwargs)
    assert 0 < result.returncode < 128, (result.returncode, result.stdout, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def files_under(folder) -> set[str]:
    """Every file and folder below ``folder``, as paths relative to it."""
    found = set()
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            found.add(os.path.relpath(os.path.join(root, name), folder))
    return found


@contextlib.contextmanager
def file_size_limit(limit: int):
    """Within the block, no file grows past ``limit`` bytes: a write past it fails with EFBIG, a stand-in for a
    full disk.  The limit holds for the commands run inside (they inherit it) and for this process, which writes
    nothing meanwhile."""
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, before)
