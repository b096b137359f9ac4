"""Scoring a net over its dataset with every record counted once (``test_iter: epoch``, ``netspec test``).

A net's shapes are fixed, its batch size included, so a dataset of N
records read B at a time is scored as N // B full batches and then its last
N % B records through a *tail*: the same net built for a batch of N % B,
sharing the net's weights.  The tail's data layers read nothing: the net's
own data layers make the batch that holds those records (the next one,
which wraps around to the first records) and the tail takes its first rows.

Each output is averaged over what it is a mean of: an Accuracy or a loss
says how many items its value averaged in each batch (the valid labels,
say: ``averaged_over``), any other output counts a batch's rows.  Every
pass starts from the data layers' first batch, and leaves the host's random
generator as it found it, so each pass scores the same records in the same
order.  A net with a layer that writes files (HDF5Output) gets no tail,
which would write the same file: its last batch wraps around, as does that
of a net whose shapes fix the batch size, and :attr:`OnePass.note` says so.

In a distributed run each rank scores its share of the records (every
``size``-th from its ``rank``: what its data layers read) the same way;
:meth:`OnePass.score` gives the share's averages and :attr:`OnePass.weights`
what each averaged over, for the caller to weigh.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy

from netspec.errors import NetspecError


def rank_share(records: int, rank: int, size: int) -> int:
    """How many of ``records`` the data layers of rank ``rank`` of ``size`` read in one pass."""
    return len(range(rank, records, size))


class OnePass:
    """Scores ``net`` over one pass of its data layer's dataset (which must know its size).

    ``build_tail(batch)`` builds the same net with data layers of ``batch``
    rows (called once, when the share does not divide into whole batches).
    Where it cannot (a NetspecError: a net whose shapes fix the batch size,
    such as a Reshape to a given size), the last batch is scored whole,
    wrapping around, and :attr:`note` says so.
    """

    def __init__(self, net, build_tail: Callable[[int], object], rank: int = 0, size: int = 1):
        records = net.record_count()
        if not records:
            raise NetspecError(f"net '{net.name}' ({net.phase}): its data layer cannot tell how many records it "
                               "reads, so a pass over them cannot be scored")
        self.net = net
        self.share = rank_share(records, rank, size)
        self.batches, rest = divmod(self.share, net.batch_size)
        self.start = net.runtime_state()  # the data layers' first batch
        self.fed = [index for index, (layer, node) in enumerate(zip(net.layers, net.nodes))
                    if not node.bottoms and layer.feeds_net]
        names = [name for name in net.outputs if net.blobs[name].count == 1]
        writers = {name: index for index, node in enumerate(net.nodes) for name in node.tops}  # (the last)
        self.outputs = {name: writers[name] for name in names}
        self.weights: dict[str, float] = {}
        self.tail, self.note = None, None
        if rest:
            writing = [layer.name for layer in net.layers if layer.writes_files]
            if writing:
                self._wrap(rest, f"layer '{writing[0]}' writes a file that a copy of the net would write again")
            else:
                self._build_tail(build_tail, rest)

    def _build_tail(self, build_tail, rest: int) -> None:
        """The tail of ``rest`` rows, sharing the weights; where it cannot be built, the last batch wraps."""
        saved = self.net.backend.rng_state()  # (its data layers draw their seeds: other nets' must not change)
        try:
            self.tail = build_tail(rest)
            self.tail.share_trained_layers(self.net)
        except NetspecError as exc:
            if self.tail is not None:
                self.tail.close()
                self.tail = None
            self._wrap(rest, f"the net cannot be built for a batch of {rest} ({' '.join(str(exc).split())})")
        finally:
            self.net.backend.set_rng_state(saved)
        if self.tail is not None:
            for index in self.fed:
                self.tail.layers[index].close()  # (fed by the net's data layers: they never read)

    def _wrap(self, rest: int, why: str) -> None:
        """Score the last records in a whole batch, wrapping around; :attr:`note` says ``why``."""
        self.batches += 1
        self.note = f"the last batch wraps around, so {self.net.batch_size - rest:,} records count twice: {why}"

    @property
    def tail_rows(self) -> int:
        """Records the tail scores (0 without one)."""
        return self.tail.batch_size if self.tail is not None else 0

    @property
    def rows(self) -> int:
        """Rows a pass scores: the share, or more where the last batch wraps around (:attr:`note`)."""
        return self.batches * self.net.batch_size + self.tail_rows

    @property
    def passes(self) -> int:
        """Forward passes a pass over the share takes (the tail's included)."""
        return self.batches + (self.tail is not None)

    def describe(self) -> str:
        """What a pass scores, as a user would say it: ``360 records, each once: 3 batches of 100 and one of
        60``."""
        batches = f"{self.batches} batch{'es' if self.batches != 1 else ''} of {self.net.batch_size}"
        if self.note is not None:
            return f"{self.share:,} records in {batches}"
        if self.tail is None:
            return f"{self.share:,} records, each once: {batches}"
        return f"{self.share:,} records, each once: " + (f"{batches} and one of {self.tail_rows}" if self.batches
                                                          else f"one batch of {self.tail_rows}")

    def score(self, after_each: Callable[[object], None] | None = None) -> dict[str, float]:
        """Score one pass; return each one-element output averaged over what it is a mean of (module
        docstring), and keep those counts in :attr:`weights`.

        ``after_each(net)``, when given, is called after each forward pass with the net that ran it (the tail
        for the last records), for a report reading more than the outputs.
        """
        net = self.net
        xp = net.backend.xp
        totals = xp.zeros(len(self.outputs), dtype=numpy.float64)
        counts = xp.zeros(len(self.outputs), dtype=numpy.float64)
        saved = net.backend.rng_state()
        net.restore_runtime_state(self.start)
        for _ in range(self.batches):
            net.device_forward()
            self._add(net, totals, counts)
            if after_each is not None:
                after_each(net)
        if self.tail is not None:
            self._forward_tail()
            self._add(self.tail, totals, counts)
            if after_each is not None:
                after_each(self.tail)
        net.backend.set_rng_state(saved)
        totals, counts = net.backend.to_host(xp.stack([totals, counts])).tolist()
        for backend in {id(each.backend): each.backend for each in (net, self.tail) if each is not None}.values():
            backend.raise_checks()
        self.weights = dict(zip(self.outputs, counts))
        return {name: total / count if count else 0.0 for name, total, count in zip(self.outputs, totals, counts)}

    def _add(self, net, totals, counts) -> None:
        """Add ``net``'s outputs of its last pass, each times what it averaged over, and those counts."""
        xp = net.backend.xp
        for position, (name, index) in enumerate(self.outputs.items()):
            over = net.layers[index].averaged_over
            weight = xp.asarray(net.batch_size if over is None else over, dtype=numpy.float64)
            totals[position] += net.blobs[name].data.reshape(-1)[0].astype(numpy.float64) * weight
            counts[position] += weight

    def _forward_tail(self) -> None:
        """Run the tail on the first rows of the batch the net's data layers make next."""
        net, tail = self.net, self.tail
        for index in self.fed:
            net.forward_layer(index)
            for mine, theirs in zip(tail.top_blobs[index], net.top_blobs[index]):
                mine.data[...] = theirs.data[:len(mine.data)] if mine.shape != theirs.shape else theirs.data
        for index in range(len(tail.layers)):
            if index not in self.fed:
                tail.forward_layer(index)

    def close(self) -> None:
        """Close the tail (the net is the caller's)."""
        if self.tail is not None:
            self.tail.close()
