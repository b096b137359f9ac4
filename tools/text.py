"""``netspec convert text``: a text as windows of character ids, for character-level language models.

Each record is a window of ``length`` characters (``data``), the characters
that follow each of them (``label``: the window shifted by one) and Caffe's
sequence-continuation flags (``cont``: 0 at a window's first step, 1 after),
so an RNN or LSTM starts every window from a zero state.  Character ids index
the sorted distinct characters of the text, written to ``vocab.json``.  The
last ``test_fraction`` of the text is the test split, never seen in training.

The default text ships with Python: the help topics ``help()`` shows
(``pydoc_data.topics``, about 460,000 characters of English and code).
"""

from __future__ import annotations

import json

import numpy

from netspec.data.files import regular_file
from netspec.data.hdf5 import write_splits
from netspec.errors import DataError

MAX_TEXT_BYTES = 1 << 28  # 256 MiB: each character takes 12 bytes while it is numbered


def python_help_text() -> str:
    """Python's help topics, in a fixed order."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise DataError("this Python ships without pydoc_data (its help topics): give a text with --source") from None
    return "".join(topics[name] for name in sorted(topics))


def read_text(path: str) -> str:
    """The UTF-8 text of the file ``path``; DataError naming it otherwise."""
    regular_file(path, MAX_TEXT_BYTES)
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror}") from None


def windows(ids: numpy.ndarray, length: int) -> dict[str, numpy.ndarray]:
    """Consecutive, non-overlapping windows of ``ids`` with their next characters and continuation flags."""
    count = (len(ids) - 1) // length
    data = ids[:count * length].reshape(count, length)
    label = ids[1:count * length + 1].reshape(count, length)
    cont = numpy.ones((count, length), numpy.float32)
    cont[:, 0] = 0
    return {"data": data.astype(numpy.float32), "cont": cont, "label": label.astype(numpy.float32)}


def convert_text(out_dir: str, source: str | None = None, length: int = 64,
                 test_fraction: float = 0.1) -> dict[str, int]:
    """Write train.h5/test.h5 (datasets ``data``, ``cont``, ``label``), their list files and vocab.json.

    Returns the number of windows per split and the vocabulary size (``vocab``).
    """
    text = python_help_text() if source is None else read_text(source)
    code_points = numpy.frombuffer(text.encode("utf-32-le"), numpy.uint32)
    distinct, ids = numpy.unique(code_points, return_inverse=True)
    vocabulary = [chr(code) for code in distinct]
    split_at = int(len(ids) * (1 - test_fraction))
    train, test = windows(ids[:split_at], length), windows(ids[split_at:], length)
    name = source or "Python's help text"
    for split_name, split in (("training", train), ("test", test)):
        if not len(split["data"]):
            raise DataError(f"{name}: {len(text)} characters leave no {split_name} window of {length}")
    counts = write_splits(out_dir, {"train": train, "test": test},
                          files={"vocab.json": json.dumps(vocabulary, ensure_ascii=False).encode("utf-8")})
    return {**counts, "vocab": len(vocabulary)}
