"""Weight files: round trip, partial loads, mismatches, foreign files, atomic writes."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

import netspec
from netspec import WeightsError

NET = """name: small
layers:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [2, 1, 6, 6]}}}
  - {name: conv, type: Convolution, bottom: data, top: conv,
     convolution_param: {num_output: 2, kernel_size: 3, weight_filler: {type: gaussian}}}
  - {name: bn, type: BatchNorm, bottom: conv, top: conv}
  - {name: ip, type: InnerProduct, bottom: conv, top: ip,
     inner_product_param: {num_output: NUM, weight_filler: {type: xavier}}}
"""


def small(num=3, seed=0):
    return netspec.load_net(NET.replace("NUM", str(num)), phase="TEST", seed=seed)


def test_round_trip_restores_every_blob(tmp_path):
    path = tmp_path / "w.h5"
    source = small(seed=1)
    source.params["bn"][0].data[...] = 5.0
    source.save_weights(path, iteration=42)
    target = small(seed=2)
    report = target.load_weights(path)
    assert report.copied == ["conv", "bn", "ip"] and not report.missing and not report.unused
    for name, blobs in source.params.items():
        for a, b in zip(blobs, target.params[name]):
            np.testing.assert_array_equal(a.data, b.data)
    with h5py.File(path) as handle:
        assert handle.attrs["net_name"] == "small" and handle.attrs["iteration"] == 42
        assert handle.attrs["config_hash"] == source.graph.config_hash
        assert sorted(handle["conv"]) == ["0", "1"]


def test_layer_names_with_slashes_and_percents_round_trip(tmp_path):
    text = NET.replace("NUM", "3").replace("name: conv,", "name: inception_3a/1x1,").replace(
        "name: ip,", "name: 50%/ip,")
    source = netspec.load_net(text, phase="TEST", seed=1)
    source.save_weights(tmp_path / "w.h5")
    with h5py.File(tmp_path / "w.h5") as handle:
        assert sorted(handle) == ["50%25%2Fip", "bn", "inception_3a%2F1x1"]
    target = netspec.load_net(text, phase="TEST", seed=2)
    assert target.load_weights(tmp_path / "w.h5").copied == ["inception_3a/1x1", "bn", "50%/ip"]
    np.testing.assert_array_equal(target.params["50%/ip"][0].data, source.params["50%/ip"][0].data)


def test_shape_mismatch_names_file_layer_and_blob(tmp_path):
    path = tmp_path / "w.h5"
    small(num=3).save_weights(path)
    target = small(num=4)
    before = target.params["conv"][0].data.copy()
    with pytest.raises(WeightsError) as info:
        target.load_weights(path)
    assert str(info.value) == (f"{path}: layer 'ip' blob 0 has shape (3, 32) in the file but (4, 32) in the net; "
                               "layer 'ip' blob 1 has shape (3,) in the file but (4,) in the net")
    np.testing.assert_array_equal(target.params["conv"][0].data, before)


def test_weights_of_another_net_are_refused(tmp_path):
    path = tmp_path / "other.h5"
    netspec.load_net("name: other\nlayers:\n  - {name: d, type: Input, top: d, input_param: {shape: {dim: [1, 3]}}}\n"
                     "  - {name: fc, type: InnerProduct, bottom: d, top: fc, inner_product_param: {num_output: 2}}\n"
                     ).save_weights(path)
    with pytest.raises(WeightsError, match="weights are of net 'other' and share no layer with net 'small'"):
        small().load_weights(path)


def test_missing_and_foreign_files(tmp_path):
    with pytest.raises(WeightsError, match="cannot read weights file"):
        small().load_weights(tmp_path / "absent.h5")
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not hdf5 at all")
    with pytest.raises(WeightsError, match="cannot read weights file"):
        small().load_weights(junk)
    with h5py.File(tmp_path / "plain.h5", "w") as handle:
        handle["x"] = np.zeros(3)
    with pytest.raises(WeightsError, match="not a netspec weights file"):
        small().load_weights(tmp_path / "plain.h5")


def test_partial_file_reports_missing_layers(tmp_path):
    path = tmp_path / "w.h5"
    small().save_weights(path)
    with h5py.File(path, "a") as handle:
        del handle["ip"]
    report = small().load_weights(path)
    assert report.missing == ["ip"] and report.copied == ["conv", "bn"]


def test_save_is_atomic_and_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "w.h5"
    net = small()
    net.save_weights(path)
    good = path.read_bytes()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(h5py.Group, "create_dataset", broken)
    with pytest.raises(OSError):
        net.save_weights(path)
    assert path.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["w.h5"]
