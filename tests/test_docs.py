"""The README's tour and the guides' examples (nets, modules, training, data, your own images, Python, writing a layer),
run as a user copies them; and the documentation site builds."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml
from PIL import Image
from test_cli import ROOT, run

PAGES = ROOT / "docs" / "pages"


def page(path: str) -> str:
    """The text of a documentation page."""
    return (PAGES / path).read_text()


def section(text: str, title: str) -> str:
    """The text under the heading ``## title`` of a Markdown page, up to the next one."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def blocks(text: str, language: str) -> list[str]:
    """The fenced code blocks of ``language`` in ``text``."""
    return [body for lang, body in re.findall(r"^```(\w*)\n(.*?)^```$", text, re.S | re.M) if lang == language]


def test_the_readme_tour_trains_and_its_mistake_is_caught(tmp_path):
    readme = (ROOT / "README.md").read_text()
    tour = section(readme, "A 30-second tour")
    net, solver = blocks(tour, "yaml")
    assert run("convert", "digits", tmp_path / "configs" / "digits" / "data").returncode == 0
    (tmp_path / "net.yaml").write_text(net)
    (tmp_path / "solver.yaml").write_text(solver)
    shown = blocks(tour, "console")
    result = run("train", "solver.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # the lines shown are the lines printed, but for the timings and the folder
    printed = [re.sub(r"\d+ img/s", "N img/s", line) for line in result.stdout.splitlines()]
    for line in shown[0].splitlines()[1:]:
        if line != "..." and not line.startswith(("training net", "snapshot at")):
            assert re.sub(r"\d+ img/s", "N img/s", line) in printed, line
    assert (tmp_path / "runs" / "tour_iter_500.weights.h5").is_file()
    (tmp_path / "net.yaml").write_text(net.replace("type: Convolution", "type: Convolutoin"))
    result = run("check", "net.yaml", cwd=tmp_path)
    assert result.returncode == 1 and result.stderr.splitlines()[0] == shown[1].splitlines()[1]


def test_the_modules_example_builds_beside_the_blocks_it_includes(tmp_path):
    text = page("guides/modules.md")
    shutil.copy(ROOT / "configs" / "resnet50" / "resnet_blocks.yaml", tmp_path)
    (tmp_path / "net.yaml").write_text(blocks(text, "yaml")[0])
    result = run("check", "net.yaml", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip().endswith("outputs: res2c"), result.stderr
    (tmp_path / "net.yaml").write_text(blocks(text, "yaml")[0].replace("num_output:", "num_ouput:"))
    first_error = run("check", "net.yaml", cwd=tmp_path).stderr.splitlines()[0]
    assert first_error == blocks(text, "")[0].strip()


def save_photos(root: Path) -> None:
    """Three classes of 40x40 colour images, each class tinted by one channel."""
    rng = np.random.default_rng(0)
    for channel, name in enumerate(["daisy", "roses", "tulips"]):
        (root / name).mkdir(parents=True)
        for i in range(8):
            pixels = rng.integers(0, 120, (40, 40, 3), dtype=np.uint8)
            pixels[..., channel] += 120
            Image.fromarray(pixels).save(root / name / f"{i}.png")


def test_your_own_images_from_a_folder_to_a_published_model(tmp_path):
    save_photos(tmp_path / "photos")
    env = {"NETSPEC_ZOO": str(tmp_path / "zoo")}
    outputs = []
    for line in blocks(page("guides/your-own-images.md"), "bash")[0].splitlines():
        words = shlex.split(line)
        assert words[0] == "netspec", line
        extra = ["--max-iter", "30"] if words[1] == "train" else []  # a short run: the data is easy
        result = run(*words[1:], *extra, cwd=tmp_path, env=env)
        assert result.returncode == 0, (line, result.stderr)
        outputs.append(result.stdout)
        if words[1] == "configs":  # the edit the guide asks for: three classes
            net = tmp_path / "flowers" / "cifar10_quick_train_val.yaml"
            net.write_text(net.read_text().replace("num_output: 10\n", "num_output: 3\n"))

    assert outputs[0].splitlines() == ["wrote 18 records to flowers/data/train", "wrote 6 records to flowers/data/val"]
    assert outputs[1].startswith("copied cifar10 into flowers: ")
    assert outputs[3].startswith("published flowers@1 to ")
    card = yaml.safe_load((tmp_path / "zoo" / "models" / "flowers" / "1" / "model.yaml").read_text())
    assert card["input"]["label_names"] == ["daisy", "roses", "tulips"]
    assert card["provenance"]["iterations"] == 30
    assert outputs[4].startswith("photos/tulips/1.png: tulips ")


def test_the_site_builds_with_every_link_resolved(tmp_path):
    """``mkdocs build --strict``: a broken link or anchor, or a page left out of the navigation, fails it."""
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", ROOT / "docs" / "mkdocs.yml",
                             "-d", tmp_path / "site"], capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    site = tmp_path / "site" / "reference"
    assert (site / "layers" / "Convolution" / "index.html").is_file()
    # table cells keep what Markdown would take for attributes, tags or cell breaks
    schema = (site / "schema" / "index.html").read_text()
    assert "keep &lt;prefix&gt;_best.weights.h5 for the best test value of an output: {output, mode: max|min}" in schema
    assert "<code>y = &#124;x&#124;</code>; the gradient" in (site / "layers" / "index.html").read_text()


def test_the_data_guide_makes_a_dataset_and_its_mean_from_a_folder_of_photos(tmp_path):
    save_photos(tmp_path / "photos")
    for line in blocks(page("guides/data.md"), "bash")[0].splitlines():
        words = shlex.split(line.split("#")[0])
        assert words[0] == "netspec", line
        result = run(*words[1:], cwd=tmp_path)
        assert result.returncode == 0, (line, result.stderr)
    assert np.load(tmp_path / "mean.npy").shape == (3, 32, 32)
    assert Image.open(tmp_path / "samples.png").size[0] > 32
    assert yaml.safe_load((tmp_path / "photos_db" / "train" / "manifest.json").read_text())["count"] > 0


def test_the_nets_guide_net_checks(tmp_path):
    (tmp_path / "net.yaml").write_text(blocks(page("guides/nets.md"), "yaml")[0])
    result = run("check", "net.yaml", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip().endswith("outputs: pool1"), result.stderr


def test_the_training_guide_solver_files_train_the_digits(tmp_path):
    """The guide's solver file as it stands, then with what goes beyond Caffe (its epochs, warm-up, best
    snapshots and early stop), each for a few iterations on the digits."""
    solver, beyond = blocks(page("guides/training.md"), "yaml")[:2]
    shutil.copy(ROOT / "configs" / "digits" / "digits_net.yaml", tmp_path)
    assert run("convert", "digits", tmp_path / "data").returncode == 0
    (tmp_path / "solver.yaml").write_text(solver)
    (tmp_path / "beyond.yaml").write_text(solver.replace("max_iter: 1000\n", "").replace("runs/digits", "beyond/b")
                                          + beyond)
    for name in ("solver.yaml", "beyond.yaml"):
        result = run("train", name, "--max-iter", "20", cwd=tmp_path)
        assert result.returncode == 0 and "optimization done at iteration 20" in result.stdout, result.stderr
    assert (tmp_path / "beyond" / "b_best.weights.h5").is_file()


PYTHON_GUIDE_SETUP = """
import subprocess, sys
for name in ("digits", "lenet"):
    subprocess.run([sys.executable, "-m", "netspec", "configs", "copy", name, f"configs/{name}"], check=True)
subprocess.run([sys.executable, "-m", "netspec", "convert", "digits", "configs/digits/data"], check=True)
"""


def test_the_python_guide_runs_as_written(tmp_path):
    building, running = blocks(page("guides/python.md"), "python")
    code = PYTHON_GUIDE_SETUP + building + running + "print(netspec.load_net('lenet.yaml').blobs['prob'].shape)\n"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "(64, 10)"
    assert (tmp_path / "lenet.h5").is_file()


A_DOUBLER = """
import numpy as np
from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer


@register_layer
class Doubler(Layer):
    type = "Doubler"

    def top_shapes(self, bottom_shapes):
        return [bottom_shapes[0]]

    def forward(self, bottom, top):
        top[0].data[...] = 2 * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = 2 * top[0].diff
"""


def test_the_writing_a_layer_guide_checks_a_layer_as_written():
    code = A_DOUBLER + blocks(page("guides/writing-a-layer.md"), "python")[0] + "print('checked')\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == "checked\n", result.stderr
