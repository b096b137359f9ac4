"""The README's examples, run as a user copies them."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import yaml
from PIL import Image
from test_cli import ROOT, run

README = (ROOT / "README.md").read_text()


def section(title: str) -> str:
    """The README's text under ``## title``, up to the next section."""
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def blocks(text: str, language: str) -> list[str]:
    """The fenced code blocks of ``language`` in ``text``."""
    return [body for lang, body in re.findall(r"^```(\w*)\n(.*?)^```$", text, re.S | re.M) if lang == language]


def test_the_modules_example_builds_beside_the_blocks_it_includes(tmp_path):
    text = section("Modules and repeats")
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
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    env = {"NETSPEC_ZOO": str(tmp_path / "zoo")}
    outputs = []
    for line in blocks(section("Your own images, start to finish"), "bash")[0].splitlines():
        words = shlex.split(line)
        if words[0] == "cp":
            for source in words[1:-1]:
                shutil.copy(tmp_path / source, tmp_path / words[-1])
            # the edit the README asks for: three classes
            net = tmp_path / "flowers" / "cifar10_quick_train_val.yaml"
            net.write_text(net.read_text().replace("num_output: 10\n", "num_output: 3\n"))
            continue
        assert words[0] == "netspec", line
        extra = ["--max-iter", "30"] if words[1] == "train" else []  # a short run: the data is easy
        result = run(*words[1:], *extra, cwd=tmp_path, env=env)
        assert result.returncode == 0, (line, result.stderr)
        outputs.append(result.stdout)

    assert outputs[0].splitlines() == ["wrote 18 records to flowers/data/train", "wrote 6 records to flowers/data/val"]
    assert outputs[2].startswith("published flowers@1 to ")
    card = yaml.safe_load((tmp_path / "zoo" / "models" / "flowers" / "1" / "model.yaml").read_text())
    assert card["input"]["label_names"] == ["daisy", "roses", "tulips"]
    assert card["provenance"]["iterations"] == 30
    assert outputs[3].startswith("photos/tulips/1.png: tulips ")
