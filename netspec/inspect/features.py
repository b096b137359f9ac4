"""Features: the values of chosen blobs for every record a net reads, as rows of an HDF5 file.

``netspec extract-features`` asks; it is Caffe's ``tools/extract_features``,
writing one HDF5 file instead of a database per blob.  The net runs forward
over its data layer's dataset with trained weights, and after each pass
every chosen blob gives one row per record of the batch: the file holds a
dataset per blob, named after it, of shape ``(records, *the blob's shape
without its first axis)`` in float32, and a ``label`` dataset (the data
layer's second top) when the data layer has one, rows in the order the data
layer reads its records.

One pass over the dataset is ``ceil(records / batch)`` forward passes: the
last batch wraps around to the first records, and its rows past the last
record are dropped, so each record gives one row.  A number of batches
given instead (``iterations``) keeps every row of each, records read twice
included.  A blob changed in place (a ReLU on a convolution's top) holds its
last value, as in Caffe.

A blob is one the file names (a layer's top); its first axis must be the
batch.  The file is written in chunks (memory stays flat however many records
there are) under a temporary name beside it, and renamed into place once
complete: never through a symbolic link, and a failed write (a full disk)
leaves no partial file.
"""

from __future__ import annotations

import os

import numpy

from netspec.data.hdf5 import ArrayWriter
from netspec.engine.net import Net
from netspec.errors import DataError, NetspecError, did_you_mean

LABEL = "label"  # the dataset that holds the data layer's labels
LISTED = 20  # blob names an error lists at most


def blob_list(text: str) -> list[str]:
    """The blob names of ``text``, separated by commas (``conv1,ip2``), in order, each once."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise NetspecError(f"{text!r}: expected blob names separated by commas, e.g. conv1,ip2")
    return list(dict.fromkeys(names))


def named_blobs(net: Net) -> list[str]:
    """The blobs of ``net`` that hold a row per record (their first axis is the batch), in the order the net makes
    them; those of the Split layers the compiler inserts, which read their bottom, are left out."""
    return [name for name, blob in net.blobs.items()
            if name not in net.split_aliases and blob.shape and blob.shape[0] == net.batch_size]


def check_blobs(net: Net, names: list[str]) -> None:
    """NetspecError, in one line, unless every name in ``names`` is a blob of ``net`` whose first axis is the batch,
    and the names make distinct HDF5 datasets (a name is no folder of another: ``a`` and ``a/b``)."""
    where = f"net '{net.name}' ({net.phase})"
    source = net.data_layer()
    if source is None or source.type == "Input":
        raise NetspecError(f"{where} has no data layer to read records from"
                           + (" (an Input holds what a program hands it)" if source is not None else ""))
    for name in names:
        blob = net.blobs.get(name)
        if blob is None:
            listed = named_blobs(net)
            shown = ", ".join(listed[:LISTED]) + (f" and {len(listed) - LISTED} more" if len(listed) > LISTED else "")
            raise NetspecError(f"{where} has no blob '{name}'{did_you_mean(name, net.blobs)} (its blobs with a row "
                               f"per record: {shown or 'none'})")
        if not blob.shape:
            raise NetspecError(f"{where}: blob '{name}' holds one value a batch (a scalar), not a row per record")
        if blob.shape[0] != net.batch_size:
            raise NetspecError(f"{where}: blob '{name}' has shape {shape_text(blob.shape)}, whose first axis is not "
                               f"the batch of {net.batch_size}, so it holds no row per record")
    for name in names:
        inside = next((other for other in names if other.startswith(name.rstrip("/") + "/")), None)
        if inside is not None:
            raise NetspecError(f"blobs '{name}' and '{inside}' cannot both be HDF5 datasets (the second would be "
                               f"inside the first); extract them into two files")


def label_blob(net: Net, names: list[str]) -> str | None:
    """The blob written as the ``label`` dataset: the data layer's second top, where it has one with a row per
    record and no chosen blob is called ``label`` (or ``label/...``) but it; else None."""
    source = net.data_layer()
    tops = source.spec.tops if source is not None else []
    if len(tops) < 2 or tops[1] in names:
        return None
    shape = net.blobs[tops[1]].shape
    if not shape or shape[0] != net.batch_size:
        return None
    if any(name == LABEL or name.startswith(LABEL + "/") for name in names):
        return None
    return tops[1]


def pass_size(net: Net, iterations: int | None = None) -> tuple[int, int]:
    """``(forward passes, rows kept)``: ``iterations`` batches, every row kept, or where it is None, one pass over
    the data layer's dataset (NetspecError where the data layer cannot tell its size)."""
    if iterations is not None:
        return iterations, iterations * net.batch_size
    records = net.record_count()
    if not records:
        raise NetspecError(f"net '{net.name}' ({net.phase}): its data layer cannot tell how many records it reads; "
                           "give the number of batches (--iterations N)")
    return -(-records // net.batch_size), records


def refuse_existing(out: str, overwrite: bool = False) -> None:
    """DataError when something (a file, a link) is at ``out`` and ``overwrite`` is not given."""
    if os.path.lexists(out) and not overwrite:
        raise DataError(f"{out}: already exists; choose another output or pass --overwrite")


def extract_features(net: Net, names: list[str], out: str, iterations: int | None = None, overwrite: bool = False,
                     advance=None) -> dict[str, tuple[int, ...]]:
    """Write the rows of the blobs ``names`` of ``net`` (weights loaded), and its labels (:func:`label_blob`), to
    the HDF5 file ``out``; return the shape of each dataset written, in order (``label`` last).

    ``iterations`` batches, or one pass over the dataset (:func:`pass_size`).  ``advance(rows)``, when given, is
    called after each batch with the rows it kept (a progress bar).  The net runs from where its data layer is,
    its first batch for a net just built.  Errors are NetspecErrors: a write that fails (a DataError naming
    ``out``) leaves nothing at ``out`` and no temporary file.
    """
    check_blobs(net, names)
    refuse_existing(out, overwrite)
    label = label_blob(net, names)
    taken = {name: name for name in names} | ({LABEL: label} if label is not None else {})
    batches, rows = pass_size(net, iterations)
    backend = net.backend
    writer = ArrayWriter(out, chunk_rows=max(1, min(net.batch_size, rows)))
    try:
        kept = 0
        for _ in range(batches):
            net.device_forward()
            count = min(net.batch_size, rows - kept)
            writer.append({dataset: numpy.asarray(backend.to_host(net.blobs[blob].data[:count]), dtype=numpy.float32)
                           for dataset, blob in taken.items()})
            backend.raise_checks()
            kept += count
            if advance is not None:
                advance(count)
        shapes = {dataset: tuple(writer.datasets[dataset].shape) for dataset in taken}
        writer.finish()
    except BaseException:
        writer.abandon()
        raise
    return shapes


def shape_text(shape: tuple[int, ...]) -> str:
    """A shape as people write it: ``360x8x6x6``."""
    return "x".join(map(str, shape))
