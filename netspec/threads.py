"""Which math libraries run where, and how many threads each may use, decided before NumPy loads.

oneDNN (``libdnnl.so.3``, from the ``onednn-cpu-gomp`` package, in the
environment's ``lib`` folder) runs convolutions on an OpenMP pool of every
core.  OpenBLAS, under NumPy, keeps its own pool; when both spin on the same
cores each slows the other down several times, so while oneDNN is in use
OpenBLAS gets one thread (:func:`size_pools`, called by ``import netspec``
before anything imports NumPy).  ``NETSPEC_ONEDNN=0`` turns oneDNN off, and
a value the user set for ``OPENBLAS_NUM_THREADS`` is kept.
"""

from __future__ import annotations

import os
import sys

ONEDNN_SWITCH = "NETSPEC_ONEDNN"
ONEDNN_LIBRARY = "libdnnl.so.3"


def onednn_path() -> str:
    """Where ``onednn-cpu-gomp`` installs oneDNN's library."""
    return os.path.join(sys.prefix, "lib", ONEDNN_LIBRARY)


def onednn_wanted() -> bool:
    """Whether oneDNN will run: it is installed and ``NETSPEC_ONEDNN`` is not 0."""
    return os.environ.get(ONEDNN_SWITCH, "1") != "0" and os.path.isfile(onednn_path())


def size_pools() -> None:
    """Give OpenBLAS one thread while oneDNN takes the cores (only before NumPy has loaded OpenBLAS)."""
    if onednn_wanted() and "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
