"""The model zoo: cards, publish, list/show/verify/remove, serve, download (folder, file://, HTTP), predict."""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_cli import fails, ok, run

import netspec
import netspec.model_zoo
from netspec.errors import ConfigError
from netspec.model_zoo.builtin import builtin_cards
from netspec.model_zoo.card import card_yaml, parse_card
from netspec.model_zoo.predict import transformer
from netspec.model_zoo.publish import PublishRequest, publish
from netspec.model_zoo.zoo import Zoo, ZooError, version_key

ROOT = Path(__file__).parent.parent.parent
DEPLOY = ROOT / "configs" / "digits" / "digits_deploy.yaml"



def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (for 'left exactly as before' checks)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def weights(tmp_path) -> Path:
    """Weights of the digits deploy net (from its fillers: enough to publish and compare predictions)."""
    path = tmp_path / "digits.weights.h5"
    netspec.load_net(str(DEPLOY), seed=3).save_weights(path, iteration=7)
    return path


@pytest.fixture
def zoo_a(tmp_path, weights) -> Path:
    """A zoo holding digits@1 and digits@2."""
    zoo = tmp_path / "zooA"
    for version in ("1", "2"):
        publish(PublishRequest(name="digits", version=version, net=str(DEPLOY), weights=str(weights),
                               scale=1 / 255, summary="8x8 digits"), Zoo(str(zoo)))
    return zoo


def digit_png(path: Path, index: int = 5) -> Path:
    from netspec.tools.digits import load_digits

    images, _ = load_digits()
    Image.fromarray(np.round(images[index, 0] * 255).astype(np.uint8)).save(path)
    return path


def original_probabilities(weights: Path, png: Path) -> np.ndarray:
    net = netspec.load_net(str(DEPLOY))
    net.load_weights(weights)
    net.blobs["data"].data[...] = np.asarray(Image.open(png), dtype=np.float32)[None, None] * np.float32(1 / 255)
    net.forward()
    return net.blobs["prob"].data[0].copy()


# ---- cards --------------------------------------------------------------------------------------
CARD = """name: digits
version: '1'
input: {shape: [1, 8, 8], channels: GRAY}
weights: weights.h5
files:
  - {path: deploy.yaml, size: 10, sha256: SHA_A}
  - {path: weights.h5, size: 20, sha256: SHA_B}
""".replace("SHA_A", "a" * 64).replace("SHA_B", "b" * 64)


def test_cards_are_validated_with_their_line():
    card = parse_card(CARD, "model.yaml")
    assert card.ref == "digits@1" and card.referenced_files() == ["deploy.yaml", "weights.h5"]
    for old, new, message in [
        ("name: digits", "name: ../evil", "model.yaml:1: name: '../evil' is not a valid model name"),
        ("path: weights.h5", "path: ../weights.h5", "model.yaml:5: files: '../weights.h5' is not a plain file name"),
        ("path: deploy.yaml", "path: other.yaml", "model.yaml:5: files: 'deploy.yaml' is named by the card but not "
                                                  "listed in files"),
        ("size: 20", "size: -1", "model.yaml:5: files: 'weights.h5' needs a size >= 0 and a 64-digit hex sha256"),
        ("channels: GRAY", "channels: YUV", "model.yaml:3: input.channels: 'YUV' is not one of RGB, BGR, GRAY"),
    ]:
        with pytest.raises(ConfigError) as error:
            parse_card(CARD.replace(old, new), "model.yaml")
        assert str(error.value).startswith(message), str(error.value)
    with pytest.raises(ConfigError, match="model.yaml:1: malformed YAML"):
        parse_card("name: [", "model.yaml")


def test_a_bgr_card_has_its_images_swapped_before_the_mean(tmp_path):
    card = parse_card(CARD.replace("shape: [1, 8, 8], channels: GRAY", "shape: [3, 2, 2], channels: BGR, "
                                   "mean_value: [1, 2, 3]"), "model.yaml")
    prepare = transformer(card, str(tmp_path))
    red = np.zeros((1, 3, 2, 2))
    red[0, 0] = 255
    out = np.empty_like(red)
    prepare.apply(prepare.prepare(red[0])[None], prepare.draw(np.random.default_rng(0), 1), out)
    assert [float(out[0, c].mean()) for c in range(3)] == [-1.0, -2.0, 252.0]


# ---- publish and the local zoo -----------------------------------------------------------------
def test_publish_builds_a_verified_model_and_refuses_a_second_time(zoo_a, weights):
    assert ok("zoo", "publish", "--name", "other", "--net", DEPLOY, "--weights", weights, "--zoo", zoo_a,
              "--mean-value", "3", "--license", "MIT").strip() == f"published other@1 to {zoo_a}/models/other/1"
    assert Zoo(str(zoo_a)).card("other").input.mean_value == [3.0]
    index = json.loads((zoo_a / "index.json").read_text())
    assert list(index["models"]) == ["digits", "other"]
    assert index["models"]["digits"]["versions"] == ["1", "2"] and index["models"]["digits"]["latest"] == "2"
    folder = zoo_a / "models" / "digits" / "1"
    assert sorted(os.listdir(folder)) == ["README.md", "deploy.yaml", "model.yaml", "weights.h5"]
    card = Zoo(str(zoo_a)).card("digits@1")
    assert card.input.shape == [1, 8, 8] and card.input.channels == "GRAY" and card.provenance.iterations == 7
    assert "| weights.h5 |" in (folder / "README.md").read_text()
    before = tree(zoo_a)
    assert fails("zoo", "publish", "--name", "digits", "--net", DEPLOY, "--weights", weights, "--zoo", zoo_a) == (
        f"error: digits@1 is already in the zoo {zoo_a}; pass --force to replace it")
    assert tree(zoo_a) == before
    assert "invalid model name 'Digits!'" in fails("zoo", "publish", "--name", "Digits!", "--net", DEPLOY,
                                                   "--weights", weights, "--zoo", zoo_a)
    assert "published digits@1" in ok("zoo", "publish", "--name", "digits", "--net", DEPLOY, "--weights", weights,
                                      "--zoo", zoo_a, "--force")


def test_publish_refuses_weights_that_do_not_fit_the_deploy_net(tmp_path):
    lenet = ROOT / "configs" / "lenet" / "lenet_deploy.yaml"
    other = tmp_path / "lenet.h5"
    netspec.load_net(str(lenet)).save_weights(other)
    stderr = fails("zoo", "publish", "--name", "x", "--net", DEPLOY, "--weights", other, "--zoo", tmp_path / "z")
    assert stderr.startswith("error: ") and ("conv1" in stderr)
    assert not (tmp_path / "z" / "models").exists()


def test_list_show_verify_and_remove(zoo_a):
    listing = ok("zoo", "list", "--zoo", zoo_a).splitlines()
    assert listing[2].split() == ["digits", "1,", "2", "image-classification", "8x8", "digits"]
    assert ok("zoo", "show", "digits@1", "--zoo", zoo_a).startswith("# digits 1\n\n8x8 digits\n")
    assert ok("zoo", "verify", "--zoo", zoo_a).strip() == f"every model in {zoo_a}: every file matches its card"
    weights_file = zoo_a / "models" / "digits" / "2" / "weights.h5"
    data = bytearray(weights_file.read_bytes())
    data[-1] ^= 1
    weights_file.write_bytes(bytes(data))
    assert fails("zoo", "verify", "--zoo", zoo_a) == (
        "error: 1 problem(s): digits@2: weights.h5 does not match its sha256 in the card")
    with pytest.raises(ZooError, match="the model does not match its card: weights.h5 does not match its sha256"):
        netspec.model_zoo.load("digits", zoo=str(zoo_a))
    assert ok("zoo", "remove", "digits@2", "--zoo", zoo_a).strip() == "removed digits@2"
    assert json.loads((zoo_a / "index.json").read_text())["models"]["digits"]["versions"] == ["1"]
    assert ok("zoo", "remove", "digits", "--zoo", zoo_a).strip() == "removed digits@1"
    assert json.loads((zoo_a / "index.json").read_text())["models"] == {}
    assert fails("zoo", "show", "digits", "--zoo", zoo_a).startswith("error: no model 'digits' in the zoo")
    assert ok("zoo", "verify", "--zoo", zoo_a).strip() == f"{zoo_a}: no models to verify"
    assert ok("zoo", "verify", "--zoo", zoo_a / "none").strip() == f"{zoo_a / 'none'}: no models to verify (no zoo " \
                                                                    "there yet)"


def test_builtin_cards_name_nets_that_build():
    cards = builtin_cards()
    assert {c.name for c in cards} >= {"lenet", "cifar10-quick", "alexnet", "vgg16", "googlenet", "resnet50"}
    from netspec.engine.net import compile_net
    from netspec.engine.registry import layer_schemas
    from netspec.spec.net_spec import parse_net

    for card in cards:
        graph = compile_net(parse_net(card.net_path, layer_schemas()), phase="TEST")
        first = graph.nodes[0]
        assert first.layer.type == "Input" and list(graph.blob_shapes[first.tops[0]][1:]) == card.input.shape
    assert "resnet50" in ok("zoo", "list", "--builtin")


# ---- download ---------------------------------------------------------------------------------
@pytest.fixture
def server(zoo_a):
    """``netspec zoo serve`` on zoo A, in its own process; yields its URL."""
    process = subprocess.Popen([sys.executable, "-m", "netspec", "zoo", "serve", "--zoo", str(zoo_a), "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    assert line.startswith("serving "), process.stderr.read()
    yield line.split(" at ")[1].split()[0].rstrip("/")
    process.terminate()
    process.wait(5)


@pytest.mark.parametrize("kind", ["folder", "file_url"])
def test_download_from_a_folder_or_file_url(zoo_a, tmp_path, kind):
    source = str(zoo_a) if kind == "folder" else zoo_a.as_uri()
    zoo_b = tmp_path / "zooB"
    stdout = ok("zoo", "download", "digits@1", "--from", tmp_path / "nowhere", "--from", source, "--zoo", zoo_b)
    assert stdout.startswith("installed digits@1 (2 files, ")
    assert tree(zoo_b / "models" / "digits" / "1") == tree(zoo_a / "models" / "digits" / "1")
    assert not (zoo_b / ".partial" / "digits@1").exists()


def test_download_over_http_resumes_a_partial_file(zoo_a, tmp_path, server):
    zoo_b = tmp_path / "zooB"
    weights_a = (zoo_a / "models" / "digits" / "2" / "weights.h5").read_bytes()
    partial = zoo_b / ".partial" / "digits@2"
    partial.mkdir(parents=True)
    (partial / "weights.h5.part").write_bytes(weights_a[:1000])
    assert "installed digits@2" in ok("zoo", "download", "digits", "--from", server, "--zoo", zoo_b)
    assert (zoo_b / "models" / "digits" / "2" / "weights.h5").read_bytes() == weights_a
    # a damaged prefix proves that only the rest was fetched: the result cannot match and is discarded
    shutil.rmtree(zoo_b)
    partial.mkdir(parents=True)
    (partial / "weights.h5.part").write_bytes(b"x" * 1000)
    assert fails("zoo", "download", "digits@2", "--from", server, "--zoo", zoo_b) == (
        f"error: {server}/models/digits/2/weights.h5: the sha256 does not match the card; the download was discarded")
    assert not (partial / "weights.h5.part").exists() and not (zoo_b / "models").exists()


def test_download_refuses_bad_sources_and_leaves_the_zoo_as_it_was(zoo_a, tmp_path, server):
    zoo_b = tmp_path / "zooB"
    ok("zoo", "download", "digits@1", "--from", zoo_a, "--zoo", zoo_b)
    before = tree(zoo_b)
    source = tmp_path / "source"
    shutil.copytree(zoo_a, source)
    weights_2 = source / "models" / "digits" / "2" / "weights.h5"
    original = weights_2.read_bytes()

    def attempt(*extra):
        return fails("zoo", "download", "digits@2", "--from", source, "--zoo", zoo_b, *extra)

    weights_2.write_bytes(original + b"more")
    assert attempt().endswith(f"weights.h5: more than the {len(original)} bytes the card lists; refused")
    weights_2.write_bytes(original[:-10])
    assert attempt().endswith(f"weights.h5: the source has {len(original) - 10} of the {len(original)} bytes the card "
                              "lists; the download was discarded")
    assert not (zoo_b / ".partial").exists()  # a short file is no transfer to resume
    weights_2.write_bytes(original)
    index = json.loads((source / "index.json").read_text())
    index["models"]["../evil"] = {"versions": ["1"], "latest": "1"}
    (source / "index.json").write_text(json.dumps(index))
    assert "invalid index: invalid model name '../evil'" in attempt()
    (source / "index.json").write_text(json.dumps(dict(index) | {
        "models": {"digits": index["models"]["digits"]}}))
    card = source / "models" / "digits" / "2" / "model.yaml"
    card.write_text(card.read_text().replace("channels: GRAY", "channels: YUV"))
    assert attempt().startswith(f"error: {source}/models/digits/2/model.yaml:8: input.channels: 'YUV' is not one of")
    (source / "index.json").write_text("{not json")
    assert "no source has digits@2" in attempt()
    assert fails("zoo", "download", "digits@9", "--from", server, "--zoo", zoo_b) == (
        f"error: no source has digits@9: {server}: has no digits@9")
    (zoo_a / "models" / "digits" / "2" / "weights.h5").unlink()
    assert fails("zoo", "download", "digits@2", "--from", server, "--zoo", zoo_b) == (
        f"error: {server}/models/digits/2/weights.h5: HTTP 404 not found")
    assert "cannot connect" in fails("zoo", "download", "digits@2", "--from", "http://127.0.0.1:9", "--zoo", zoo_b)
    shutil.rmtree(zoo_b / ".partial", ignore_errors=True)
    assert tree(zoo_b) == before


class StallingHandler(http.server.BaseHTTPRequestHandler):
    """Serves zoo A's index and card, then sends half of any other file and stops answering."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        path = self.server.zoo_root / self.path.lstrip("/")
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Accept-Ranges", "bytes")  # so the partial file is kept for the next attempt
        self.end_headers()
        if path.suffix in (".json", ".yaml"):
            self.wfile.write(data)
            return
        self.wfile.write(data[:len(data) // 2])
        self.wfile.flush()
        time.sleep(3)


def test_a_server_that_stops_answering_times_out_and_can_be_resumed(zoo_a, tmp_path):
    stalling = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StallingHandler)
    stalling.daemon_threads = True
    stalling.zoo_root = zoo_a
    threading.Thread(target=stalling.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{stalling.server_address[1]}"
    zoo_b = tmp_path / "zooB"
    stderr = fails("zoo", "download", "digits@1", "--from", url, "--zoo", zoo_b, "--timeout", "0.5")
    assert "the transfer stopped after" in stderr and "run the same command again to resume" in stderr
    assert not (zoo_b / "models").exists() and (zoo_b / ".partial" / "digits@1" / "weights.h5.part").exists()
    assert "installed digits@1" in ok("zoo", "download", "digits@1", "--from", zoo_a, "--zoo", zoo_b)
    stalling.shutdown()


def test_sources_can_come_from_the_config_file(zoo_a, tmp_path, monkeypatch):
    config = tmp_path / "config"
    config.mkdir()
    (config / "zoo.yaml").write_text(f"sources: [{tmp_path / 'empty'}, {zoo_a}]\n")
    monkeypatch.setenv("NETSPEC_CONFIG_DIR", str(config))
    assert "installed digits@2" in ok("zoo", "download", "digits", "--zoo", tmp_path / "zooB")
    (config / "zoo.yaml").write_text("sources: nowhere\n")
    assert fails("zoo", "download", "digits", "--zoo", tmp_path / "zooC") == (
        f"error: {config}/zoo.yaml: 'sources' must be a list of folders or URLs")
    (config / "zoo.yaml").unlink()
    assert fails("zoo", "download", "digits", "--zoo", tmp_path / "zooC") == (
        "error: no zoo sources to look for digits in: give one with --from FOLDER|URL, or list them under "
        f"'sources:' in {config}/zoo.yaml")


def test_the_server_answers_ranges_and_refuses_paths_outside_the_zoo(zoo_a, server):
    assert ok("zoo", "list", "--from", server).splitlines()[2].startswith("digits  1, 2")
    host, port = server.split("//")[1].rstrip("/").split(":")
    (zoo_a / "models" / "link.yaml").symlink_to(ROOT / "README.md")
    weights = (zoo_a / "models" / "digits" / "1" / "weights.h5").read_bytes()

    def get(path, headers=None):
        connection = http.client.HTTPConnection(host, int(port), timeout=5)
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()

    status, headers, body = get("/models/digits/1/weights.h5", {"Range": "bytes=5-9"})
    assert (status, headers["Content-Range"], body) == (206, f"bytes 5-9/{len(weights)}", weights[5:10])
    assert get("/models/digits/1/weights.h5", {"Range": "bytes=-4"})[2] == weights[-4:]
    assert get("/models/digits/1/weights.h5", {"Range": f"bytes={len(weights)}-"})[0] == 416
    for path in ("/../README.md", "/models/%2e%2e/index.json", "/models/link.yaml", "/.partial/x", "/models",
                 "/models/%00x", "/models%2F..%2Findex.json"):
        assert get(path)[0] == 404, path


# ---- predict and load --------------------------------------------------------------------------
def test_predict_matches_the_original_net(zoo_a, weights, tmp_path):
    png = digit_png(tmp_path / "five.png")
    expected = original_probabilities(weights, png)
    result = json.loads(ok("predict", "digits", png, "--zoo", zoo_a, "--json", "--top-k", "3"))
    assert result["model"] == "digits@2"
    predictions = result["results"][0]["predictions"]
    assert [p["label"] for p in predictions] == list(np.argsort(-expected, kind="stable")[:3])
    np.testing.assert_allclose([p["probability"] for p in predictions], np.sort(expected)[::-1][:3], rtol=1e-5)
    np.save(tmp_path / "pixels.npy", np.stack([np.asarray(Image.open(png))[None]] * 2).astype(np.float32))
    lines = ok("predict", zoo_a / "models" / "digits" / "1", tmp_path / "pixels.npy", "--top-k", "1").splitlines()
    assert [line.split(":")[0] for line in lines] == [f"{tmp_path}/pixels.npy[0]", f"{tmp_path}/pixels.npy[1]"]
    assert lines[0].split(": ")[1] == f"{predictions[0]['name']} {predictions[0]['probability']:.4f}"
    np.save(tmp_path / "wrong.npy", np.zeros((3, 8, 8)))
    assert fails("predict", "digits", tmp_path / "wrong.npy", "--zoo", zoo_a) == (
        f"error: {tmp_path}/wrong.npy: holds an array of shape [3, 8, 8]; the model takes [1, 8, 8] (or N x [1, 8, 8])")
    assert fails("predict", tmp_path, png) == f"error: {tmp_path}: not a model folder (no model.yaml)"
    model = netspec.model_zoo.load("digits@1", zoo=str(zoo_a))
    assert model.card.ref == "digits@1" and model.net.outputs == ["prob"]


def test_the_readmes_python_one_liner_works_after_a_bare_import(zoo_a, tmp_path):
    png = digit_png(tmp_path / "five.png")
    line = f"import netspec; print(netspec.model_zoo.load('digits', zoo={str(zoo_a)!r}).predict({str(png)!r}))"
    result = subprocess.run([sys.executable, "-c", line], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "'predictions': [{'label':" in result.stdout
    for name in ("model_zoo", "tools", "interop", "inspect", "training", "testing"):  # every documented part
        probe = subprocess.run([sys.executable, "-c", f"import netspec; netspec.{name}"], capture_output=True)
        assert probe.returncode == 0, (name, probe.stderr)


def test_python_predicts_in_one_line_and_inputs_of_another_size_or_colour_are_converted_with_a_note(
        zoo_a, weights, tmp_path):
    png = digit_png(tmp_path / "five.png")
    expected = original_probabilities(weights, png)
    model = netspec.model_zoo.load("digits", zoo=str(zoo_a))
    one = model.predict(png, top_k=3)
    assert one["input"] == str(png) and [p["label"] for p in one["predictions"]] == list(
        np.argsort(-expected, kind="stable")[:3])
    pixels = np.asarray(Image.open(png))[None]
    assert [r["predictions"] for r in model.predict([png, pixels], top_k=3)] == [one["predictions"]] * 2
    assert len(model.predict(np.stack([pixels] * 3))) == 3
    np.save(tmp_path / "two.npy", np.stack([pixels] * 2))
    assert [r["input"] for r in model.predict(tmp_path / "two.npy")] == [f"{tmp_path}/two.npy[{i}]" for i in (0, 1)]

    big = tmp_path / "big.png"
    Image.open(png).convert("RGB").resize((16, 16)).save(big)
    note = (f"note: resized 1 input(s) straight to 8x8 ({big} was 16x16; the card does not say how its training "
            f"images were resized or cropped) and converted 1 from colour to grey ({big}): the model takes 1x8x8 GRAY "
            "images")  # (a card published with --net and --weights: no run, no dataset, so no resize recorded)
    result = run("predict", "digits", png, big, "--zoo", zoo_a)
    assert result.returncode == 0 and result.stderr == note + "\n" and len(result.stdout.splitlines()) == 2
    assert run("predict", "digits", png, "--zoo", zoo_a).stderr == ""
    with pytest.warns(UserWarning, match="resized 1 input"):
        model.predict(big)


def test_train_publish_serve_download_predict(tmp_path):
    """The issue's end to end: the quickstart model through zoo A, HTTP, zoo B and predict."""
    work = tmp_path / "digits"
    shutil.copytree(ROOT / "configs" / "digits", work, ignore=shutil.ignore_patterns("data", "runs"))
    ok("convert", "digits", work / "data")
    ok("train", work / "solver.yaml", "--max-iter", "200", "--out", tmp_path / "run")
    (tmp_path / "labels.txt").write_text("".join(f"{d}\n" for d in range(10)))
    weights = tmp_path / "run" / "digits_iter_200.weights.h5"
    published = ok("zoo", "publish", "--name", "digits", "--net", work / "digits_deploy.yaml", "--weights", weights,
                   "--run", tmp_path / "run", "--labels", tmp_path / "labels.txt", "--scale", "0.00392156862745098",
                   "--zoo", tmp_path / "A")
    assert published.startswith("published digits@1") and "accuracy" in published
    assert "note:" not in published  # (--scale given)
    unscaled = ok("zoo", "publish", "--name", "digits", "--run", tmp_path / "run", "--zoo", tmp_path / "unscaled")
    assert unscaled.splitlines()[1] == (
        "note: layer 'digits' (HDF5Data) of the run reads values as they are stored, so the card feeds images as "
        "they are (pixels 0 to 255, scale 1, no mean): if the stored values are scaled otherwise, publish again "
        "with --force, --scale and --mean-value (netspec convert digits stores values in [0, 1]: --scale 1/255)")
    card = Zoo(str(tmp_path / "A")).card("digits")
    assert card.train_net == "train_net.yaml" and card.solver == "solver.yaml" and card.provenance.iterations == 200
    assert card.provenance.dataset_sha256 and card.metrics["accuracy"] > 0.5
    assert (card.input.resize, card.input.crop_size) == ([8, 8], 0)  # HDF5Data: its rows reach the net as they are
    process = subprocess.Popen([sys.executable, "-m", "netspec", "zoo", "serve", "--zoo", str(tmp_path / "A"),
                                "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        url = process.stdout.readline().split(" at ")[1].split()[0]
        ok("zoo", "download", "digits", "--from", url, "--zoo", tmp_path / "B")
    finally:
        process.terminate()
        process.wait(5)
    assert ok("zoo", "verify", "digits", "--zoo", tmp_path / "B").startswith("digits in ")
    png = ROOT / "configs" / "digits" / "seven.png"  # the README's example image
    expected = original_probabilities(weights, png)
    result = json.loads(ok("predict", "digits", png, "--zoo", tmp_path / "B", "--json", "--top-k", "10"))
    got = {p["label"]: p["probability"] for p in result["results"][0]["predictions"]}
    np.testing.assert_allclose([got[i] for i in range(10)], expected, rtol=1e-5)
    assert result["results"][0]["predictions"][0]["name"] == str(int(np.argmax(expected))) == "7"


def test_publish_from_a_run_takes_its_labels_and_channel_order_and_checks_the_labels_fit(tmp_path):
    rng = np.random.default_rng(0)
    for name in ("ant", "bee", "cow"):
        (tmp_path / "images" / name).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).save(tmp_path / "images" / name / f"{i}.png")
    ok("convert", "imageset", tmp_path / "images", tmp_path / "data", "--val-fraction", "0.5")
    (tmp_path / "net.yaml").write_text("""
layers:
  - {name: data, type: Data, top: [data, label], data_param: {source: data/train, batch_size: 3},
     transform_param: {channel_order: BGR, scale: 0.004}}
  - {name: ip, type: InnerProduct, bottom: data, top: ip, inner_product_param: {num_output: 3}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
""")
    (tmp_path / "solver.yaml").write_text("net: net.yaml\nbase_lr: 0.01\nmax_iter: 2\nsnapshot_prefix: run/bgr\n")
    ok("train", tmp_path / "solver.yaml")
    zoo = tmp_path / "zoo"
    assert fails("zoo", "publish", "--name", "x", "--zoo", zoo) == (
        "error: give the deploy net (--net) and the weights (--weights), or the run folder (--run) they come from")
    (tmp_path / "two.txt").write_text("a\nb\n")
    assert fails("zoo", "publish", "--name", "x", "--run", tmp_path / "run", "--labels", tmp_path / "two.txt",
                 "--zoo", zoo) == (
        f"error: {tmp_path}/two.txt names 2 classes but the deploy net scores 3 ('prob'); set the last layer's "
        "num_output to the number of classes and train again, or give the label names that match with --labels")
    assert not (zoo / "models").exists()
    ok("zoo", "publish", "--name", "bgr", "--run", tmp_path / "run", "--zoo", zoo)
    card = Zoo(str(zoo)).card("bgr")
    assert (card.input.channels, card.input.label_names, card.input.scale) == ("BGR", ["ant", "bee", "cow"], 0.004)
    assert card.provenance.iterations == 2
    assert "type: Softmax" in (zoo / "models" / "bgr" / "1" / "deploy.yaml").read_text()


def test_publish_from_a_run_records_its_last_per_class_accuracies_and_cards_without_them_still_load(tmp_path,
                                                                                                     weights):
    """The card keeps test net 0's last per-class accuracies (null: no record of the class), beside the label
    names; a card written before cards had them reads and verifies as before."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    last = [0.25, None, *[1.0] * 8]
    lines = [{"iter": 5, "phase": "TEST", "accuracy": 0.5, "per_class": {"per_class": [0.5] * 10}},
             {"iter": 7, "phase": "TEST", "accuracy": 0.6, "per_class": {"per_class": last}},
             {"iter": 7, "phase": "TEST", "test_net": 1, "accuracy": 0.1, "per_class": {"per_class": [0.0] * 10}}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (tmp_path / "labels.txt").write_text("".join(f"digit {d}\n" for d in range(10)))
    zoo = tmp_path / "zoo"
    ok("zoo", "publish", "--name", "digits", "--net", DEPLOY, "--weights", weights, "--run", run_dir,
       "--labels", tmp_path / "labels.txt", "--zoo", zoo)
    card = Zoo(str(zoo)).card("digits")
    assert (card.metrics, card.per_class) == ({"accuracy": 0.6}, {"per_class": last})
    assert card.input.label_names == [f"digit {d}" for d in range(10)]
    path = zoo / "models" / "digits" / "1" / "model.yaml"
    text = path.read_text()
    assert "per_class:\n  per_class:\n  - 0.25\n  - null\n  - 1.0\n" in text
    assert parse_card(card_yaml(card), "again") == card
    older = re.sub(r"^per_class:\n([ -].*\n)*", "", text, flags=re.MULTILINE)
    assert "per_class" not in older
    path.write_text(older)
    assert Zoo(str(zoo)).card("digits") == dataclasses.replace(card, per_class={})
    assert ok("zoo", "verify", "digits", "--zoo", zoo).startswith("digits in ")


def test_versions_compare_as_version_numbers():
    versions = ["V12", "1.10", "v9", "10", "1.2", "2", "9" * 5000, "1.0", "1.0-rc1", "1.0.dev2", "1.0a1", "1.0beta",
                "1.0.post1", "2+cuda", "2.0.1"]
    assert sorted(versions, key=version_key) == ["1.0.dev2", "1.0a1", "1.0beta", "1.0-rc1", "1.0", "1.0.post1",
                                                 "1.2", "1.10", "2", "2+cuda", "2.0.1", "v9", "10", "V12", "9" * 5000]
    for tied in (["1.00", "1.0"], ["1.0", "1.00"], ["01", "1"], ["1", "01"]):  # one number written two ways
        assert max(tied, key=version_key) == max(tied)
