"""Recorded passes: a frozen net's forward passes made again from the oneDNN calls of one of them.

A frozen inference net (:meth:`netspec.engine.net.Net.freeze`) whose layers run
on oneDNN makes the same oneDNN calls at every forward pass: the same
primitives on the same arrays (its blobs' buffers, its constants' blocked
copies, the shared scratch buffers), in the same order.  Only the values in
the input blobs change.  So the net records the calls of its second pass (the
first reorders its constants once) and from then on makes them again as they
were (:class:`netspec.engine.onednn.Recording`), without the Python that chose
them: a pass then costs oneDNN's time alone, and between two primitives
oneDNN's threads have no time to fall asleep.

Only the layers that say their forward pass is nothing but oneDNN calls
(:attr:`netspec.engine.layer.Layer.records`) are recorded; the others (a data
layer reading the next batch, a NumPy layer, a loss) run as usual between the
recorded stretches, which they split.  After each stretch is made again, the
blobs held in blocked layouts are left as the recorded pass left them (which
copy, plain or blocked, is the newer), so a read of a blob's ``data`` after a
pass sees its values.  A blob given a new array since the recording makes the
next pass record again; a stretch that made any call other than pointing
memory at arrays and running primitives (a primitive created) stands for no
other pass, and the net then runs layer by layer from then on.
"""

from __future__ import annotations

from netspec.engine.onednn import HeldArray, Library, Recording


class RecordedPass:
    """The forward passes of a frozen ``net`` on the oneDNN library ``lib``: made layer by layer twice (the
    second recorded), then from the recordings."""

    def __init__(self, net, lib: Library):
        self.net, self.lib = net, lib
        runs: list[tuple[bool, list[int]]] = []  # (recorded, the indices of the layers it runs)
        for index, layer in enumerate(net.layers):
            if index in net.absorbed_by:
                continue
            if runs and runs[-1][0] == layer.records:
                runs[-1][1].append(index)
            else:
                runs.append((layer.records, [index]))
        self.runs = runs
        self.recordings: list[Recording | None] | None = None
        self.passes = 0  # passes made layer by layer
        self.recordable = True  # False once a recorded stretch made other calls than a replay makes
        self.arrays: list[tuple[object, object, object]] = []  # (blob, its data array, its held copy) as recorded
        self.latest: list[list[tuple[HeldArray, str]]] = []  # per run, which copy of each held blob was newer

    def forward(self) -> None:
        """One forward pass of every layer the net runs."""
        if self.recordings is not None and self._unchanged():
            for (recorded, indices), recording, latest in zip(self.runs, self.recordings, self.latest):
                if recorded:
                    recording.replay()
                    for held, which in latest:
                        held.latest = which
                else:
                    self._run(indices)
            return
        self.recordings, self.passes = None, self.passes + 1
        if self.passes == 1 or not self.recordable:  # (the first pass makes the constants' blocked copies)
            for _, indices in self.runs:
                self._run(indices)
            return
        recordings, self.latest = [], []
        for recorded, indices in self.runs:
            if recorded:
                recordings.append(self._recorded(indices))
            else:
                self._run(indices)
                recordings.append(None)
            self.latest.append(self._held_latest())
        self.recordable = all(recording is None or recording.complete for recording in recordings)
        if self.recordable:
            self.recordings = recordings
            self.arrays = [(blob, blob.values.stored(), blob.held_data) for blob in self.net.blobs.values()]

    def _unchanged(self) -> bool:
        """Whether every blob has the arrays it had when the pass was recorded."""
        return all(blob.values.stored() is data and blob.held_data is held for blob, data, held in self.arrays)

    def _run(self, indices: list[int]) -> None:
        for index in indices:
            self.net.forward_layer(index)

    def _recorded(self, indices: list[int]) -> Recording:
        """Run the layers ``indices`` with the library recording their calls."""
        self.lib.recording = recording = Recording()
        try:
            self._run(indices)
        finally:
            self.lib.recording = None
        return recording

    def _held_latest(self) -> list[tuple[HeldArray, str]]:
        """Which copy of each blob held in a blocked layout is the newer, now."""
        return [(held, held.latest) for blob in self.net.blobs.values()
                for held in (blob.held_data, blob.held_diff) if isinstance(held, HeldArray)]
