"""Models from someone else: nets that write files, weights and states that reach outside their file, configs
that explode, and weights that would give silent wrong answers.  Each is refused in one line, in bounded time
and memory, and nothing is written outside the folder the user runs in."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from hostile import files_under, refuses, run

import netspec
from netspec.errors import ConfigError
from netspec.interop import caffe_import
from netspec.interop.prototxt import parse_prototxt
from netspec.model_zoo.card import card_yaml, read_card

ROOT = Path(__file__).parent.parent.parent
DEPLOY = ROOT / "configs" / "digits" / "digits_deploy.yaml"


def writer_net(folder: Path, file_name: str) -> Path:
    """The digits deploy net with an HDF5Output saving its scores to ``file_name``."""
    path = folder / "evil_deploy.yaml"
    path.write_text(DEPLOY.read_text() + f"  - {{name: save, type: HDF5Output, bottom: ip2, "
                                         f"hdf5_output_param: {{file_name: '{file_name}'}}}}\n")
    return path


@pytest.fixture
def weights(tmp_path) -> Path:
    """Weights of the digits deploy net, from its fillers."""
    path = tmp_path / "digits.weights.h5"
    netspec.load_net(str(DEPLOY), seed=3).save_weights(path)
    return path


def digits_input(folder: Path, value=0.5) -> Path:
    path = folder / "input.npy"
    np.save(path, np.full((1, 8, 8), value, dtype=np.float32))
    return path


def reseal(model: Path) -> None:
    """Make a model's card match its changed weights.h5, as a hostile zoo would (weights.h5 is listed last)."""
    card = (model / "model.yaml").read_text().split("- path: weights.h5")[0]
    data = (model / "weights.h5").read_bytes()
    (model / "model.yaml").write_text(card + f"- path: weights.h5\n  size: {len(data)}\n"
                                             f"  sha256: {hashlib.sha256(data).hexdigest()}\n")


def publish(tmp_path, net, weights, *extra):
    return run("zoo", "publish", "--name", "m", "--net", net, "--weights", weights, "--zoo", tmp_path / "zoo", *extra)


def reseal_file(model: Path, name: str) -> None:
    """Make a model's card match its changed file ``name``, as a hostile zoo would."""
    card = read_card(str(model))
    data = (model / name).read_bytes()
    for entry in card.files:
        if entry.path == name:
            entry.size, entry.sha256 = len(data), hashlib.sha256(data).hexdigest()
    (model / "model.yaml").write_text(card_yaml(card))


def test_an_include_that_leaves_the_model_folder_is_refused_at_verify_and_load(tmp_path, weights):
    assert publish(tmp_path, DEPLOY, weights).returncode == 0
    model = tmp_path / "zoo" / "models" / "m" / "1"
    outside = tmp_path / "outside.yaml"
    outside.write_text("modules: {}\n")
    for include in (str(outside), "../../../../outside.yaml", "{a: 1}"):
        (model / "deploy.yaml").write_text(f"include: {include}\n" + DEPLOY.read_text())
        reseal_file(model, "deploy.yaml")
        expected = "deploy.yaml includes ", ", which is no file of the model (a model reads the files its card lists"
        for line in (refuses("zoo", "verify", "m", "--zoo", tmp_path / "zoo"),
                     refuses("predict", "m", digits_input(tmp_path), "--zoo", tmp_path / "zoo")):
            assert all(part in line for part in expected), line


def test_a_deploy_net_that_includes_modules_is_published_whole(tmp_path, weights):
    (tmp_path / "parts.yaml").write_text("modules:\n  act:\n    layers:\n      - {name: r, type: ReLU, bottom: x, "
                                         "top: x}\n")
    net = tmp_path / "deploy.yaml"
    net.write_text("include: parts.yaml\n" + DEPLOY.read_text())
    assert publish(tmp_path, net, weights).returncode == 0
    published = (tmp_path / "zoo" / "models" / "m" / "1" / "deploy.yaml").read_text()
    assert "include" not in published and "modules" not in published
    (tmp_path / "parts.yaml").unlink()  # the model needs no file outside its folder
    assert run("zoo", "verify", "m", "--zoo", tmp_path / "zoo").returncode == 0
    assert run("predict", "m", digits_input(tmp_path), "--zoo", tmp_path / "zoo").returncode == 0


# ---- nets that write files -------------------------------------------------------------------------------------
def test_a_net_that_writes_files_is_refused_at_publish_and_at_load(tmp_path, weights):
    outside = tmp_path / "outside"
    net = writer_net(tmp_path, str(outside / "stolen.h5"))
    message = refuses("zoo", "publish", "--name", "m", "--net", net, "--weights", weights, "--zoo", tmp_path / "zoo")
    assert message == (f"error: {net}: layer 'save' (HDF5Output) writes files; a net shared through a zoo runs "
                       "without side effects unless its user allows them (--allow-side-effects)")
    # allowed, its files must still stay where its users run it
    assert refuses("zoo", "publish", "--name", "m", "--net", net, "--weights", weights, "--zoo", tmp_path / "zoo",
                   "--allow-side-effects", cwd=tmp_path).endswith(
        f"hdf5_output_param.file_name: '{outside / 'stolen.h5'}' is outside the output folder {tmp_path}; write a "
        "path relative to it, since its users run it in folders of their own")
    assert "is outside the output folder" in refuses("test", net, "--weights", weights, "-n", 1, cwd=tmp_path)
    assert run("check", net, "--weights", weights).returncode == 0  # checking a net never runs it
    assert not outside.exists()

    net = writer_net(tmp_path, "features/scores.h5")
    published = publish(tmp_path, net, weights, "--allow-side-effects")  # the author knows what the net does
    assert published.returncode == 0, published.stderr
    work = tmp_path / "work"
    work.mkdir()
    model = tmp_path / "zoo" / "models" / "m" / "1"
    image = digits_input(tmp_path)
    assert "writes files" in refuses("predict", model, image, cwd=work)
    assert files_under(work) == set()
    allowed = run("predict", model, image, "--allow-side-effects", cwd=work)
    assert allowed.returncode == 0, allowed.stderr
    assert files_under(work) == {"features", "features/scores.h5"}


def test_an_output_path_through_a_link_is_refused_unless_allowed(tmp_path, weights):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    (work / "sub").mkdir(parents=True)
    elsewhere.mkdir()
    (work / "sub" / "link").symlink_to(elsewhere)
    net = writer_net(tmp_path, "sub/link/out.h5")
    assert "leads out of the output folder" in refuses("test", net, "--weights", weights, "-n", 1, cwd=work)
    assert files_under(elsewhere) == set()
    allowed = run("test", net, "--weights", weights, "-n", 1, "--allow-absolute-outputs", cwd=work)
    assert allowed.returncode == 0, allowed.stderr
    assert files_under(elsewhere) == {"out.h5"}


@pytest.mark.parametrize("file_name", ["/tmp/netspec-hostile.h5", "../escaped.h5", "~/netspec-hostile.h5"])
def test_output_paths_stay_in_the_current_directory(tmp_path, weights, file_name):
    work = tmp_path / "work"
    work.mkdir()
    net = writer_net(tmp_path, file_name)
    message = refuses("test", net, "--weights", weights, "-n", 1, cwd=work)
    assert message.startswith(f"error: {net}:") and "layer 'save': hdf5_output_param.file_name:" in message
    assert "--allow-absolute-outputs" in message
    assert files_under(tmp_path) == {"work", "evil_deploy.yaml", "digits.weights.h5"}


def test_a_relative_output_path_writes_in_the_current_directory(tmp_path, weights):
    work = tmp_path / "work"
    work.mkdir()
    result = run("test", writer_net(tmp_path, "features/out.h5"), "--weights", weights, "-n", 2, cwd=work)
    assert result.returncode == 0, result.stderr
    with h5py.File(work / "features" / "out.h5") as handle:
        assert handle["data"].shape == (2, 10)


# ---- weights and states that reach outside their file ----------------------------------------------------------
def hostile_weights(path: Path, weights: Path, how: str) -> Path:
    """A copy of ``weights`` whose layer ip2 is replaced by something that reaches outside the file."""
    path.write_bytes(weights.read_bytes())
    secret = path.parent / "secret.h5"
    with h5py.File(secret, "w") as handle:
        handle["x"] = np.ones((10, 128), dtype=np.float32)
    raw = path.parent / "raw.bin"
    raw.write_bytes(np.ones(1280, dtype=np.float32).tobytes())
    with h5py.File(path, "a") as handle:
        del handle["ip2/0"]
        group = handle["ip2"]
        if how == "external link":
            group["0"] = h5py.ExternalLink(str(secret), "/x")
        elif how == "soft link":
            group["0"] = h5py.SoftLink("/conv1/0")
        elif how == "external storage":
            group.create_dataset("0", shape=(10, 128), dtype="f4", external=[(str(raw), 0, 1280 * 4)])
        elif how == "virtual dataset":
            layout = h5py.VirtualLayout(shape=(10, 128), dtype="f4")
            layout[:] = h5py.VirtualSource(str(secret), "x", shape=(10, 128))
            group.create_virtual_dataset("0", layout)
        elif how == "text":
            group["0"] = np.array([b"a"] * 1280, dtype=object).reshape(10, 128)
    return path


@pytest.mark.parametrize("how", ["external link", "soft link", "external storage", "virtual dataset", "text"])
def test_weights_that_reach_outside_their_file_are_refused(tmp_path, weights, how):
    bad = hostile_weights(tmp_path / "bad.weights.h5", weights, how)
    message = refuses("check", DEPLOY, "--weights", bad)
    assert message.startswith(f"error: {bad}: /ip2/0 ")
    assert ("netspec reads only what is inside the file" in message) or "not numbers" in message


def test_zoo_verify_and_predict_refuse_weights_with_a_link_even_when_the_card_matches(tmp_path, weights):
    assert publish(tmp_path, DEPLOY, weights).returncode == 0
    model = tmp_path / "zoo" / "models" / "m" / "1"
    hostile_weights(model / "weights.h5", weights, "external link")
    reseal(model)
    for name in ("secret.h5", "raw.bin"):
        (model / name).unlink()
    assert refuses("zoo", "verify", "--zoo", tmp_path / "zoo") == (
        "error: 1 problem(s): m@1: weights.h5: /ip2/0 is an external link; netspec reads only what is inside the file")
    assert "/ip2/0 is an external link" in refuses("predict", model, digits_input(tmp_path))


@pytest.mark.parametrize("how, expected", [
    ("lattice", "is a second link to an object"),
    ("named type", "/t is neither a group nor a dataset"),
    ("odd key", "/ip2 is not a layer's group of blobs 0, 1, ..."),
    ("unwritten", "/ip2/0 declares 5,120 bytes but stores none"),
])
def test_weights_of_odd_structure_are_refused_quickly(tmp_path, weights, how, expected):
    with h5py.File(weights, "a") as handle:
        if how == "lattice":  # 6**8 paths through 8 groups
            groups = [handle.create_group(f"g{level}") for level in range(8)]
            for upper, lower in zip(groups, groups[1:]):
                for link in range(6):
                    upper[f"l{link}"] = lower
        elif how == "named type":
            handle["t"] = np.dtype("f4")
        elif how == "odd key":
            handle["ip2"]["\u00b2"] = np.zeros(3)
        elif how == "unwritten":
            del handle["ip2/0"]
            handle["ip2"].create_dataset("0", shape=(10, 128), dtype="f4", chunks=(10, 128))
    started = time.perf_counter()
    assert expected in refuses("check", DEPLOY, "--weights", weights)
    assert time.perf_counter() - started < 30


def test_a_fifo_for_weights_is_refused_at_once(tmp_path):
    fifo = tmp_path / "weights.h5"
    os.mkfifo(fifo)
    assert refuses("check", DEPLOY, "--weights", fifo, timeout=30) == f"error: {fifo}: not a regular file"


def test_an_unused_dataset_of_gigabytes_is_never_read(tmp_path, weights):
    bad = tmp_path / "bomb.weights.h5"
    bad.write_bytes(weights.read_bytes())
    with h5py.File(bad, "a") as handle:  # a few KB on disk, 16 GB of zeros when read
        handle.create_group("unused").create_dataset("0", shape=(1 << 32,), dtype="f4", compression="gzip",
                                                     chunks=(1 << 20,))
    assert bad.stat().st_size < 1 << 20
    result = run("check", DEPLOY, "--weights", bad)
    assert result.returncode == 0, result.stderr  # only the net's layers are read
    assert "in the file but not the net: unused" in result.stdout
    with h5py.File(bad, "a") as handle:  # the same bomb in place of a layer the net reads
        del handle["conv1/0"]
        handle["conv1"].create_dataset("0", shape=(1 << 30, 1, 3, 3), dtype="f4", compression="gzip",
                                       chunks=(1 << 16, 1, 3, 3))
    assert "has shape (1073741824, 1, 3, 3) in the file but (32, 1, 3, 3) in the net" in refuses(
        "check", DEPLOY, "--weights", bad)


# ---- silent wrong answers --------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_predict_refuses_inputs_that_are_not_finite(tmp_path, weights, value):
    assert publish(tmp_path, DEPLOY, weights).returncode == 0
    model = tmp_path / "zoo" / "models" / "m" / "1"
    assert "holds values that are not finite numbers" in refuses("predict", model, digits_input(tmp_path, value))


def test_predict_reads_nothing_of_an_npy_that_claims_a_terabyte(tmp_path, weights):
    assert publish(tmp_path, DEPLOY, weights).returncode == 0
    bomb = tmp_path / "bomb.npy"
    with open(bomb, "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, {"descr": "<f4", "fortran_order": False,
                                                      "shape": (10 ** 12, 1, 8, 8)})
    assert refuses("predict", tmp_path / "zoo" / "models" / "m" / "1", bomb).startswith(f"error: {bomb}: cannot read")


def test_predict_refuses_a_model_whose_weights_miss_a_layer(tmp_path, weights):
    assert publish(tmp_path, DEPLOY, weights).returncode == 0
    model = tmp_path / "zoo" / "models" / "m" / "1"
    with h5py.File(model / "weights.h5", "a") as handle:  # as a hostile zoo would serve it
        del handle["ip2"]
    reseal(model)
    message = refuses("predict", model, digits_input(tmp_path))
    assert "holds no weights for layer(s) ip2 of the deploy net" in message and "--allow-missing-weights" in message
    assert run("predict", model, digits_input(tmp_path), "--allow-missing-weights").returncode == 0


def test_predict_refuses_a_card_whose_label_names_do_not_fit_the_classes(tmp_path, weights):
    """Publish refuses it; a card edited afterwards (its hash is its own) is refused where it would be used."""
    assert publish(tmp_path, DEPLOY, weights).returncode == 0
    model = tmp_path / "zoo" / "models" / "m" / "1"
    card = (model / "model.yaml").read_text()
    assert "label_names: []" in card
    (model / "model.yaml").write_text(card.replace("label_names: []", "label_names: [zero]"))
    assert refuses("predict", model, digits_input(tmp_path)) == (
        f"error: {model / 'model.yaml'}: its label_names name 1 classes but the deploy net scores 10 ('prob')")


def test_weights_holding_nan_are_refused(tmp_path, weights):
    with h5py.File(weights, "a") as handle:
        handle["ip2/1"][3] = np.nan
    assert refuses("check", DEPLOY, "--weights", weights) == (
        f"error: {weights}: layer 'ip2' blob 1 holds NaN or infinite values")


# ---- configs that explode --------------------------------------------------------------------------------------
def alias_bomb(levels: int = 9) -> str:
    text = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    for level in range(1, levels):
        text += f"l{level}: &l{level} [" + ", ".join([f"*{'a' if level == 1 else f'l{level - 1}'}"] * 9) + "]\n"
    return text + f"layers: *l{levels - 1}\n"


@pytest.mark.parametrize("text, expected", [
    (alias_bomb(), "YAML past netspec's limits: its aliases expand to more than 1,000,000 values"),
    ("layers: " + "[" * 5000 + "]" * 5000 + "\n", "YAML past netspec's limits: nested deeper than 100 levels"),
    ("layers:\n" + "".join("  " * i + "- \n" for i in range(1, 400)), "nested deeper than 100 levels"),
    ("name: caf\xe9\n".encode("latin-1"), "not a text file (byte 9 is not UTF-8)"),
    ("layers: &a [*a]\n", "an alias refers to a value that holds it (a tree without end)"),
    ("".join(f"a{i}: &a{i} " + "[" * 60 + (f"*a{i - 1}" if i else "1") + "]" * 60 + "\n" for i in range(20))
     + "layers: *a19\n", "its aliases nest it deeper than 100 levels"),
], ids=["alias bomb", "deep flow lists", "deep block lists", "latin-1", "recursive alias", "deep through aliases"])
def test_yaml_bombs_and_deep_nesting_are_refused_at_once(tmp_path, text, expected):
    net = tmp_path / "net.yaml"
    net.write_bytes(text if isinstance(text, bytes) else text.encode())
    started = time.perf_counter()
    assert expected in refuses("check", net)
    assert time.perf_counter() - started < 30


def doubling_modules(levels: int = 40) -> str:
    """Modules each passing the next a value of its own value twice: 2**40 characters at the bottom."""
    text = "modules:\n"
    for level in range(levels + 1):
        text += f"  m{level}:\n    params: {{a: ~}}\n    inputs: [x]\n    outputs: [y]\n    layers:\n"
        text += (f"      - {{use: m{level + 1}, name: '${{name}}', bottom: x, top: y, with: {{a: '${{a}}${{a}}'}}}}\n"
                 if level < levels else "      - {name: '${name}', type: ReLU, bottom: x, top: y, include: {stage: '${a}'}}\n")
    return text + ("layers:\n  - {name: data, type: Input, top: data, input_param: {shape: {dim: [1, 1, 8, 8]}}}\n"
                   "  - {use: m0, name: q, bottom: data, top: out, with: {a: zz}}\n")


def splicing_repeat(count: int = 5000) -> str:
    """A repeat splicing a value of 900,000 characters into each copy: 4.5 GB of names."""
    return ("modules:\n  m:\n    params: {a: ~}\n    inputs: [x]\n    outputs: [y]\n    layers:\n"
            "      - {name: '${name}', type: ReLU, bottom: x, top: y, include: {stage: '${a}${name}'}}\n"
            "layers:\n  - {name: data, type: Input, top: data, input_param: {shape: {dim: [1, 1, 8, 8]}}}\n"
            f"  - repeat: {{count: {count}, use: m, name: 'r${{index}}', bottom: data, top: 'o${{index}}', "
            f"with: {{a: '{'x' * 900_000}'}}}}\n")


@pytest.mark.parametrize("text, expected", [
    (doubling_modules(), "'${a}' makes a value longer than 1,048,576 characters (in module 'm18' used at"),
    (splicing_repeat(), "the placeholders splice more than 67,108,864 characters into the file's values"),
    (doubling_modules().replace("${a}${a}", "${a}"),
     "modules nest more than 32 uses deep (m0 -> m1 -> "),
], ids=["doubling", "splicing", "deep"])
def test_module_values_that_grow_without_bound_are_refused_at_once(tmp_path, text, expected):
    net = tmp_path / "net.yaml"
    net.write_text(text)
    started = time.perf_counter()
    assert expected in refuses("check", net)
    assert time.perf_counter() - started < 30


def test_a_model_card_alias_bomb_is_refused(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.yaml").write_text(alias_bomb().replace("layers:", "name:"))
    assert "its aliases expand to more than 1,000,000 values" in refuses("predict", model, digits_input(tmp_path))


def test_an_include_diamond_reads_each_file_once(tmp_path):
    for level in range(40):  # each file includes the next twice: 2**40 reads if followed naively
        nxt = f"level{level + 1}.yaml"
        body = f"include: [{nxt}, ./{nxt}]\n" if level < 39 else ""
        (tmp_path / f"level{level}.yaml").write_text(body + f"modules:\n  m{level}:\n    inputs: [x]\n"
                                                     "    outputs: [y]\n    layers: [{name: r, type: ReLU, "
                                                     "bottom: x, top: y}]\n")
    net = tmp_path / "net.yaml"
    net.write_text("include: level0.yaml\nlayers:\n  - {name: data, type: Input, top: d, input_param: "
                   "{shape: {dim: [1, 2]}}}\n  - {use: m39, name: u, bottom: d, top: u}\n")
    started = time.perf_counter()
    result = run("check", net)
    assert result.returncode == 0, result.stderr
    assert time.perf_counter() - started < 30


def test_nested_repeats_that_expand_to_billions_of_layers_are_refused(tmp_path):
    net = tmp_path / "net.yaml"
    net.write_text("""modules:
  one: {inputs: [x], outputs: [y], layers: [{name: "${name}", type: ReLU, bottom: x, top: y}]}
  many:
    inputs: [x]
    outputs: [y]
    layers: [{repeat: {count: 1000, use: one, name: "${name}_${index}", bottom: x, top: "y${index}"}},
             {name: "${name}_out", type: ReLU, bottom: y999, top: y}]
  more:
    inputs: [x]
    outputs: [y]
    layers: [{repeat: {count: 1000, use: many, name: "${name}_${index}", bottom: x, top: "m${index}"}},
             {name: "${name}_out", type: ReLU, bottom: m999, top: y}]
layers:
  - {name: data, type: Input, top: d, input_param: {shape: {dim: [1, 2]}}}
  - {repeat: {count: 1000, use: more, name: "u${index}", bottom: d, top: "u${index}"}}
""")
    assert "the modules and repeats expand to more than 100,000 layers" in refuses("check", net)


@pytest.mark.parametrize("name", [".", "..", "a\x00b", "tab\there", "n" * 3000])
def test_layer_names_that_cannot_be_stored_are_refused_when_the_net_is_read(tmp_path, name):
    net = tmp_path / "net.yaml"
    escaped = name.encode("unicode_escape").decode()
    net.write_text(f'layers:\n  - {{name: "{escaped}", type: Input, top: d, input_param: {{shape: {{dim: [1]}}}}}}\n')
    message = refuses("check", net)
    assert "a layer name cannot be '.' or '..', hold control characters or be longer than 256" in message
    assert len(message) < 500


@pytest.mark.parametrize("layer, expected", [
    ("{name: conv, type: Convolution, bottom: data, top: c, convolution_param: {num_output: 2, kernel_size: 3, "
     "pad: 4611686018427387904}}", "top 'c' would be "),
    ("{name: big, type: Input, top: big, input_param: {shape: {dim: [4294967296, 4294967296, 3]}}}",
     "top 'big' would be [4294967296, 4294967296, 3]"),
    ("{name: tile, type: Tile, bottom: data, top: t, tile_param: {tiles: 4611686018427387904}}",
     "top 't' would be "),
    ("{name: ip, type: InnerProduct, bottom: data, top: ip, inner_product_param: {num_output: 1099511627776}}",
     "learnable blob 0 [1099511627776, 192]"),
], ids=["pad 2^62", "dims of 2^32", "tiles 2^62", "2^40 outputs"])
@pytest.mark.parametrize("command", ["check", "time"])
def test_shapes_beyond_any_machine_are_refused_before_any_array(tmp_path, layer, expected, command):
    net = tmp_path / "net.yaml"
    net.write_text("layers:\n  - {name: data, type: Input, top: data, input_param: {shape: {dim: [1, 3, 8, 8]}}}\n"
                   f"  - {layer}\n")
    message = refuses(command, net)
    assert expected in message and "more than any machine holds" in message and message.startswith(f"error: {net}:")


# ---- Caffe files -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("layer " + "{ a " * 500 + "}" * 500, "messages nested deeper than 100 levels"),
    ('name: "caf\xe9"'.encode("latin-1"), "not a text file (byte 10 is not UTF-8)"),
    ('name: "\\x"\n', "net.prototxt:1:7: '\\x' with no hexadecimal digit after it"),
    ('name: "\\xZZ"\n', "net.prototxt:1:7: '\\x' with no hexadecimal digit after it"),
    ('layer { name: "d" type: "Dropout" dropout_param { dropout_ratio: nanf } }', "expected a finite number, got nan"),
    ('layer { name: "d" type: "Dropout" dropout_param { dropout_ratio: inff } }', "expected a finite number, got inf"),
    ('layer { name: "i" type: "Input" input_param { shape { dim: ' + "9" * 5000 + " } } }",
     "has more digits than any number a protobuf field holds"),
    ("layer: 5", "net: layer (line 1): expected a message {...}, found a value"),
    ("name {}", "net: name (line 1): expected a value, found a message {...}"),
    ('layer { name: "a" type {} }', "layer 0: type (line 1): expected a value, found a message {...}"),
    ('layer { name: "d" type: "Dropout" dropout_param { dropout_ratio { } } }',
     "layer 'd': dropout_param.dropout_ratio (line 1): expected a value, found a message {...}"),
    ('layer { name: "d" type: "Dropout" dropout_param: 3 }',
     "layer 'd': dropout_param (line 1): expected a message {...}, found a value"),
], ids=["deep messages", "latin-1", "bare \\x", "\\x without hex digits", "nanf", "inff", "5000 digits", "layer: 5",
        "name {}", "type {}", "a block's value as a message", "a block as a value"])
def test_hostile_prototxt_is_refused(tmp_path, text, expected):
    path = tmp_path / "net.prototxt"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert expected in refuses("import", "caffe", path, "-o", tmp_path / "net.yaml")


def test_a_prototxt_over_16_mib_is_refused_unread(tmp_path):
    path = tmp_path / "net.prototxt"
    with open(path, "w") as handle:
        handle.write('name: "n"\n')
        handle.truncate(17 << 20)
    assert refuses("import", "caffe", path, "-o", tmp_path / "net.yaml") == (
        f"error: {path}: {17 << 20} bytes, more than the {16 << 20} it may hold")


def test_a_prototxt_of_more_layers_than_a_net_may_have_is_refused(monkeypatch):
    monkeypatch.setattr(caffe_import, "MAX_LAYERS", 3)
    text = "".join(f'layer {{ name: "r{i}" type: "ReLU" bottom: "x" top: "x" }}\n' for i in range(4))
    with pytest.raises(ConfigError, match="the net has 4 layers, more than the 3 a net may have"):
        caffe_import.import_net(parse_prototxt(text))


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def message(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def caffemodel(layer: str, dims: list[int], values: int) -> bytes:
    shape = message(1, b"".join(varint(d) for d in dims))
    blob = message(7, shape) + message(5, np.zeros(values, dtype="<f4").tobytes())
    return message(100, message(1, layer.encode()) + message(7, blob))


def test_hostile_caffemodels_are_refused(tmp_path):
    prototxt = tmp_path / "net.prototxt"
    prototxt.write_text('name: "n"\nlayer { name: "data" type: "Input" top: "data" '
                        'input_param { shape { dim: 1 dim: 4 } } }\n'
                        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
                        'inner_product_param { num_output: 2 } }\n')
    model = tmp_path / "overflow.caffemodel"
    model.write_bytes(caffemodel("ip", [1 << 62, 1 << 62, 0], 0))
    assert "the blob's shape" in refuses("import", "caffemodel", prototxt, model, "-o", tmp_path / "w.h5")
    model.write_bytes(caffemodel("other", [2, 4], 8))
    assert "no layer of the file has the name of a layer of net 'n'" in refuses(
        "import", "caffemodel", prototxt, model, "-o", tmp_path / "w.h5")
    shape = message(7, message(1, varint(2) + varint(4)))
    for data, expected in [(varint(5 << 3) + varint(7), "its data field holds no 4-byte floats (wire type 0)"),
                           (message(5, bytes(30)), "its data field holds no 4-byte floats (30 bytes)"),
                           (varint(8 << 3 | 5) + bytes(4), "its double_data field holds no 8-byte floats (wire type 5)"),
                           (message(5, np.full(8, np.nan, dtype="<f4").tobytes()), "holds NaN or infinite values")]:
        model.write_bytes(message(100, message(1, b"ip") + message(7, shape + data)))
        assert f"layer 'ip' blob 0: {expected}" in refuses("import", "caffemodel", prototxt, model, "-o",
                                                           tmp_path / "w.h5")
    assert not (tmp_path / "w.h5").exists()


def test_a_caffe_mean_of_one_value_a_field_takes_the_memory_of_its_values_and_70_axes_are_refused(tmp_path):
    """4,000,000 values each in a field of its own (20 MB) were 4,000,000 arrays, gigabytes: now 16 MB of
    values, within the address-space limit of these tests; a shape of more axes than Caffe's 32 is one line."""
    count = 4_000_000
    single = (varint(5 << 3 | 5) + b"\0\0\x80?") * count  # (1.0 as float32, one a field)
    mean = tmp_path / "mean.binaryproto"
    mean.write_bytes(message(7, message(1, varint(1) + varint(1) + varint(1) + varint(count))) + single)
    result = run("convert", "caffe-mean", mean, "-o", tmp_path / "mean.npy")
    assert result.returncode == 0, result.stderr[-2000:]
    assert np.load(tmp_path / "mean.npy").shape[-1] == count
    mean.write_bytes(message(7, message(1, varint(1) * 70)) + varint(5 << 3 | 5) + b"\0\0\x80?")
    assert refuses("convert", "caffe-mean", mean, "-o", tmp_path / "axes.npy").endswith(
        "the blob's shape has 70 axes, more than Caffe's 32")


def test_an_imported_net_that_writes_files_says_where_and_cannot_write_elsewhere(tmp_path):
    prototxt = tmp_path / "net.prototxt"
    prototxt.write_text('name: "n"\nlayer { name: "data" type: "Input" top: "data" '
                        'input_param { shape { dim: 1 dim: 4 } } }\n'
                        'layer { name: "out" type: "HDF5Output" bottom: "data" '
                        'hdf5_output_param { file_name: "/tmp/netspec-hostile-import.h5" } }\n')
    imported = run("import", "caffe", prototxt, "-o", tmp_path / "net.yaml")
    assert imported.returncode == 0, imported.stderr
    assert "layer 'out' (HDF5Output) writes files: inside the run folder when training" in imported.stdout
    assert "is outside the output folder" in refuses("time", tmp_path / "net.yaml", "-n", 1, "--warmup", 0,
                                                     cwd=tmp_path)
    assert not Path("/tmp/netspec-hostile-import.h5").exists()


def test_an_imported_caffemodel_of_a_net_that_writes_files_is_copied(tmp_path):
    prototxt = tmp_path / "net.prototxt"
    prototxt.write_text('name: "n"\nlayer { name: "data" type: "Input" top: "data" '
                        'input_param { shape { dim: 1 dim: 4 } } }\n'
                        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
                        'inner_product_param { num_output: 2 bias_term: false } }\n'
                        'layer { name: "out" type: "HDF5Output" bottom: "ip" '
                        'hdf5_output_param { file_name: "/tmp/netspec-hostile-features.h5" } }\n')
    model = tmp_path / "net.caffemodel"
    model.write_bytes(caffemodel("ip", [2, 4], 8))
    result = run("import", "caffemodel", prototxt, model, "-o", tmp_path / "w.h5")
    assert result.returncode == 0, result.stderr  # the net is built to take its weights, never run
    assert (tmp_path / "w.h5").is_file() and not Path("/tmp/netspec-hostile-features.h5").exists()


def test_a_card_with_an_enormous_input_is_refused(tmp_path, weights):
    assert publish(tmp_path, DEPLOY, weights).returncode == 0
    model = tmp_path / "zoo" / "models" / "m" / "1"
    card = model / "model.yaml"
    card.write_text(card.read_text().replace("  - 8\n  - 8\n", "  - 60000\n  - 60000\n"))
    assert "input.shape: must be [C, H, W] with 1 or 3 channels and at most 89,478,485 pixels" in refuses(
        "predict", model, digits_input(tmp_path))


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_config_that_is_no_regular_file_is_refused_at_once(tmp_path, kind):
    net = tmp_path / "net.yaml"
    if kind == "fifo":
        os.mkfifo(net)
    else:
        net.symlink_to("/dev/zero")
    assert refuses("check", net, timeout=30) == (
        f"error: {net}: not a config file (a regular file of at most 67,108,864 bytes)")


def test_a_nets_name_reaches_the_terminal_without_control_characters(tmp_path):
    net = tmp_path / "net.yaml"
    net.write_text('name: "evil\\x1b]0;pwned\\x07"\nlayers:\n  - {name: d, type: Input, top: x, '
                   "input_param: {shape: {dim: [1, 2]}}}\n")
    result = run("check", net)
    assert result.returncode == 0 and "\x1b" not in result.stdout and "evil\\x1b]0;pwned\\x07" in result.stdout


def test_an_onnx_model_whose_constants_would_take_gigabytes_is_refused_before_they_are_made(tmp_path):
    """182 bytes asking ConstantOfShape for 3 x 2**30 values (12 GiB), summed to one number: refused from the
    shape inferred, within the address-space limit of these tests, not after making them."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["ones"],
                              value=numpy_helper.from_array(np.array([1.0], np.float32))),
             helper.make_node("ReduceSum", ["ones"], ["total"], keepdims=0),
             helper.make_node("Add", ["x", "total"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array([3, 1 << 30], np.int64), "shape")])
    model = tmp_path / "constants.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), model)
    started = time.perf_counter()
    assert "its constant subgraphs make more than 4 GiB of values (node 'ConstantOfShape')" in refuses(
        "import", "onnx", model, "-o", tmp_path / "net.yaml")
    assert time.perf_counter() - started < 30 and not (tmp_path / "net.yaml").exists()
