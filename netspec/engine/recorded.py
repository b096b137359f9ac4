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

Only the layers that say their forward pass makes the same oneDNN calls at
every pass and nothing else that counts (:attr:`netspec.engine.layer.Layer.records`:
any work of their own is on constants, and gives the same arrays every time)
are recorded; the others (a data
layer reading the next batch, a NumPy layer, a loss) run as usual between the
recorded stretches, which they split.  After each stretch is made again, the
blobs held in blocked layouts are left as the recorded pass left them (which
copy, plain or blocked, is the newer), so a read of a blob's ``data`` after a
pass sees its values.  A blob or a parameter given a new array (by the user
between passes, or by a layer that does not record, within one), or a
parameter made writable again, makes the net split its layers afresh and
record again after a pass layer by layer; a stretch that made any call other
than pointing memory at arrays and running primitives (a primitive created)
stands for no other pass, and the net then runs layer by layer from then on.
"""

from __future__ import annotations

from netspec.engine.onednn import HeldArray, Library, Recording


class RecordedPass:
    """The forward passes of a frozen ``net`` on the oneDNN library ``lib``: made layer by layer once, the
    second recorded, then from the recordings."""

    def __init__(self, net, lib: Library):
        self.net, self.lib = net, lib
        self._restart()

    def _restart(self) -> None:
        """Split the layers into stretches as the net stands now, to record after a pass layer by layer."""
        self.arrays = self._arrays()
        runs: list[tuple[bool, list[int]]] = []  # (recorded, the indices of the layers it runs)
        for index, layer in enumerate(self.net.layers):
            if index in self.net.absorbed_by:
                continue
            if runs and runs[-1][0] == layer.records:
                runs[-1][1].append(index)
            else:
                runs.append((layer.records, [index]))
        self.runs = runs
        self.recordings: list[Recording | None] | None = None
        self.latest: list[list[tuple[HeldArray, str]]] = []  # per recorded run, which copy of each held blob
        # was the newer after it (none for the others)
        self.passes = 0  # passes made layer by layer since the layers were split
        self.recordable = True  # False once a recorded stretch made other calls than a replay makes

    def _arrays(self) -> list[tuple[object, object, object, bool]]:
        """Each blob's and each layer parameter's (blob, data array, held copy, whether the array is writable)."""
        blobs = [*self.net.blobs.values(), *(blob for layer in self.net.layers for blob in layer.blobs)]
        arrays = [blob.values.stored() for blob in blobs]
        return [(blob, array, blob.held_data, array.flags.writeable) for blob, array in zip(blobs, arrays)]

    def _changed(self) -> bool:
        """Whether a blob or a parameter has another array than when the layers were split into stretches, or its
        array was made writable or read-only (which changes the layers that record)."""
        return any(blob.values.stored() is not array or blob.held_data is not held or array.flags.writeable != writable
                   for blob, array, held, writable in self.arrays)

    def forward(self) -> None:
        """One forward pass of every layer the net runs."""
        if self._changed():
            self._restart()
        if self.recordings is not None:
            self._replay()
            return
        self.passes += 1
        if self.passes == 1 or not self.recordable:  # (the first pass makes the constants' blocked copies)
            for _, indices in self.runs:
                self._run(indices)
            return
        recordings, self.latest = [], []
        for recorded, indices in self.runs:
            if recorded:
                recordings.append(self._recorded(indices))
                self.latest.append(self._held_latest())
            else:
                self._run(indices)
                recordings.append(None)
                self.latest.append([])
        self.recordable = all(recording is None or recording.complete for recording in recordings)
        if self.recordable:
            self.recordings = recordings

    def _replay(self) -> None:
        runs = self.runs
        for number, ((recorded, indices), recording, latest) in enumerate(zip(runs, self.recordings, self.latest)):
            if not recorded:
                self._run(indices)
                continue
            if number and self._changed():  # (a layer before it gave a blob a new array: the rest layer by layer)
                self._restart()
                self.passes = 1
                for _, rest in runs[number:]:
                    self._run(rest)
                return
            recording.replay()
            for held, which in latest:
                held.latest = which

    def _run(self, indices: list[int]) -> None:
        for index in indices:
            self.net.forward_layer(index)

    def _recorded(self, indices: list[int]) -> Recording:
        """Run the layers ``indices`` with the library recording their calls."""
        recording = self.lib.record()
        try:
            self._run(indices)
        finally:
            self.lib.recording = None
        return recording

    def _held_latest(self) -> list[tuple[HeldArray, str]]:
        """Which copy of each blob held in a blocked layout is the newer, now."""
        return [(held, held.latest) for blob in self.net.blobs.values()
                for held in (blob.held_data, blob.held_diff) if isinstance(held, HeldArray)]
