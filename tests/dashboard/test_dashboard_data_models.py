"""The dashboard's Datasets and Models pages over HTTP: a dataset made from an image folder with its progress,
a dataset browsed (manifest, label histogram, records as images), a run published, predictions on an upload."""

from __future__ import annotations

import html
import io
import json
import os
import shutil
import threading
import time
from pathlib import Path

import numpy
import pytest
from PIL import Image
from test_cli import run
from test_dashboard import LOCAL, TOKEN, client, digits_workspace, wait_for

from netspec.dashboard.models import Predictors
from netspec.data.dataset import DatasetWriter
from netspec.model_zoo.predict import Model
from netspec.model_zoo.zoo import Zoo
from netspec.tools.digits import load_digits


def digit_folders(root: Path, classes: int = 3, each: int = 12) -> Path:
    """An image folder of ``classes`` class subfolders of ``each`` 8x8 digit PNGs."""
    images, labels = load_digits()
    for digit in range(classes):
        folder = root / f"digit{digit}"
        folder.mkdir(parents=True)
        for index, image in enumerate(images[labels == digit][:each]):
            Image.fromarray((image[0] * 255).round().astype(numpy.uint8)).save(folder / f"{index:03d}.png")
    return root


def post_form(dashboard, path: str, fields: dict, **kwargs):
    """The form posted as the page posts it (same origin, the token in its cookie)."""
    dashboard.cookies.set("netspec_dashboard_token_6006", TOKEN)
    return dashboard.post(path, data=fields, headers={"origin": LOCAL}, **kwargs)


def upload(dashboard, ref: str, data: bytes, name: str = "seven.png"):
    """An image file sent to the model as the model's page sends it."""
    dashboard.cookies.set("netspec_dashboard_token_6006", TOKEN)
    return dashboard.post("/api/models/predict", params={"ref": ref, "name": name}, content=data,
                          headers={"origin": LOCAL, "content-type": "application/octet-stream"})


def converted(dashboard, out: str) -> dict:
    """The conversion into ``out`` once it ended."""
    def ended():
        found = [c for c in dashboard.get("/api/datasets/conversions").json() if c["out"] == out]
        return found and found[0]["state"] != "running" and found[0]
    wait_for(ended, 60)
    return ended()


def test_a_dataset_is_made_from_an_image_folder_with_its_progress(tmp_path):
    digit_folders(tmp_path / "images" / "digits")
    (tmp_path / "images" / "digits" / "digit1" / "broken.png").write_bytes(b"not a png")
    dashboard = client(tmp_path, follow_redirects=False)
    page = dashboard.get("/datasets").text
    assert '<option value="images/digits">' in page and "no dataset folders in the workspace yet" in page
    answer = post_form(dashboard, "/datasets", {"source": "images/digits", "out": "data/digits", "backend": "lmdb",
                                                "resize": "16x16", "shuffle": "1", "seed": "1_0",
                                                "val_fraction": ".25"})
    assert (answer.status_code, answer.headers["location"]) == (303, "datasets#conversions")
    done = converted(dashboard, "data/digits")
    assert (done["state"], done["total"], done["done"]) == ("finished", 37, 37), done
    assert done["message"].startswith("wrote 27 records to data/digits/train, 9 records to data/digits/val; "
                                      "skipped 1 image(s)")
    assert done["skipped_count"] == 1 and "broken.png: not an image" in done["skipped"][0]
    page = dashboard.get("/datasets").text
    assert '<a href="dataset?path=data%2Fdigits%2Ftrain">data/digits/train</a></td><td>lmdb</td><td>27</td>' \
           "<td>3×16×16</td><td>3</td>" in page
    shown = dashboard.get("/dataset", params={"path": "data/digits/val"}).text
    assert "<td>0</td><td>digit0</td><td>3</td>" in shown and '&quot;label_names&quot;: [' in shown
    assert shown.count("<figure>") == 9
    png = dashboard.get("/api/datasets/record.png", params={"path": "data/digits/val", "index": 8})
    assert png.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(png.content)).size == (16, 16)


def test_conversion_forms_that_cannot_be_done_say_why_and_replace_nothing(tmp_path):
    digit_folders(tmp_path / "images")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep.txt").write_text("mine")
    (tmp_path / "empty").mkdir()
    dashboard = client(tmp_path)
    for fields, status, message in [
        ({"source": "../outside", "out": "x"}, 403, "'../outside': outside the workspace"),
        ({"source": "images", "out": "../../x"}, 403, "'../../x': outside the workspace"),
        ({"source": "images", "out": "data"}, 409, "data already exists: choose another dataset folder"),
        ({"source": "empty", "out": "x"}, 400, "empty: no class subfolders"),
        ({"source": "nowhere", "out": "x"}, 404, "'nowhere': no such folder in the workspace"),
        ({"source": "images", "out": "x", "resize": "16"}, 400, "resize: expected HxW such as 32x32, got '16'"),
        ({"source": "images", "out": "x", "val_fraction": "1.5"}, 400, "val_fraction: must be at least 0 and below 1"),
        ({"source": "images", "out": "x", "backend": "hdf5", "encoding": "png"}, 400, "encoding: PNG and JPEG"),
    ]:
        answer = post_form(dashboard, "/datasets", fields)
        text = html.unescape(answer.text)
        assert answer.status_code == status and message in text, (fields, text)
        assert f'value="{fields["out"]}"' in text  # the form keeps what was asked
    assert (tmp_path / "data" / "keep.txt").read_text() == "mine" and not (tmp_path / "x").exists()
    assert dashboard.get("/api/datasets/conversions").json() == []


def test_a_float_dataset_and_a_damaged_one_are_shown(tmp_path):
    writer = DatasetWriter(str(tmp_path / "floats"), "hdf5")
    for label in range(4):
        writer.add(numpy.full((2, 3, 5), label - 1.5, dtype=numpy.float32), label % 2)
    writer.finish([], "0" * 64, {})
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{")
    dashboard = client(tmp_path)
    page = dashboard.get("/datasets").text
    assert "<td>hdf5</td><td>4</td><td>2×3×5</td><td>2</td>" in page and "cannot read the manifest" in page
    record = dashboard.get("/api/datasets/record.png", params={"path": "floats", "index": 3})
    assert Image.open(io.BytesIO(record.content)).mode == "L"
    assert dashboard.get("/api/datasets/record.png", params={"path": "floats", "index": 4}).status_code == 404
    assert dashboard.get("/api/datasets/record.png", params={"path": "floats", "index": "-1"}).status_code == 400
    huge = dashboard.get("/api/datasets/record.png", params={"path": "floats", "index": "9" * 5000})
    assert huge.status_code == 400 and "is not a record number" in huge.text
    broken = dashboard.get("/dataset", params={"path": "bad"})
    assert broken.status_code == 400 and "cannot read the manifest" in broken.text
    assert dashboard.get("/dataset", params={"path": "../x"}).status_code == 403


def test_a_conversion_still_being_written_is_no_dataset_and_one_gone_since_the_walk_is_left_out(tmp_path,
                                                                                               monkeypatch):
    from netspec.dashboard import dataset_pages

    for folder in ("done", "fresh.partial/train.partial"):
        writer = DatasetWriter(str(tmp_path / folder), "hdf5")
        writer.add(numpy.zeros((1, 2, 2), dtype=numpy.float32), 0)
        writer.finish([], "0" * 64, {})
    page = client(tmp_path).get("/datasets")
    assert page.status_code == 200 and ">done<" in page.text and "partial" not in page.text
    walked = dataset_pages.folders_for_datasets
    monkeypatch.setattr(dataset_pages, "folders_for_datasets",  # (as if a conversion renamed one meanwhile)
                        lambda workspace: (["done", "renamed"], walked(workspace)[1]))
    page = client(tmp_path).get("/datasets")
    assert page.status_code == 200 and ">done<" in page.text and "renamed" not in page.text
    read = dataset_pages.summary

    def moved_while_read(folder):  # (renamed after its folder was found, before its manifest was read)
        if folder.endswith("done"):
            os.rename(folder, folder + "-moved")
        return read(folder)

    monkeypatch.setattr(dataset_pages, "summary", moved_while_read)
    page = client(tmp_path).get("/datasets")
    assert page.status_code == 200 and ">done<" not in page.text and "no such dataset folder" not in page.text


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The digits workspace with a short finished run, runs/short, with its final snapshot."""
    folder = digits_workspace(tmp_path_factory)
    result = run("train", folder / "solver.yaml", "--max-iter", "150", "--out", folder / "runs" / "short")
    assert result.returncode == 0, result.stderr
    return folder


def test_a_finished_run_is_published_and_predicts_on_an_uploaded_image(trained, tmp_path):
    zoo = tmp_path / "zoo"
    dashboard = client(trained, zoo=zoo, follow_redirects=False)
    assert "no models in this zoo yet" in dashboard.get("/models").text
    form = dashboard.get("/publish", params={"run": "runs/short"}).text
    assert 'name="name" value="short"' in form and "disabled" not in form
    fields = {"name": "my-digits", "version": "1", "summary": "8x8 digits <b>", "license": "MIT",
              "authors": "Ada, Grace"}
    answer = post_form(dashboard, "/publish?run=runs%2Fshort", fields)
    assert (answer.status_code, answer.headers["location"]) == (303, "model?ref=my-digits%401")
    again = post_form(dashboard, "/publish?run=runs%2Fshort", fields)
    assert again.status_code == 409 and "my-digits@1 is already in the zoo" in again.text
    listing = dashboard.get("/models").text
    assert 'href="model?ref=my-digits%401">my-digits@1</a>' in listing and "8x8 digits &lt;b&gt;" in listing
    assert "accuracy 0.9" in listing
    page = dashboard.get("/model", params={"ref": "my-digits@1"}).text
    assert "Ada, Grace" in page and "netspec predict my-digits@1 image.png --zoo" in page
    seven = (Path(__file__).parent.parent.parent / "configs" / "digits" / "seven.png").read_bytes()
    answer = upload(dashboard, "my-digits@1", seven)
    top = answer.json()["predictions"]
    assert answer.status_code == 200 and len(top) == 5 and top[0]["name"] == "7", top
    assert sum(p["probability"] for p in top) <= 1 + 1e-6 and answer.json()["note"] == ""
    big = Image.new("RGB", (40, 30), "white")
    buffer = io.BytesIO()
    big.save(buffer, format="PNG")
    note = upload(dashboard, "my-digits@1", buffer.getvalue(), "photo.png").json()["note"]
    assert "resized 1 input(s) to 8x8" in note and "converted 1 from colour to grey" in note


def test_two_models_predicting_at_once_run_their_nets_one_after_the_other(trained, tmp_path, monkeypatch):
    # (the nets of a process share oneDNN's stream and scratch buffers: two at once would mix their numbers)
    zoo = tmp_path / "zoo"
    dashboard = client(trained, zoo=zoo, follow_redirects=False)
    for name in ("first", "second"):
        assert post_form(dashboard, "/publish?run=runs%2Fshort", {"name": name}).status_code == 303
    running, most, classify = [0], [0], Model.classify

    def counted(model, *args, **kwargs):
        running[0] += 1
        most[0] = max(most[0], running[0])
        time.sleep(0.05)  # (long enough for the other request to come in)
        try:
            return classify(model, *args, **kwargs)
        finally:
            running[0] -= 1

    monkeypatch.setattr(Model, "classify", counted)
    predictors = Predictors(Zoo(str(zoo)))
    seven = (Path(__file__).parent.parent.parent / "configs" / "digits" / "seven.png").read_bytes()
    answers: dict[str, dict] = {}
    requests = [threading.Thread(target=lambda ref=ref: answers.update({ref: predictors.predict(ref, seven, "7.png")}))
                for ref in ("first@1", "second@1") * 2]
    for request in requests:
        request.start()
    for request in requests:
        request.join()
    assert most[0] == 1 and answers["first@1"]["predictions"] == answers["second@1"]["predictions"]


def test_bad_uploads_and_unknown_models_get_a_clear_answer(trained, tmp_path):
    zoo = tmp_path / "zoo"
    dashboard = client(trained, zoo=zoo, follow_redirects=False)
    assert post_form(dashboard, "/publish?run=runs%2Fshort", {"name": "digits"}).status_code == 303
    assert post_form(dashboard, "/publish?run=runs%2Fshort", {"name": "Bad Name"}).status_code == 400
    not_image = upload(dashboard, "digits@1", b"plain text", "notes.txt")
    assert not_image.status_code == 400 and not_image.json() == {"error": "notes.txt: not an image"}
    assert "no model 'other'" in upload(dashboard, "other", b"x").json()["error"]
    assert upload(dashboard, "digits@1", b"\0" * (16 * 1024 * 1024 + 1)).status_code == 413
    missing = dashboard.get("/model", params={"ref": "other@1"})
    assert missing.status_code == 400 and "no model 'other'" in html.unescape(missing.text)


def test_a_run_that_is_running_or_has_no_weights_is_not_published(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    dashboard = client(tmp_path)
    form = dashboard.get("/publish", params={"run": "empty"}).text
    assert "the run has no snapshot weights to publish" in form and "disabled>Publish" in form
    answer = post_form(dashboard, "/publish?run=empty", {"name": "x"})
    assert answer.status_code == 400 and "no snapshot weights" in answer.text


def test_a_zoo_model_is_fine_tuned_on_a_dataset_made_in_the_page(trained, tmp_path):
    zoo = tmp_path / "zoo"
    digit_folders(trained / "images" / "three")
    dashboard = client(trained, zoo=zoo, follow_redirects=False)
    assert "no model in the zoo carries its training configs" in dashboard.get("/new").text
    published = post_form(dashboard, "/publish?run=runs%2Fshort", {"name": "digits", "scale": "0.00392"})
    assert published.status_code == 303
    assert post_form(dashboard, "/datasets", {"source": "images/three", "out": "data/three", "gray": "1",
                                              "val_fraction": ".25"}).status_code == 303
    assert converted(dashboard, "data/three")["state"] == "finished"
    form = dashboard.get("/new").text
    assert "<option>digits@1</option>" in form and "<option>data/three</option>" in form
    assert "<option>data/three/train</option>" in form
    refused = post_form(dashboard, "/new", {"model": "digits@1", "dataset": "data/three"})
    assert refused.status_code == 400 and "choose the dataset and name the run folder" in refused.text
    answer = post_form(dashboard, "/new", {"model": "digits@1", "dataset": "data/three", "out": "runs/tuned",
                                           "max_iter": "40"})
    assert (answer.status_code, answer.headers["location"]) == (303, "run?run=runs%2Ftuned")
    out = trained / "runs" / "tuned"
    wait_for(lambda: (out / "outcome.json").exists(), 120)
    log = (out / "train.log").read_text()
    assert "optimization done at iteration 40" in log and "ip2_finetune" in log, log
    tests = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"TEST"' in line]
    assert tests[-1]["accuracy"] > 0.8, tests[-1]
    assert (out / "finetune" / "solver.yaml").is_file()
    again = post_form(dashboard, "/new", {"model": "digits@1", "dataset": "data/three", "out": "runs/tuned"})
    assert again.status_code == 409 and "runs/tuned already holds a run" in again.text


def test_a_failed_conversion_leaves_nothing_and_partial_folders_are_not_replaced(tmp_path):
    digit_folders(tmp_path / "images")
    (tmp_path / "images" / "digit1" / "broken.png").write_bytes(b"not a png")
    (tmp_path / "notes.partial").mkdir()
    (tmp_path / "notes.partial" / "thesis.txt").write_text("mine")
    dashboard = client(tmp_path)
    answer = post_form(dashboard, "/datasets", {"source": "images", "out": "notes"})
    assert answer.status_code == 409 and "notes.partial already exists" in answer.text
    assert (tmp_path / "notes.partial" / "thesis.txt").read_text() == "mine"
    for seed in range(3):  # the broken image lands in train/ or val/
        out = f"data/strict{seed}"
        post_form(dashboard, "/datasets", {"source": "images", "out": out, "val_fraction": ".5", "strict": "1",
                                           "seed": str(seed)})
        failed = converted(dashboard, out)
        assert failed["state"] == "failed" and failed["message"].startswith("images/digit1/broken.png: not an image")
        assert not (tmp_path / out).exists()
    assert "<tbody>\n<tr><td colspan=\"5\">no dataset folders" in dashboard.get("/datasets").text


def test_odd_requests_to_the_data_and_model_pages_get_clear_answers(trained, tmp_path):
    digit_folders(trained / "images" / "odd")
    zoo = tmp_path / "zoo"
    dashboard = client(trained, zoo=zoo, follow_redirects=False)
    assert post_form(dashboard, "/publish?run=runs%2Fshort", {"name": "digits"}).status_code == 303
    assert upload(dashboard, "digits", b"").json() == {"error": "seven.png: empty file"}
    for path, params in (("/model", {}), ("/api/datasets/record.png", {"index": "0"})):
        answer = dashboard.get(path, params=params)
        assert answer.status_code == 400 and answer.text.startswith("name a "), answer.text
    assert post_form(dashboard, "/api/models/predict", {}).text == "name a model: ?ref=NAME@VERSION"
    folder = trained / "digits"
    assert run("convert", "imageset", trained / "images" / "odd", folder, "--gray").returncode == 0
    assert dashboard.get("/api/datasets/record.png", params={"path": "digits", "index": "²"}).status_code == 400
    assert dashboard.get("/api/datasets/record.png", params={"path": "digits", "index": "99"}).text == \
        "no record 99: the dataset holds 36"
    for fields, status, message in [
        ({"model": str(zoo / "models" / "digits" / "1"), "dataset": "digits", "out": "runs/x"}, 400,
         "invalid model name"),
        ({"model": "digits@1", "solver": "solver.yaml", "dataset": "digits", "out": "runs/x"}, 400,
         "choose a solver file or a model to fine-tune, not both"),
    ]:
        answer = post_form(dashboard, "/new", fields)
        assert answer.status_code == status and message in html.unescape(answer.text), answer.text
    assert not (trained / "runs" / "x").exists()
    shutil.rmtree(zoo / "models" / "digits" / "1")  # the index still lists it
    assert "cannot read its card" in upload(dashboard, "digits", b"x").json()["error"]
    (zoo / "index.json").write_text("{")
    page = dashboard.get("/new")
    assert page.status_code == 200 and "index.json: not JSON" in page.text
    missing = post_form(dashboard, "/new", {"solver": "nope.yaml"})
    assert missing.status_code == 404 and "no such file in the workspace" in missing.text
