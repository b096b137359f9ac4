"""Caffe Model Zoo directories as a zoo source: ``zoo import-caffe`` over HTTP and from folders, Caffe models trees for
``zoo list --from`` and ``zoo download --from``, resumed downloads, and one-line refusals that leave the zoo as it was.

The model directory is made here: a small BGR conv net in Caffe's text format and a caffemodel written in protobuf
wire format with known weights.  ``python3 tests/model_zoo/test_zoo_caffe.py TREE URL`` writes the same tree (its
caffemodel_url under URL) with an image and label names beside it, for the README's walk-through.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

if __name__ == "__main__":  # (run as the guide's script: tests/conftest.py puts the helpers' folders on the path)
    sys.path.insert(0, str(Path(__file__).parent.parent))
    import conftest  # noqa: F401
from test_caffe_import import caffemodel
from test_cli import fails, ok, run
from test_zoo import tree

from netspec.model_zoo.caffe_zoo import CaffeImport, import_caffe, open_directory, parse_front_matter
from netspec.model_zoo.zoo import Zoo, ZooError

DEPLOY = """name: "TinyBGR"
input: "data"
input_dim: 10
input_dim: 3
input_dim: 6
input_dim: 6
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 engine: CAFFE } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "fc" type: "InnerProduct" bottom: "pool1" top: "fc" inner_product_param { num_output: 3 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""
TRAIN_VAL = """name: "TinyBGR"
layer { name: "data" type: "Data" top: "data" top: "label"
  transform_param { mean_value: 104 mean_value: 117 mean_value: 123 }
  data_param { source: "examples/tiny_bgr/train_lmdb" batch_size: 8 backend: LMDB } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "fc" type: "InnerProduct" bottom: "pool1" top: "fc" inner_product_param { num_output: 3 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""
SOLVER = """net: "models/tiny_bgr/train_val.prototxt"
base_lr: 0.01
lr_policy: "step"
gamma: 0.1
stepsize: 100
max_iter: 300
momentum: 0.9
weight_decay: 0.0005
snapshot_prefix: "models/tiny_bgr/tiny_bgr_train"
solver_mode: GPU
"""
README = """---
name: Tiny BGR net
caffemodel: tiny_bgr.caffemodel
caffemodel_url: URL
license: CC0-1.0
sha1: SHA1
caffe_commit: 9b891540183ddc834a02b2bd81b31afae71b2153
gist_id: 0123456789abcdef0123
---

A three-class net on 6x6 images, written by netspec's tests.  Subtract the mean B, G, R = 104, 117, 123.
"""
MEAN = (104.0, 117.0, 123.0)
LABELS = ["ant", "bee", "cow"]
_rng = np.random.default_rng(35)
WEIGHTS = {"conv1": [_rng.normal(0, 0.02, (4, 3, 3, 3)), _rng.normal(0, 0.1, 4)],
           "fc": [_rng.normal(0, 0.1, (3, 16)), _rng.normal(0, 0.1, 3)]}


def caffemodel_bytes(weights: dict = WEIGHTS) -> bytes:
    """The tiny net's weights as a .caffemodel (float32, as Caffe stores them)."""
    return caffemodel({name: [a.astype(np.float32) for a in arrays] for name, arrays in weights.items()}, v1=False)


def sha1_of(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()  # noqa: S324 - the digest Caffe's readmes publish


def make_model_dir(folder: Path, url: str, beside: bool = False, data: bytes | None = None) -> Path:
    """A Caffe model directory: readme.md naming tiny_bgr.caffemodel at ``url`` with the SHA-1 of ``data`` (default:
    the tiny net's caffemodel), the three prototxts, and the caffemodel beside the readme when ``beside``."""
    data = caffemodel_bytes() if data is None else data
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "readme.md").write_text(README.replace("URL", url).replace("SHA1", sha1_of(data)))
    for name, text in (("deploy.prototxt", DEPLOY), ("train_val.prototxt", TRAIN_VAL), ("solver.prototxt", SOLVER)):
        (folder / name).write_text(text)
    if beside:
        (folder / "tiny_bgr.caffemodel").write_bytes(data)
    return folder


def make_tree(root: Path, url: str) -> Path:
    """A Caffe models tree at ``root``, served at ``url``: ``tiny_bgr/`` and, elsewhere, the caffemodel it names."""
    (root / "weights").mkdir(parents=True)
    (root / "weights" / "tiny_bgr.caffemodel").write_bytes(caffemodel_bytes())
    make_model_dir(root / "tiny_bgr", f"{url}/weights/tiny_bgr.caffemodel")
    return root


def caffe_forward(rgb: np.ndarray, bgr: bool = True) -> np.ndarray:
    """The tiny net as Caffe computes it, in float64, on an H x W x 3 RGB image: B, G, R planes (R, G, B when not
    ``bgr``) less the mean, 3x3 convolution, ReLU, 2x2 max pooling, inner product, softmax."""
    planes = (rgb[..., ::-1] if bgr else rgb).transpose(2, 0, 1).astype(np.float64)
    x = planes - np.reshape(MEAN, (3, 1, 1))
    w, b = WEIGHTS["conv1"]
    conv = np.array([[[(w[o] * x[:, i:i + 3, j:j + 3]).sum() + b[o] for j in range(4)] for i in range(4)]
                     for o in range(4)])
    pooled = np.maximum(conv, 0).reshape(4, 2, 2, 2, 2).max(axis=(2, 4))
    scores = WEIGHTS["fc"][0] @ pooled.ravel() + WEIGHTS["fc"][1]
    exp = np.exp(scores - scores.max())
    return exp / exp.sum()


def write_image(path: Path) -> np.ndarray:
    """A 6x6 colour image; returns its RGB pixels."""
    pixels = np.random.default_rng(3).integers(0, 256, (6, 6, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return pixels


REDIRECTS = {".moved": "ftp://127.0.0.1/tiny_bgr.caffemodel",  # to an FTP server
             ".badport": "http://127.0.0.1:abc/tiny_bgr.caffemodel"}  # to a URL no server can answer


class TreeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a folder with directory listings, as a Caffe models tree is served; a .caffemodel is sent whole or from
    the offset of a ``Range: bytes=N-`` request, and when the server's ``cut`` is set, the first one stops half way
    and the connection closes.  The server's ``ranges`` records each caffemodel request's Range header, its
    ``paths`` the path of every request.  A file ending as a key of REDIRECTS has moved to its value; one ending
    in ``.huge`` is announced as a terabyte."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.server.paths.append(self.path)
        moved = next((target for ending, target in REDIRECTS.items() if self.path.endswith(ending)), None)
        if moved or self.path.endswith(".huge"):
            self.send_response(302 if moved else 200)
            self.send_header(*(("Location", moved) if moved else ("Content-Length", str(10**12))))
            self.end_headers()
            return
        if not self.path.endswith(".caffemodel"):
            super().do_GET()
            return
        data = Path(self.translate_path(self.path)).read_bytes()
        header = self.headers.get("Range")
        self.server.ranges.append(header)
        start = int(header.removeprefix("bytes=").removesuffix("-")) if header else 0
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(data) - start))
        self.send_header("Accept-Ranges", "bytes")
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        body = data[start:]
        if self.server.cut:
            self.server.cut = False
            body = body[:len(body) // 2]
            self.close_connection = True
        self.wfile.write(body)


@pytest.fixture
def serve():
    """``serve(folder, cut=False)`` serves a folder on 127.0.0.1 in a thread; returns its URL and the server (whose
    ``ranges`` and ``paths`` record its requests).  Every server is shut down after the test."""
    servers = []

    def start(folder: Path, cut: bool = False) -> tuple[str, http.server.ThreadingHTTPServer]:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(TreeHandler,
                                                                                     directory=str(folder)))
        server.daemon_threads = True
        server.cut, server.ranges, server.paths = cut, [], []
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}", server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def served_tree(tmp_path: Path, serve, cut: bool = False) -> tuple[str, http.server.ThreadingHTTPServer]:
    """A models tree served over HTTP at ``tmp_path/models``: its URL and its server."""
    root = tmp_path / "models"
    root.mkdir()
    url, server = serve(root, cut)
    make_tree(root, url)
    return url, server


# ---- import-caffe --------------------------------------------------------------------------------
def test_a_directory_over_http_is_imported_verified_and_predicts_as_caffe_would_in_bgr(tmp_path, serve):
    url, server = served_tree(tmp_path, serve)
    zoo = tmp_path / "zoo"
    (tmp_path / "labels.txt").write_text("\n".join(LABELS) + "\n")
    stdout = ok("zoo", "import-caffe", f"{url}/tiny_bgr", "--mean-value", "104,117,123", "--labels",
                tmp_path / "labels.txt", "--zoo", zoo).splitlines()
    assert stdout[0].startswith("installed tiny_bgr@1 (4 files, ") and stdout[0].endswith(
        f"bytes, all verified) in {zoo}/models/tiny_bgr/1")
    assert stdout[1:] == ["dropped (no netspec equivalent): deploy.prototxt: layer 'conv1': convolution_param.engine"]
    assert server.ranges == [None] and not (zoo / ".partial").exists()
    assert ok("zoo", "verify", "--zoo", zoo).strip() == f"every model in {zoo}: every file matches its card"

    card = Zoo(str(zoo)).card("tiny_bgr")
    sha1 = sha1_of(caffemodel_bytes())
    assert (card.summary, card.license, card.input.shape, card.input.channels, card.input.mean_value,
            card.input.label_names) == ("Tiny BGR net", "CC0-1.0", [3, 6, 6], "BGR", list(MEAN), LABELS)
    caffe = card.provenance.caffe
    assert (caffe.url, caffe.caffemodel, caffe.caffemodel_url, caffe.sha1, caffe.caffe_commit, caffe.gist_id) == (
        f"{url}/tiny_bgr", "tiny_bgr.caffemodel", f"{url}/weights/tiny_bgr.caffemodel", sha1,
        "9b891540183ddc834a02b2bd81b31afae71b2153", "0123456789abcdef0123")
    assert caffe.readme.startswith("A three-class net on 6x6 images") and card.provenance.iterations is None
    ok("zoo", "download", "tiny_bgr", "--from", zoo, "--zoo", tmp_path / "zooB")  # the card travels as any other
    assert Zoo(str(tmp_path / "zooB")).card("tiny_bgr").provenance.caffe == caffe
    folder = zoo / "models" / "tiny_bgr" / "1"
    assert (folder / "deploy.yaml").read_text().startswith(
        f"# imported from {url}/tiny_bgr/deploy.prototxt by netspec zoo import-caffe\n")
    readme = (folder / "README.md").read_text()
    assert f"- weights {url}/weights/tiny_bgr.caffemodel, SHA-1 {sha1} (checked)" in readme
    assert readme.endswith("## Caffe readme\n\nA three-class net on 6x6 images, written by netspec's tests.  Subtract "
                           "the mean B, G, R = 104, 117, 123.\n")

    # the train net and solver keep Caffe's paths; the solver trains the model's train net
    assert (card.train_net, card.solver) == ("train_net.yaml", "solver.yaml")
    solver = yaml.safe_load((folder / "solver.yaml").read_text())
    assert (solver["net"], solver["snapshot_prefix"], solver["solver_mode"]) == (
        "train_net.yaml", "models/tiny_bgr/tiny_bgr_train", "GPU")
    data = yaml.safe_load((folder / "train_net.yaml").read_text())["layers"][0]
    assert data["data_param"]["source"] == "examples/tiny_bgr/train_lmdb"
    assert data["transform_param"]["channel_order"] == "BGR"

    pixels = write_image(tmp_path / "image.png")
    result = json.loads(ok("predict", "tiny_bgr", tmp_path / "image.png", "--zoo", zoo, "--json"))
    got = {p["name"]: p["probability"] for p in result["results"][0]["predictions"]}
    expected = caffe_forward(pixels)
    np.testing.assert_allclose([got[name] for name in LABELS], expected, rtol=1e-5)
    assert np.argmax(caffe_forward(pixels, bgr=False)) != np.argmax(expected)  # in R, G, B it would answer otherwise


def test_a_local_directory_takes_the_caffemodel_beside_its_readme_or_given_or_at_a_file_url(tmp_path):
    nowhere = "http://127.0.0.1:9/tiny_bgr.caffemodel"  # never asked: the weights are on this machine
    directory = make_model_dir(tmp_path / "models" / "tiny_bgr", nowhere, beside=True)
    zoo = tmp_path / "zoo"
    assert ok("zoo", "import-caffe", directory, "--zoo", zoo).splitlines()[1:] == [
        "dropped (no netspec equivalent): deploy.prototxt: layer 'conv1': convolution_param.engine",
        "note: no mean is subtracted from the input: Caffe models usually need the one their readme names "
        "(--mean-value B,G,R)"]
    card = Zoo(str(zoo)).card("tiny_bgr")
    assert card.input.mean_value == [] and "- no mean is subtracted from the input" in (
        zoo / "models" / "tiny_bgr" / "1" / "README.md").read_text()

    moved = tmp_path / "elsewhere.caffemodel"
    (directory / "tiny_bgr.caffemodel").rename(moved)
    assert "installed other@1 " in ok("zoo", "import-caffe", directory, "--name", "other", "--weights", moved,
                                      "--zoo", zoo)
    (directory / "weights").mkdir()
    moved = moved.rename(directory / "weights" / "elsewhere.caffemodel")  # (a file: URL reads inside the directory)
    readme = directory / "readme.md"
    readme.write_text(readme.read_text().replace(nowhere, moved.as_uri()))
    assert "installed third@1 " in ok("zoo", "import-caffe", directory.as_uri(), "--name", "third", "--zoo", zoo)
    weights = [(zoo / "models" / name / "1" / "weights.h5").read_bytes() for name in ("tiny_bgr", "other", "third")]
    assert weights[0] == weights[1] == weights[2]
    assert fails("zoo", "import-caffe", directory, "--name", "third", "--zoo", zoo) == (
        f"error: third@1 is already in the zoo {zoo}; pass --force to replace it")


def test_a_file_url_is_read_relative_to_its_directory_which_the_card_names_by_absolute_uri(tmp_path):
    make_tree(tmp_path / "models", "http://127.0.0.1:9")
    directory = tmp_path / "models" / "Upper_Case"
    (tmp_path / "models" / "tiny_bgr").rename(directory)
    readme = directory / "readme.md"
    (tmp_path / "models" / "weights").rename(directory / "weights")
    readme.write_text(readme.read_text().replace("http://127.0.0.1:9/weights/", "file:weights/"))
    (tmp_path / "elsewhere").mkdir()
    result = run("zoo", "import-caffe", "../models/Upper_Case", "--zoo", "../zoo", cwd=tmp_path / "elsewhere")
    assert result.returncode == 0 and "installed upper_case@1 " in result.stdout, result.stderr
    caffe = Zoo(str(tmp_path / "zoo")).card("upper_case").provenance.caffe
    assert (caffe.url, caffe.caffemodel_url) == (directory.as_uri(), "file:weights/tiny_bgr.caffemodel")

    readme.write_text(readme.read_text().replace("file:weights/", "file:nowhere/"))
    assert fails("zoo", "import-caffe", directory, "--name", "gone", "--zoo", tmp_path / "zoo") == (
        f"error: {directory}/nowhere/tiny_bgr.caffemodel: not found (the readme's caffemodel_url "
        "file:nowhere/tiny_bgr.caffemodel)")


@pytest.mark.parametrize("url", ["file:../weights/tiny_bgr.caffemodel", "file:{root}/weights/tiny_bgr.caffemodel",
                                 "file:weights/../../weights/tiny_bgr.caffemodel"])
def test_a_file_url_outside_the_model_directory_is_refused_unread(tmp_path, url):
    make_tree(tmp_path / "models", "http://127.0.0.1:9")
    directory = tmp_path / "models" / "tiny_bgr"
    url = url.format(root=tmp_path / "models")
    readme = directory / "readme.md"
    readme.write_text(readme.read_text().replace("http://127.0.0.1:9/weights/tiny_bgr.caffemodel", url))
    assert fails("zoo", "import-caffe", directory, "--zoo", tmp_path / "zoo") == (
        f"error: the readme's caffemodel_url {url} names a file outside the model directory {directory}; refused "
        "(give the file with --weights)")


# ---- Caffe models trees ------------------------------------------------------------------------------
def test_a_models_tree_is_listed_and_its_models_downloaded_by_name(tmp_path, serve):
    url, _ = served_tree(tmp_path, serve)
    root = tmp_path / "models"
    (root / "broken").mkdir()
    (root / "broken" / "readme.md").write_text("no front matter\n")
    for source in (root, url):
        assert ok("zoo", "list", "--from", source).splitlines()[2:] == [
            "broken    1         Caffe model  (its readme cannot be imported: netspec zoo import-caffe says why)",
            "tiny_bgr  1         Caffe model  Tiny BGR net"]
    for index, source in enumerate((url, root)):
        zoo = tmp_path / f"zoo{index}"
        assert ok("zoo", "download", "tiny_bgr", "--from", tmp_path / "nowhere", "--from", source, "--zoo",
                  zoo).startswith("installed tiny_bgr@1 (4 files, ")
        expected = f"{url}/tiny_bgr" if source == url else (root / "tiny_bgr").as_uri()  # a folder as an absolute URI
        assert Zoo(str(zoo)).card("tiny_bgr").provenance.caffe.url == expected
    assert fails("zoo", "download", "tiny_bgr@2", "--from", url, "--zoo", tmp_path / "zoo2") == (
        f"error: no source has tiny_bgr@2: {url}: has no tiny_bgr@2 (no index.json, nor a Caffe model directory "
        "tiny_bgr/readme.md, which is version 1)")
    assert fails("zoo", "list", "--from", root / "weights") == (
        f"error: {root / 'weights'}: neither a netspec zoo (no index.json) nor a Caffe models tree (no "
        "<name>/readme.md)")


def test_a_tree_lists_its_folders_under_their_lower_case_names_and_leaves_out_the_others(tmp_path, serve):
    url, server = served_tree(tmp_path, serve)
    root = tmp_path / "models"
    shutil.copytree(root / "tiny_bgr", root / "VGG_Like")
    for odd in ("my model", "x\n", "Tiny_BGR"):  # no model name, even in lower case; the name of another folder
        shutil.copytree(root / "tiny_bgr", root / odd)
    for source in (root, url):
        assert ok("zoo", "list", "--from", source).splitlines()[2:] == [
            "tiny_bgr  1         Caffe model  Tiny BGR net",
            "vgg_like  1         Caffe model  Tiny BGR net",
            f"note: 3 folder(s) left out: their names, in lower case, are no model names (letters, digits, '.', '_', "
            f"'-') or another folder's; netspec zoo import-caffe {source}/DIR --name NAME imports one"]
    assert not [path for path in server.paths if "%0A" in path.upper() or "my%20model" in path]
    for index, source in enumerate((url, root)):
        zoo = tmp_path / f"zoo{index}"
        assert ok("zoo", "download", "vgg_like", "--from", source, "--zoo", zoo).startswith("installed vgg_like@1 ")
        expected = f"{url}/VGG_Like" if source == url else (root / "VGG_Like").as_uri()
        assert Zoo(str(zoo)).card("vgg_like").provenance.caffe.url == expected
    assert fails("zoo", "download", "my", "--from", root, "--zoo", tmp_path / "zoo2") == (
        f"error: no source has my: {root}: has no my (no index.json, nor a Caffe model directory my/readme.md, which "
        "is version 1)")


def test_a_tree_s_readmes_are_read_for_its_first_thousand_model_folders_only(tmp_path):
    root = tmp_path / "models"
    make_model_dir(root / "m0000", "http://127.0.0.1:9/x")
    for index in range(1, 1001):
        (root / f"m{index:04}").mkdir()
    (root / "m0001" / "readme.md").write_text(README.replace("URL", "'http://[::1'"))  # no crash: one model's fault
    assert ok("zoo", "list", "--from", root).splitlines()[2:] == [
        "m0000  1         Caffe model  Tiny BGR net",
        "m0001  1         Caffe model  (its readme cannot be imported: netspec zoo import-caffe says why)",
        "note: only the first 1,000 of 1,001 model folders were read"]


def test_a_download_cut_off_resumes_where_it_stopped_for_the_same_sha1_only(tmp_path, serve):
    url, server = served_tree(tmp_path, serve, cut=True)
    zoo = tmp_path / "zoo"
    size = len(caffemodel_bytes())
    assert fails("zoo", "import-caffe", f"{url}/tiny_bgr", "--zoo", zoo) == (
        f"error: {url}/weights/tiny_bgr.caffemodel: the connection closed after {size // 2} of {size} bytes; run the "
        "same command again to resume")
    assert not (zoo / "models").exists()
    work = zoo / ".partial" / "caffe-tiny_bgr@1"  # not the folder of a zoo download of tiny_bgr@1
    assert (work / f"{sha1_of(caffemodel_bytes())}.caffemodel.part").stat().st_size == size // 2
    assert "installed tiny_bgr@1 " in ok("zoo", "import-caffe", f"{url}/tiny_bgr", "--zoo", zoo)
    assert server.ranges == [None, f"bytes={size // 2}-"] and not (zoo / ".partial").exists()

    # a partial file is continued only by the file of its SHA-1, and a zoo download's partial files are left alone
    server.cut = True
    assert fails("zoo", "import-caffe", f"{url}/tiny_bgr", "--name", "again", "--zoo", zoo).endswith("to resume")
    download = zoo / ".partial" / "again@1" / "weights.h5.part"
    download.parent.mkdir()
    download.write_bytes(b"a zoo download's")
    other = caffemodel_bytes({"conv1": [w + 1 for w in WEIGHTS["conv1"]], "fc": WEIGHTS["fc"]})
    (tmp_path / "models" / "weights" / "tiny_bgr.caffemodel").write_bytes(other)
    make_model_dir(tmp_path / "models" / "tiny_bgr", f"{url}/weights/tiny_bgr.caffemodel", data=other)
    assert "installed again@1 " in ok("zoo", "import-caffe", f"{url}/tiny_bgr", "--name", "again", "--zoo", zoo)
    assert server.ranges[-1] is None and tree(zoo / ".partial") == {"again@1/weights.h5.part": b"a zoo download's"}


# ---- bad input: one line, exit status 1, the zoo as it was --------------------------------------------
@pytest.mark.parametrize("change, message", [
    (lambda t: t.replace("---\n", "", 1), ": no front matter: a Caffe model's readme starts with YAML between two "
                                          "'---' lines naming caffemodel, caffemodel_url, sha1"),
    (lambda t: "---\n- caffemodel\n- sha1\n---" + t.split("---")[2],
     ":2: the front matter must be a mapping (caffemodel: ..., caffemodel_url: ..., sha1: ...), not ['caffemodel', "
     "'sha1']"),
    (lambda t: t.replace("license: CC0-1.0", "license: !!python/object/apply:os.system ['touch PWNED']"),
     ":5: the front matter has a YAML tag (tag:yaml.org,2002:python/object/apply:os.system); netspec reads front "
     "matter as plain text, never as objects"),
    (lambda t: t.replace("name: Tiny BGR net", "name: [Tiny"), ":3: malformed YAML: expected ',' or ']', but got ':'"),
    (lambda t: "".join(line for line in t.splitlines(True) if not line.startswith(("sha1", "caffemodel_url"))),
     ":1: the front matter lacks caffemodel_url, sha1 (a Caffe model's readme names caffemodel, caffemodel_url, "
     "sha1)"),
    (lambda t: t.replace("caffemodel: tiny_bgr", "caffemodel: ../tiny_bgr"),
     ":3: caffemodel '../tiny_bgr.caffemodel' is not a plain file name (no folders, no '..'): it names the weights "
     "file beside the readme"),
    (lambda t: t.replace("caffemodel: tiny_bgr", "caffemodel: weights/tiny_bgr"),
     ":3: caffemodel 'weights/tiny_bgr.caffemodel' is not a plain file name"),
    (lambda t: t.replace("http://127.0.0.1:9/", "ftp://127.0.0.1/"),
     ":4: caffemodel_url 'ftp://127.0.0.1/tiny_bgr.caffemodel' is not an http, https or file URL"),
    (lambda t: t.replace("sha1: ", "sha1: 12"), ":6: sha1 '12"),
    (lambda t: "# Tiny BGR\n\n" + t, ": no front matter"),  # two '---' rules in the text are no front matter
    (lambda t: t.replace("http://127.0.0.1:9/tiny_bgr.caffemodel", "'http://[::1'"),
     ":4: caffemodel_url 'http://[::1' is not a URL netspec can fetch: Invalid IPv6 URL"),
    (lambda t: t.replace("http://127.0.0.1:9/", "http:///"),
     ":4: caffemodel_url 'http:///tiny_bgr.caffemodel' is not a URL netspec can fetch: no host"),
    (lambda t: t.replace("127.0.0.1:9", "h:abc"),
     ":4: caffemodel_url 'http://h:abc/tiny_bgr.caffemodel' is not a URL netspec can fetch: Port could not be cast "
     "to integer value as 'abc'"),
    (lambda t: t.replace(":9/tiny_bgr", ":9/tiny bgr"),
     ":4: caffemodel_url 'http://127.0.0.1:9/tiny bgr.caffemodel' is not a URL netspec can fetch: a space, a control "
     "or a non-ASCII character (percent-encode it)"),
    (lambda t: t.replace("http://127.0.0.1:9/", "file://elsewhere/"),
     ":4: caffemodel_url 'file://elsewhere/tiny_bgr.caffemodel' names a file on another machine (elsewhere)"),
])
def test_bad_front_matter_is_refused_in_one_line(tmp_path, change, message):
    zoo, before = zoo_with_a_model(tmp_path)
    directory = make_model_dir(tmp_path / "bad", "http://127.0.0.1:9/tiny_bgr.caffemodel", beside=True)
    readme = directory / "readme.md"
    readme.write_text(change(readme.read_text()))
    (directory / "tiny_bgr.caffemodel").unlink()  # read from its URL: checked before anything is fetched
    result = run("zoo", "import-caffe", directory, "--zoo", zoo, cwd=tmp_path)  # where a YAML tag's command would run
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: {readme}{message}"), result.stderr
    assert tree(zoo) == before and not (zoo / ".partial").exists() and not (tmp_path / "PWNED").exists()


def zoo_with_a_model(tmp_path: Path) -> tuple[Path, dict]:
    """A zoo holding one imported model, and its files."""
    zoo = tmp_path / "zoo"
    ok("zoo", "import-caffe", make_model_dir(tmp_path / "keep", "http://127.0.0.1:9/x", beside=True), "--zoo", zoo)
    return zoo, tree(zoo)


def test_weights_that_are_not_the_readme_s_or_do_not_fit_the_net_are_refused(tmp_path, serve):
    zoo, before = zoo_with_a_model(tmp_path)
    directory = make_model_dir(tmp_path / "tiny_bgr", "http://127.0.0.1:9/x", beside=True)
    beside = directory / "tiny_bgr.caffemodel"
    other = tmp_path / "other.caffemodel"
    other.write_bytes(caffemodel_bytes()[:-4])
    refusals = [
        (("--weights", other), f"error: {other}: SHA-1 {sha1_of(other.read_bytes())} does not match the "
                               f"{sha1_of(beside.read_bytes())} of the readme; nothing was imported"),
        (("--weights", tmp_path / "none"), f"error: {tmp_path / 'none'}: not found"),
    ]
    for extra, message in refusals:
        assert fails("zoo", "import-caffe", directory, "--zoo", zoo, *extra) == message
    wrong = caffemodel_bytes({"conv1": [np.zeros((4, 3, 5, 5)), np.zeros(4)], "fc": WEIGHTS["fc"]})
    make_model_dir(directory, "http://127.0.0.1:9/x", beside=True, data=wrong)
    assert fails("zoo", "import-caffe", directory, "--zoo", zoo) == (
        f"error: {beside}: the blobs do not match the net: layer 'conv1' blob 0 is [4, 3, 5, 5] in the file, "
        "[4, 3, 3, 3] in the net")
    (directory / "deploy.prototxt").unlink()
    assert fails("zoo", "import-caffe", directory, "--zoo", zoo) == f"error: {directory}/deploy.prototxt: not found"

    url, _ = served_tree(tmp_path, serve)
    served = tmp_path / "models" / "weights" / "tiny_bgr.caffemodel"
    served.write_bytes(served.read_bytes()[:-4])  # a file cut short at its source: only its digest can tell
    assert fails("zoo", "import-caffe", f"{url}/tiny_bgr", "--zoo", zoo) == (
        f"error: {url}/weights/tiny_bgr.caffemodel: SHA-1 {sha1_of(served.read_bytes())} does not match the "
        f"{sha1_of(caffemodel_bytes())} of the readme; nothing was imported")
    make_model_dir(tmp_path / "moved", f"{url}/weights/tiny_bgr.moved")
    assert fails("zoo", "import-caffe", tmp_path / "moved", "--zoo", zoo) == (
        f"error: {url}/weights/tiny_bgr.moved: HTTP 302 a redirect to ftp: refused")
    assert tree(zoo) == before and not (zoo / ".partial").exists()


def test_a_readme_over_http_may_not_name_a_file_on_this_machine(tmp_path, serve):
    zoo, before = zoo_with_a_model(tmp_path)
    url, _ = served_tree(tmp_path, serve)
    readme = tmp_path / "models" / "tiny_bgr" / "readme.md"
    readme.write_text(readme.read_text().replace(f"{url}/weights/tiny_bgr.caffemodel", "file:/etc/passwd"))
    message = (f"{url}/tiny_bgr/readme.md:4: caffemodel_url 'file:/etc/passwd' names a file on this machine, which "
               "only a readme on this machine may (this one was read over HTTP)")
    assert fails("zoo", "import-caffe", f"{url}/tiny_bgr", "--zoo", zoo) == f"error: {message}"
    assert fails("zoo", "download", "tiny_bgr", "--from", url, "--zoo", zoo) == (
        f"error: {message}")
    assert ok("zoo", "list", "--from", url).splitlines()[2] == (
        "tiny_bgr  1         Caffe model  (its readme cannot be imported: netspec zoo import-caffe says why)")
    assert tree(zoo) == before and not (zoo / ".partial").exists()


def test_urls_no_server_answers_are_refused_for_good_and_leave_no_partial_folder(tmp_path, serve):
    zoo, before = zoo_with_a_model(tmp_path)
    for location in ("http://[::1", "http:///tiny_bgr", "https://h:99999/tiny_bgr"):
        assert fails("zoo", "import-caffe", location, "--zoo", zoo).startswith(
            f"error: {location}: not a URL netspec can fetch: ")
        assert fails("zoo", "list", "--from", location).startswith(f"error: {location}: not a URL netspec can fetch: ")
    url, _ = served_tree(tmp_path, serve)
    make_model_dir(tmp_path / "moved", f"{url}/weights/tiny_bgr.badport")
    assert fails("zoo", "import-caffe", tmp_path / "moved", "--zoo", zoo) == (
        f"error: {url}/weights/tiny_bgr.badport: redirects to a URL netspec cannot fetch: nonnumeric port: 'abc'")
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{unused.getsockname()[1]}/tiny_bgr.caffemodel"
    make_model_dir(tmp_path / "closed", closed)
    message = fails("zoo", "import-caffe", tmp_path / "closed", "--zoo", zoo)
    assert message.startswith(f"error: {closed}: cannot connect: ") and "resume" not in message
    assert tree(zoo) == before and not (zoo / ".partial").exists()


def test_errors_of_the_converted_files_name_the_directory_s_own(tmp_path):
    zoo, before = zoo_with_a_model(tmp_path)
    directory = make_model_dir(tmp_path / "tiny_bgr", "http://127.0.0.1:9/x", beside=True)
    (directory / "deploy.prototxt").write_text(DEPLOY + 'layer { name: "save" type: "HDF5Output" bottom: "prob" '
                                                         'hdf5_output_param { file_name: "out.h5" } }\n')
    assert fails("zoo", "import-caffe", directory, "--zoo", zoo) == (
        f"error: {directory}/deploy.prototxt: layer 'save' (HDF5Output) writes files; a net shared through a zoo runs "
        "without side effects unless its user allows them (--allow-side-effects)")
    (directory / "train_val.prototxt").write_text(TRAIN_VAL.replace('"SoftmaxWithLoss"', '"SoftmaxWithLos"'))
    assert fails("zoo", "import-caffe", directory, "--zoo", zoo) == (
        f"error: {directory}/train_val.prototxt: layer 'loss': type 'SoftmaxWithLos' has no netspec equivalent "
        "(netspec layers lists the types)")
    (directory / "train_val.prototxt").write_text(TRAIN_VAL.replace("num_output: 3", "num_output: 2.5"))
    assert fails("zoo", "import-caffe", directory, "--zoo", zoo) == (  # no line: the converted file's are not its
        f"error: {directory}/train_val.prototxt: layer 'fc': inner_product_param.num_output: expected int, got float "
        "2.5")

    four = caffemodel_bytes({"conv1": [np.zeros((4, 4, 3, 3)), np.zeros(4)], "fc": WEIGHTS["fc"]})
    make_model_dir(directory, "http://127.0.0.1:9/x", beside=True, data=four)
    (directory / "deploy.prototxt").write_text(DEPLOY.replace("input_dim: 3", "input_dim: 4"))
    assert fails("zoo", "import-caffe", directory, "--zoo", zoo) == (
        f"error: {directory}/deploy.prototxt: the input 'data' must be [C, H, W] with 1 or 3 channels and at most "
        "89,478,485 pixels, got [4, 6, 6]")
    assert tree(zoo) == before and not (zoo / ".partial").exists()

    gray = caffemodel_bytes({"conv1": [np.zeros((4, 1, 3, 3)), np.zeros(4)], "fc": WEIGHTS["fc"]})
    make_model_dir(directory, "http://127.0.0.1:9/x", beside=True, data=gray)
    (directory / "deploy.prototxt").write_text(DEPLOY.replace("input_dim: 3", "input_dim: 1"))
    ok("zoo", "import-caffe", directory, "--zoo", zoo)
    assert Zoo(str(zoo)).card("tiny_bgr").input.channels == "GRAY"  # BGR for three channels only


def test_front_matter_values_are_their_text_as_written_on_one_line():
    digits = "0123456789" * 4
    text = (f"\n---\nname: |\n  Tiny\n  BGR   net\ncaffemodel: x.caffemodel\ncaffemodel_url: http://h/x\n"
            f"sha1: {digits}\ngist_id: 0123\ncaffe_commit: 1e5\nlicense: yes\n---\nText\n")
    origin = parse_front_matter(text, "readme.md", local=False)
    assert (origin.name, origin.sha1, origin.gist_id, origin.caffe_commit, origin.license, origin.readme) == (
        "Tiny BGR net", digits, "0123", "1e5", "yes", "Text")


def test_a_download_needs_room_for_the_size_the_server_gives_which_the_progress_shows(tmp_path, serve, monkeypatch):
    url, _ = served_tree(tmp_path, serve)
    size = len(caffemodel_bytes())
    totals, counts = [], []

    @contextlib.contextmanager
    def progress(total):
        totals.append(total)
        yield counts.append

    card, _ = import_caffe(open_directory(f"{url}/tiny_bgr", 5), Zoo(str(tmp_path / "zoo")), CaffeImport(), progress)
    assert card.ref == "tiny_bgr@1" and totals == [size] and sum(counts) == size

    monkeypatch.setattr(shutil, "disk_usage", lambda _path: types.SimpleNamespace(free=1000))
    zoo = tmp_path / "full"
    with pytest.raises(ZooError) as refused:
        import_caffe(open_directory(f"{url}/tiny_bgr", 5), Zoo(str(zoo)), CaffeImport(), progress)
    spare = 3 * size // 20 + (64 << 20)
    assert str(refused.value) == (f"not enough disk space to download tiny_bgr@1: its files need {3 * size:,} more "
                                  f"bytes and {spare:,} to spare, {zoo} has 1,000 bytes free")
    assert totals == [size] and tree(zoo) == {}


def test_a_caffemodel_announced_larger_than_any_is_refused_before_it_is_read(tmp_path, serve):
    zoo, before = zoo_with_a_model(tmp_path)
    url, server = served_tree(tmp_path, serve)
    make_model_dir(tmp_path / "huge", f"{url}/weights/tiny_bgr.huge")
    assert fails("zoo", "import-caffe", tmp_path / "huge", "--zoo", zoo) == (
        f"error: {url}/weights/tiny_bgr.huge: the server has 1,000,000,000,000 bytes, more than the 2,147,483,647 "
        "netspec takes of a file no card lists; refused")
    assert tree(zoo) == before and not (zoo / ".partial").exists()


def test_a_multi_line_name_is_one_line_of_the_listing_and_the_card(tmp_path):
    directory = make_model_dir(tmp_path / "models" / "tiny_bgr", "http://127.0.0.1:9/x", beside=True)
    readme = directory / "readme.md"
    readme.write_text(readme.read_text().replace("name: Tiny BGR net", "name: >-\n  Tiny\n\n  BGR net"))
    assert ok("zoo", "list", "--from", tmp_path / "models").splitlines()[2:] == [
        "tiny_bgr  1         Caffe model  Tiny BGR net"]
    ok("zoo", "import-caffe", directory, "--zoo", tmp_path / "zoo")
    assert (tmp_path / "zoo" / "models" / "tiny_bgr" / "1" / "README.md").read_text().startswith(
        "# tiny_bgr 1\n\nTiny BGR net\n")


def test_the_guides_script_writes_the_tree_run_as_the_guide_runs_it(tmp_path):
    """``python3 tests/model_zoo/test_zoo_caffe.py caffe-models URL`` from the repository's root, outside pytest."""
    script = Path(__file__).relative_to(Path(__file__).parent.parent.parent)
    result = subprocess.run([sys.executable, str(script), str(tmp_path / "caffe-models"), "http://127.0.0.1:8000"],
                            capture_output=True, text=True, cwd=Path(__file__).parent.parent.parent,
                            env={key: value for key, value in os.environ.items() if key != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "caffe-models" / "tiny_bgr" / "readme.md").is_file()
    assert (tmp_path / "image.png").is_file() and (tmp_path / "labels.txt").is_file()


if __name__ == "__main__":  # the guide's walk-through: python3 tests/model_zoo/test_zoo_caffe.py TREE URL
    root, base = Path(sys.argv[1]), sys.argv[2].rstrip("/")
    make_tree(root, base)
    write_image(root.parent / "image.png")
    (root.parent / "labels.txt").write_text("\n".join(LABELS) + "\n")
    print(f"wrote {root}/tiny_bgr (readme.md, deploy.prototxt, train_val.prototxt, solver.prototxt), "
          f"{root}/weights/tiny_bgr.caffemodel, {root.parent / 'image.png'} and {root.parent / 'labels.txt'}")
