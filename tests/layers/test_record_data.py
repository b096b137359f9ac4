"""transform_param and the Data layer: forward against a naive reference, order, prefetch, resume, errors."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from test_records import images, write_dataset

import netspec
from netspec.data.transform import Transformer, TransformParams
from netspec.errors import ConfigError, DataError, ParamError


def naive_transform(image, top, left, mirror, crop, mean, scale):
    """Caffe's DataTransformer loop, written out pixel by pixel."""
    channels, height, width = image.shape
    size_h, size_w = (crop, crop) if crop else (height, width)
    out = np.zeros((channels, size_h, size_w))
    for c in range(channels):
        for h in range(size_h):
            for w in range(size_w):
                target = size_w - 1 - w if mirror else w
                value = float(image[c, top + h, left + w])
                if mean is not None:
                    value -= mean[c, top + h, left + w] if mean.ndim == 3 and mean.shape[1] > 1 else mean[c, 0, 0]
                out[c, h, target] = value * scale
    return out


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
@pytest.mark.parametrize("mean_kind", ["none", "file", "value", "one_value"])
def test_transform_matches_the_naive_loop(tmp_path, phase, mean_kind):
    mean, params = None, {"scale": 0.5, "crop_size": 4, "mirror": True}
    if mean_kind == "file":
        mean = np.random.default_rng(1).uniform(0, 255, (3, 7, 6))
        np.save(tmp_path / "mean.npy", mean)
        params["mean_file"] = str(tmp_path / "mean.npy")
    elif mean_kind == "value":
        params["mean_value"] = [10.0, 20.0, 30.0]
        mean = np.array([10.0, 20.0, 30.0]).reshape(3, 1, 1)
    elif mean_kind == "one_value":
        params["mean_value"] = [100.0]
        mean = np.full((3, 1, 1), 100.0)
    transformer = Transformer(TransformParams(**params), phase, (3, 7, 6))
    choices = transformer.draw(np.random.default_rng(5), 40)
    if phase == "TEST":
        assert (choices[:, :2] == [1, 1]).all()
    else:
        assert set(choices[:, 0]) == {0, 1, 2, 3} and set(choices[:, 1]) == {0, 1, 2}
    assert set(choices[:, 2]) == {0, 1}
    records = images(40, (3, 7, 6), seed=3)
    out = np.empty((40, 3, 4, 4))
    transformer.apply(records.astype(np.float64), choices, out)
    for record, choice, got in zip(records, choices, out):
        np.testing.assert_allclose(got, naive_transform(record, *choice[:3].astype(int), 4, mean, 0.5), rtol=1e-12)


def test_force_gray_and_force_color():
    rgb = images(1, (3, 2, 2))[0]
    gray = Transformer(TransformParams(force_gray=True), "TEST", (3, 2, 2))
    np.testing.assert_allclose(gray.prepare(rgb)[0], 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2])
    colour = Transformer(TransformParams(force_color=True), "TEST", (1, 2, 2))
    assert all(np.array_equal(channel, rgb[0]) for channel in colour.prepare(rgb[:1]))


def test_bgr_channel_order_swaps_colour_records_and_leaves_grey_ones():
    rgb = images(1, (3, 2, 2))[0]
    bgr = Transformer(TransformParams(channel_order="BGR"), "TEST", (3, 2, 2))
    np.testing.assert_array_equal(bgr.prepare(rgb), rgb[::-1])
    np.testing.assert_array_equal(bgr.prepare(rgb[:1]), rgb[:1])
    coloured = Transformer(TransformParams(channel_order="BGR", force_color=True), "TEST", (1, 2, 2))
    np.testing.assert_array_equal(coloured.prepare(rgb[:1]), np.repeat(rgb[:1], 3, axis=0))


def test_bad_transforms_are_refused(tmp_path):
    def refused(key, message, shape=(3, 8, 8), **params):
        with pytest.raises(ParamError) as error:
            Transformer(TransformParams(**params), "TRAIN", shape)
        assert (error.value.key, str(error.value)) == (key, message)

    np.save(tmp_path / "mean.npy", np.zeros((3, 6, 6)))
    refused("transform_param.crop_size", "9 is larger than the records (8x8)", crop_size=9)
    refused("transform_param.mean_file", f"{tmp_path}/mean.npy has shape [3, 6, 6], the records are [3, 8, 8]",
            mean_file=str(tmp_path / "mean.npy"))
    refused("transform_param.mean_value", "give 1 value or 3 (one per channel), got 2", mean_value=[1.0, 2.0])
    refused("transform_param.mean_value", "give mean_file or mean_value, not both",
            mean_file=str(tmp_path / "mean.npy"), mean_value=[1.0])
    transformer = Transformer(TransformParams(), "TRAIN", (3, 8, 8))
    message = str(transformer.shape_error(images(1, (3, 8, 7))[0], "db record 00000004"))
    assert message.startswith("db record 00000004 has shape [3, 8, 7], but the first record's is [3, 8, 8]")


def data_net(source, batch=4, phase="TRAIN", transform=None, device="cpu", dtype=np.float64, **data_param):
    layers = [{"name": "data", "type": "Data", "top": ["data", "label"],
               "transform_param": transform or {},
               "data_param": {"source": str(source), "batch_size": batch, **data_param}},
              {"name": "silence", "type": "Silence", "bottom": ["data", "label"]}]
    return netspec.load_net(yaml.safe_dump({"name": "d", "layers": layers}), phase=phase, seed=4, dtype=dtype,
                            device=device)


@pytest.fixture
def dataset(tmp_path):
    pictures, labels = images(10, (3, 6, 6)), [i % 3 for i in range(10)]
    write_dataset(tmp_path / "ds", "lmdb", pictures, labels)
    return tmp_path / "ds", pictures, labels


def batches(net, count):
    result = []
    for _ in range(count):
        net.forward()
        result.append((net.blobs["data"].data.copy(), net.blobs["label"].data.copy()))
    return result


def test_data_reads_records_in_key_order_and_wraps_around(dataset):
    source, pictures, labels = dataset
    net = data_net(source, transform={"scale": 0.5, "mean_value": [1, 2, 3]})
    assert net.blobs["data"].shape == (4, 3, 6, 6) and net.blobs["label"].shape == (4,)
    got = batches(net, 3)
    order = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    for k, (data, label) in enumerate(got):
        rows = order[4 * k:4 * k + 4]
        expected = (pictures[rows] - np.array([1, 2, 3]).reshape(1, 3, 1, 1)) * 0.5
        np.testing.assert_allclose(data, expected)
        assert list(label) == [labels[r] for r in rows]
    assert net.layers[0].record_count() == 10
    net.close()


def test_data_with_crops_and_mirrors_matches_the_naive_loop(dataset):
    source, pictures, _ = dataset
    net = data_net(source, transform={"crop_size": 4, "mirror": True}, shuffle_buffer=5)
    layer = net.layers[0]
    for k, (data, _) in enumerate(batches(net, 4)):
        indices = layer.order.indices(4 * k, 4)
        choices = layer.transform.draw(np.random.default_rng([layer.seed, k, 1]), 4)
        for row, (index, choice) in enumerate(zip(indices, choices)):
            np.testing.assert_allclose(data[row], naive_transform(pictures[index], *choice[:3].astype(int), 4, None, 1.0))
    net.close()


def test_prefetching_changes_nothing_and_a_restored_position_continues_exactly(dataset):
    source, _, _ = dataset
    transform = {"crop_size": 3, "mirror": True}
    ahead = data_net(source, transform=transform, shuffle_buffer=3, prefetch=3)
    inline = data_net(source, transform=transform, shuffle_buffer=3, prefetch=0)
    straight = batches(ahead, 7)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
               for a, b in zip(straight, batches(inline, 7)))
    first = data_net(source, transform=transform, shuffle_buffer=3)
    batches(first, 3)
    state = first.runtime_state()
    resumed = data_net(source, transform=transform, shuffle_buffer=3)
    resumed.restore_runtime_state(state)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(straight[3:], batches(resumed, 4)))
    for net in (ahead, inline, first, resumed):
        net.close()
    assert ahead.layers[0].prefetcher.thread is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_gpu_receives_the_batches_the_cpu_makes(dataset, dtype):
    source, _, _ = dataset
    nets = [data_net(source, transform={"crop_size": 3, "mirror": True}, shuffle_buffer=3, device=device, dtype=dtype)
            for device in ("cpu", "gpu")]
    gpu = nets[1].backend
    for (data, label), (gpu_data, gpu_label) in zip(batches(nets[0], 5), batches(nets[1], 5)):  # (buffers reused)
        assert np.array_equal(gpu.to_host(gpu_data), data) and np.array_equal(gpu.to_host(gpu_label), label)
    for net in nets:
        net.close()


def test_an_hdf5_dataset_reads_like_lmdb(tmp_path):
    pictures, labels = images(6, (1, 4, 4)), [0, 1, 2, 0, 1, 2]
    write_dataset(tmp_path / "h5", "hdf5", pictures, labels)
    net = data_net(tmp_path / "h5", batch=4, backend="HDF5")
    (data, label), = batches(net, 1)
    assert np.array_equal(data, pictures[:4]) and list(label) == labels[:4]
    net.close()


def test_bad_data_layers_are_refused_at_shape_inference(dataset, tmp_path):
    source, _, _ = dataset

    def refused(**kwargs):
        with pytest.raises(ConfigError) as error:
            data_net(**kwargs)
        return str(error.value)

    assert "data_param.backend: " in refused(source=source, backend="HDF5")
    assert f"{source} is a LMDB dataset; set backend: LMDB" in refused(source=source, backend="HDF5")
    assert "no such dataset folder" in refused(source=tmp_path / "nowhere")
    assert "transform_param.crop_size: 7 is larger than the records (6x6)" in refused(
        source=source, transform={"crop_size": 7})
    assert "data_param.prefetch: must not be negative, got -1" in refused(source=source, prefetch=-1)
    assert "data_param.shuffle_buffer: must not be negative, got -2" in refused(source=source, shuffle_buffer=-2)


def image_list(tmp_path, count=6, shape=(5, 4, 3)):
    """``count`` PNG files under tmp_path/img and a list file naming them with labels i % 2."""
    from PIL import Image

    pictures = images(count, (shape[2], shape[0], shape[1]), seed=2)
    (tmp_path / "img").mkdir()
    for i, picture in enumerate(pictures):
        Image.fromarray(picture.transpose(1, 2, 0)).save(tmp_path / "img" / f"{i}.png")
    (tmp_path / "list.txt").write_text("".join(f"img/{i}.png {i % 2}\n" for i in range(count)))
    return tmp_path / "list.txt", pictures


def image_net(list_file, batch=4, transform=None, **params):
    layers = [{"name": "data", "type": "ImageData", "top": ["data", "label"], "transform_param": transform or {},
               "image_data_param": {"source": str(list_file), "batch_size": batch, **params}},
              {"name": "silence", "type": "Silence", "bottom": ["data", "label"]}]
    return netspec.load_net(yaml.safe_dump({"name": "i", "layers": layers}), phase="TRAIN", seed=1,
                            dtype=np.float64)


def test_image_data_decodes_the_listed_files(tmp_path):
    list_file, pictures = image_list(tmp_path)
    net = image_net(list_file, transform={"scale": 2.0})
    assert net.blobs["data"].shape == (4, 3, 5, 4)
    (first, labels), (second, _) = batches(net, 2)
    np.testing.assert_array_equal(first, pictures[:4] * 2.0)
    np.testing.assert_array_equal(second, pictures[[4, 5, 0, 1]] * 2.0)
    assert list(labels) == [0, 1, 0, 1]
    net.close()


def test_image_data_resizes_greys_and_shuffles_each_epoch(tmp_path):
    from netspec.data.images import resized

    list_file, pictures = image_list(tmp_path)
    net = image_net(list_file, batch=6, new_height=3, new_width=2, is_color=False, shuffle=True)
    assert net.blobs["data"].shape == (6, 1, 3, 2)
    (epoch0, labels0), (epoch1, _) = batches(net, 2)
    order = net.layers[0].order.indices(0, 6)
    assert sorted(order) == list(range(6)) and list(order) != list(net.layers[0].order.indices(6, 6))
    from PIL import Image

    grey = np.asarray(Image.fromarray(pictures[order[0]].transpose(1, 2, 0)).convert("L"))[None]
    np.testing.assert_array_equal(epoch0[0], resized(grey, (3, 2)))
    assert list(labels0) == [int(i) % 2 for i in order]
    net.close()


def test_bad_image_lists_are_refused(tmp_path):
    list_file, _ = image_list(tmp_path)

    def refused(**params):
        with pytest.raises(ConfigError) as error:
            image_net(list_file, **params)
        return str(error.value)

    assert "give new_height and new_width together" in refused(new_height=3)
    (tmp_path / "img" / "0.png").write_bytes(b"junk")
    assert f"image_data_param.source: {tmp_path}/img/0.png: not an image" in refused()


def test_hdf5_output_saves_what_reaches_it(tmp_path):
    layers = [{"name": "data", "type": "DummyData", "top": ["x", "y"],
               "dummy_data_param": {"shape": [{"dim": [3, 2]}, {"dim": [3]}],
                                    "data_filler": [{"type": "gaussian"}]}},
              {"name": "save", "type": "HDF5Output", "bottom": ["x", "y"],
               "hdf5_output_param": {"file_name": "out.h5"}}]
    net = netspec.load_net(yaml.safe_dump({"name": "o", "layers": layers}), seed=0,
                           output_folder=netspec.OutputFolder(tmp_path))
    seen = []
    for _ in range(2):
        net.forward()
        seen.append(net.blobs["x"].data.copy())
    assert not (tmp_path / "out.h5").exists()  # written under a temporary name until closed
    net.close()
    import h5py

    with h5py.File(tmp_path / "out.h5") as handle:
        assert handle["data"].shape == (6, 2) and handle["label"].shape == (6,)
        np.testing.assert_array_equal(handle["data"][()], np.concatenate(seen))


@pytest.mark.parametrize("file_name", ["/tmp/elsewhere.h5", "../elsewhere.h5", "sub/../../elsewhere.h5", "~/x.h5"])
def test_hdf5_output_stays_in_its_output_folder(tmp_path, file_name):
    layers = [{"name": "data", "type": "DummyData", "top": "x", "dummy_data_param": {"shape": [{"dim": [3, 2]}]}},
              {"name": "save", "type": "HDF5Output", "bottom": "x", "hdf5_output_param": {"file_name": file_name}}]
    text = yaml.safe_dump({"name": "o", "layers": layers})
    with pytest.raises(netspec.ConfigError, match=r"^<string>:\d+: layer 'save': hdf5_output_param.file_name: '.*' "
                                                  r"(is outside|leads out of) the output folder"):
        netspec.load_net(text, output_folder=netspec.OutputFolder(tmp_path / "run"))


def test_hdf5_output_writes_anywhere_when_allowed(tmp_path):
    layers = [{"name": "data", "type": "DummyData", "top": "x", "dummy_data_param": {"shape": [{"dim": [3, 2]}]}},
              {"name": "save", "type": "HDF5Output", "bottom": "x",
               "hdf5_output_param": {"file_name": str(tmp_path / "abs.h5")}},
              {"name": "save2", "type": "HDF5Output", "bottom": "x",
               "hdf5_output_param": {"file_name": "../up.h5"}}]
    net = netspec.load_net(yaml.safe_dump({"name": "o", "layers": layers}),
                           output_folder=netspec.OutputFolder(tmp_path / "run", anywhere=True))
    net.forward()
    net.close()
    assert (tmp_path / "abs.h5").is_file() and (tmp_path / "up.h5").is_file()


def test_an_image_of_another_shape_stops_with_its_name(tmp_path):
    from PIL import Image

    list_file, _ = image_list(tmp_path, count=4)
    Image.fromarray(np.zeros((7, 7, 3), dtype=np.uint8)).save(tmp_path / "img" / "2.png")
    net = image_net(list_file, batch=4, prefetch=2)
    with pytest.raises(DataError, match=rf"^{tmp_path}/img/2.png has shape \[3, 7, 7\], but the first record's "
                                        r"is \[3, 5, 4\]; records must share a shape"):
        net.forward()
    net.close()


def test_a_classifier_is_checked_against_the_classes_of_its_data_layers_dataset(dataset, tmp_path):
    from netspec.engine.classes import class_problems
    from netspec.engine.net import compile_net
    from netspec.engine.registry import layer_schemas
    from netspec.spec.net_spec import parse_net

    source = dataset[0]  # (labels 0, 1, 2: the manifest counts three classes)
    for outputs, errors, warnings in ((2, 1, 0), (3, 0, 0), (5, 0, 1)):
        layers = [{"name": "data", "type": "Data", "top": ["data", "label"],
                   "data_param": {"source": str(source), "batch_size": 2}},
                  {"name": "score", "type": "InnerProduct", "bottom": "data", "top": "score",
                   "inner_product_param": {"num_output": outputs}},
                  {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["score", "label"], "top": "loss"}]
        graph = compile_net(parse_net(yaml.safe_dump({"name": "n", "layers": layers}), layer_schemas()))
        found = class_problems(graph)
        assert (len(found[0]), len(found[1])) == (errors, warnings), found
    assert str(found[1][0]) == ("warning: layer 'score': its top 'score' scores 5 classes, but the labels of layer "
                                "'data' have 3; 2 output(s) stand for no class")


def test_a_mean_file_that_is_no_npy_says_what_it_is(tmp_path):
    (tmp_path / "mean.binaryproto").write_bytes(b"\x0a\x02\x08\x01")  # (any Caffe BlobProto)
    with pytest.raises(ParamError) as error:
        Transformer(TransformParams(mean_file=str(tmp_path / "mean.binaryproto")), "TRAIN", (3, 8, 8))
    assert str(error.value).endswith(f"{tmp_path / 'mean.binaryproto'}: not a .npy file but a Caffe mean: netspec "
                                     f"convert caffe-mean {tmp_path / 'mean.binaryproto'} -o mean.npy makes one")
