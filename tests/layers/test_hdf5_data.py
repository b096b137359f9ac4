"""HDF5Data: Caffe's list-file form, batching across files, cycling, shuffling, and bad files."""

from __future__ import annotations

from types import SimpleNamespace

import h5py
import numpy as np
import pytest

import netspec
from netspec import ConfigError, DataError
from netspec.engine.backend import Backend
from netspec.engine.net import Net, compile_net
from netspec.engine.registry import layer_schemas
from netspec.spec.net_spec import parse_net


def write(path, rows, start=0, names=("data", "label")):
    with h5py.File(path, "w") as handle:
        handle[names[0]] = np.arange(start, start + rows, dtype=np.float32).reshape(rows, 1).repeat(2, 1)
        handle[names[1]] = np.arange(start, start + rows, dtype=np.float32)


def write_uneven(path):
    with h5py.File(path, "w") as handle:
        handle["data"] = np.zeros((3, 2), dtype=np.float32)
        handle["label"] = np.zeros(2, dtype=np.float32)


def net_text(source, batch=4, shuffle=False):
    return (f"layers:\n  - {{name: d, type: HDF5Data, top: [data, label], hdf5_data_param: "
            f"{{source: {source}, batch_size: {batch}, shuffle: {str(shuffle).lower()}}}}}\n")


@pytest.fixture
def two_files(tmp_path):
    write(tmp_path / "a.h5", 3, 0)
    write(tmp_path / "b.h5", 2, 100)
    (tmp_path / "list.txt").write_text("a.h5\n# comment\nb.h5\n")
    return tmp_path


def labels_seen(net, batches):
    seen = []
    for _ in range(batches):
        net.forward()
        seen.append(net.blobs["label"].data.tolist())
    return seen


def test_batches_cross_files_and_cycle(two_files):
    net_file = two_files / "net.yaml"
    net_file.write_text(net_text("list.txt"))
    net = netspec.load_net(str(net_file))
    assert net.blobs["data"].shape == (4, 2)
    assert labels_seen(net, 3) == [[0, 1, 2, 100], [101, 0, 1, 2], [100, 101, 0, 1]]
    np.testing.assert_array_equal(net.blobs["data"].data[:, 0], [100, 101, 0, 1])


@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_take_turns_row_by_row_across_files(two_files, shuffle):
    """Two ranks of batch 2 read, together, exactly what one reader of batch 4 reads."""
    net_file = two_files / "net.yaml"

    def reader(batch, rank=0, ranks=1):
        net_file.write_text(net_text("list.txt", batch=batch, shuffle=shuffle))
        graph = compile_net(parse_net(str(net_file), layer_schemas()))
        return Net(graph, backend=Backend("cpu", 5, comm=SimpleNamespace(rank=rank, size=ranks)))

    whole = labels_seen(reader(4), 5)
    shares = [labels_seen(reader(2, rank, 2), 5) for rank in range(2)]
    for batch, first, second in zip(whole, *shares):
        assert batch[0::2] == first and batch[1::2] == second


def test_shuffle_is_a_reproducible_permutation(two_files):
    net_file = two_files / "net.yaml"
    net_file.write_text(net_text("list.txt", batch=5, shuffle=True))
    first = labels_seen(netspec.load_net(str(net_file), seed=3), 2)
    again = labels_seen(netspec.load_net(str(net_file), seed=3), 2)
    assert first == again
    assert sorted(first[0]) == [0, 1, 2, 100, 101]


@pytest.mark.parametrize("setup, message", [
    (lambda d: None, "cannot read the HDF5 file list"),
    (lambda d: (d / "list.txt").write_text("missing.h5\n"), "missing.h5: cannot open HDF5 file"),
    (lambda d: ((d / "list.txt").write_text("a.h5\n"), write(d / "a.h5", 3, names=("data", "labels"))),
     "no dataset 'label'; did you mean 'labels'?"),
    (lambda d: ((d / "list.txt").write_text("a.h5\n"), (d / "a.h5").write_bytes(b"garbage")),
     "a.h5: cannot open HDF5 file"),
    (lambda d: (d / "list.txt").write_text(""), "names no file"),
    (lambda d: ((d / "list.txt").write_text("a.h5\n"), write_uneven(d / "a.h5")),
     "a.h5: datasets have different numbers of rows (data: 3, label: 2)"),
])
def test_bad_sources_are_config_errors_at_the_layer(tmp_path, setup, message):
    setup(tmp_path)
    net_file = tmp_path / "net.yaml"
    net_file.write_text(net_text("list.txt"))
    with pytest.raises(ConfigError) as info:
        netspec.load_net(str(net_file))
    text = str(info.value)
    assert text.startswith(f"{net_file}:2: layer 'd': hdf5_data_param.source:")
    assert message in text


def test_a_later_file_with_other_row_shapes_is_a_data_error(tmp_path):
    write(tmp_path / "a.h5", 2)
    with h5py.File(tmp_path / "b.h5", "w") as handle:
        handle["data"] = np.zeros((2, 3), np.float32)
        handle["label"] = np.zeros(2, np.float32)
    (tmp_path / "list.txt").write_text("a.h5\nb.h5\n")
    (tmp_path / "net.yaml").write_text(net_text("list.txt", batch=2))
    net = netspec.load_net(str(tmp_path / "net.yaml"))
    net.forward()
    with pytest.raises(DataError, match=r"b.h5: dataset 'data' has rows of shape \(3,\)"):
        net.forward()


def test_saved_position_continues_the_same_batches_and_checks_the_files(two_files):
    net_file = two_files / "net.yaml"
    net_file.write_text(net_text("list.txt", batch=2, shuffle=True))
    net = netspec.load_net(str(net_file), seed=4)
    labels_seen(net, 2)
    state = net.runtime_state()
    rng_state = net.backend.rng_state()
    expected = labels_seen(net, 4)
    other = netspec.load_net(str(net_file), seed=9)
    other.restore_runtime_state(state)
    other.backend.set_rng_state(rng_state)
    assert labels_seen(other, 4) == expected
    current = "a.h5" if len(state["d"]["row_order"]) == 3 else "b.h5"
    write(two_files / current, 7)
    with pytest.raises(DataError, match="the saved position is for a file of"):
        netspec.load_net(str(net_file), seed=4).restore_runtime_state(state)
