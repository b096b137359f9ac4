"""Caffe Model Zoo directories as a zoo source: ``zoo import-caffe`` over HTTP and from folders, Caffe models trees for
``zoo list --from`` and ``zoo download --from``, resumed downloads, and one-line refusals that leave the zoo as it was.

The model directory is made here: a small BGR conv net in Caffe's text format and a caffemodel written in protobuf
wire format with known weights.  ``python3 tests/test_zoo_caffe.py TREE URL`` writes the same tree (its
caffemodel_url under URL) with an image and label names beside it, for the README's walk-through.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from test_caffe_import import caffemodel
from test_cli import fails, ok, run
from test_zoo import tree

from netspec.model_zoo.zoo import Zoo

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


class TreeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a folder with directory listings, as a Caffe models tree is served; a .caffemodel is sent whole or from
    the offset of a ``Range: bytes=N-`` request, and when the server's ``cut`` is set, the first one stops half way
    and the connection closes.  The server's ``ranges`` records each caffemodel request's Range header.  Any
    ``.moved`` file has moved to an FTP server."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path.endswith(".moved"):
            self.send_response(302)
            self.send_header("Location", "ftp://127.0.0.1/tiny_bgr.caffemodel")
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
    """``serve(folder, cut=False)`` serves a folder on 127.0.0.1 in a thread; returns its URL and the Range headers
    of its caffemodel requests.  Every server is shut down after the test."""
    servers = []

    def start(folder: Path, cut: bool = False) -> tuple[str, list]:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(TreeHandler,
                                                                                     directory=str(folder)))
        server.daemon_threads = True
        server.cut, server.ranges = cut, []
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}", server.ranges

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def served_tree(tmp_path: Path, serve, cut: bool = False) -> tuple[str, list]:
    """A models tree served over HTTP: its URL and the Range headers of its caffemodel requests."""
    root = tmp_path / "models"
    root.mkdir()
    url, ranges = serve(root, cut)
    make_tree(root, url)
    return url, ranges


# ---- import-caffe --------------------------------------------------------------------------------
def test_a_directory_over_http_is_imported_verified_and_predicts_as_caffe_would_in_bgr(tmp_path, serve):
    url, ranges = served_tree(tmp_path, serve)
    zoo = tmp_path / "zoo"
    (tmp_path / "labels.txt").write_text("\n".join(LABELS) + "\n")
    stdout = ok("zoo", "import-caffe", f"{url}/tiny_bgr", "--mean-value", "104,117,123", "--labels",
                tmp_path / "labels.txt", "--zoo", zoo).splitlines()
    assert stdout[0].startswith("installed tiny_bgr@1 (4 files, ") and stdout[0].endswith(
        f"bytes, all verified) in {zoo}/models/tiny_bgr/1")
    assert stdout[1:] == ["dropped (no netspec equivalent): deploy.prototxt: layer 'conv1': convolution_param.engine"]
    assert ranges == [None] and not (zoo / ".partial").exists()
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
    readme = directory / "readme.md"
    readme.write_text(readme.read_text().replace(nowhere, moved.as_uri()))
    assert "installed third@1 " in ok("zoo", "import-caffe", directory.as_uri(), "--name", "third", "--zoo", zoo)
    weights = [(zoo / "models" / name / "1" / "weights.h5").read_bytes() for name in ("tiny_bgr", "other", "third")]
    assert weights[0] == weights[1] == weights[2]
    assert fails("zoo", "import-caffe", directory, "--name", "third", "--zoo", zoo) == (
        f"error: third@1 is already in the zoo {zoo}; pass --force to replace it")


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
        assert Zoo(str(zoo)).card("tiny_bgr").provenance.caffe.url == f"{source}/tiny_bgr"
    assert fails("zoo", "download", "tiny_bgr@2", "--from", url, "--zoo", tmp_path / "zoo2") == (
        f"error: no source has tiny_bgr@2: {url}: has no tiny_bgr@2 (no index.json, nor a Caffe model directory "
        "tiny_bgr/readme.md, which is version 1)")
    assert fails("zoo", "list", "--from", root / "weights") == (
        f"error: {root / 'weights'}: neither a netspec zoo (no index.json) nor a Caffe models tree (no "
        "<name>/readme.md)")


def test_a_download_cut_off_resumes_where_it_stopped(tmp_path, serve):
    url, ranges = served_tree(tmp_path, serve, cut=True)
    zoo = tmp_path / "zoo"
    size = len(caffemodel_bytes())
    assert fails("zoo", "import-caffe", f"{url}/tiny_bgr", "--zoo", zoo) == (
        f"error: {url}/weights/tiny_bgr.caffemodel: the connection closed after {size // 2} of {size} bytes; run the "
        "same command again to resume")
    assert not (zoo / "models").exists()
    assert (zoo / ".partial" / "tiny_bgr@1" / "weights.caffemodel.part").stat().st_size == size // 2
    assert "installed tiny_bgr@1 " in ok("zoo", "import-caffe", f"{url}/tiny_bgr", "--zoo", zoo)
    assert ranges == [None, f"bytes={size // 2}-"] and not (zoo / ".partial").exists()


# ---- bad input: one line, exit status 1, the zoo as it was --------------------------------------------
@pytest.mark.parametrize("change, message", [
    (lambda t: t.replace("---\n", "", 1), ": no front matter: a Caffe model's readme starts with YAML between two "
                                          "'---' lines naming caffemodel, caffemodel_url, sha1"),
    (lambda t: "---\n- caffemodel\n- sha1\n---" + t.split("---")[2],
     ":2: the front matter must be a mapping (caffemodel: ..., caffemodel_url: ..., sha1: ...), not ['caffemodel', "
     "'sha1']"),
    (lambda t: t.replace("license: CC0-1.0", "license: !!python/object/apply:os.system ['touch PWNED']"),
     ":5: the front matter has a YAML tag (tag:yaml.org,2002:python/object/apply:os.system); netspec reads front "
     "matter as plain text and numbers, never as objects"),
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
])
def test_bad_front_matter_is_refused_in_one_line(tmp_path, change, message):
    zoo, before = zoo_with_a_model(tmp_path)
    directory = make_model_dir(tmp_path / "bad", "http://127.0.0.1:9/tiny_bgr.caffemodel", beside=True)
    readme = directory / "readme.md"
    readme.write_text(change(readme.read_text()))
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


if __name__ == "__main__":  # the README's walk-through: python3 tests/test_zoo_caffe.py TREE URL
    root, base = Path(sys.argv[1]), sys.argv[2].rstrip("/")
    make_tree(root, base)
    write_image(root.parent / "image.png")
    (root.parent / "labels.txt").write_text("\n".join(LABELS) + "\n")
    print(f"wrote {root}/tiny_bgr (readme.md, deploy.prototxt, train_val.prototxt, solver.prototxt), "
          f"{root}/weights/tiny_bgr.caffemodel, {root.parent / 'image.png'} and {root.parent / 'labels.txt'}")
