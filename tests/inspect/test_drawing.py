"""`netspec draw`: DOT text always, SVG/PNG through Graphviz's dot."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from test_cli import run

ROOT = Path(__file__).parent.parent.parent
GOOGLENET = ROOT / "configs" / "googlenet" / "googlenet_deploy.yaml"


def test_dot_output_has_layers_shapes_and_splits(tmp_path):
    out = tmp_path / "net.dot"
    result = run("draw", GOOGLENET, "-o", out, "--rankdir", "LR")
    assert result.returncode == 0 and result.stdout.strip().startswith(f"wrote {out} (")
    text = out.read_text()
    assert text.startswith('digraph "GoogleNet" {\n  rankdir=LR;')
    assert '[label="inception_3a/1x1\\nConvolution\\n12.35 k params"]' in text
    assert '[label="inception_3a/output 10x256x28x28"]' in text
    assert "[shape=point" in text  # the split feeding the four branches
    assert text.count(" -> ") >= 150 and text.rstrip().endswith("}")


def test_without_a_dot_program_pygraphviz_draws(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no dot program here
    for fmt in ("svg", "png"):
        result = run("draw", ROOT / "configs" / "lenet" / "lenet_deploy.yaml", "-o", tmp_path / f"net.{fmt}")
        assert result.returncode == 0, result.stderr
    assert "<svg" in (tmp_path / "net.svg").read_text() and "conv1" in (tmp_path / "net.svg").read_text()
    assert (tmp_path / "net.png").read_bytes().startswith(b"\x89PNG")


def test_svg_goes_through_dot_or_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    (tmp_path / "pygraphviz.py").write_text("raise ImportError('hidden for this test')\n")
    missing = run("draw", GOOGLENET, "-o", tmp_path / "net.svg")
    assert missing.returncode == 1 and missing.stderr.strip() == (
        f"error: {tmp_path}/net.svg: drawing svg needs Graphviz: install its dot program or python3 -m pip install "
        "'netspec[draw]', or write a .dot file")
    fake = tmp_path / "dot"  # stands in for Graphviz: copies its input to its output
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write(sys.stdin.read())\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    result = run("draw", GOOGLENET, "-o", tmp_path / "net.svg")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "net.svg").read_text().startswith('digraph "GoogleNet"')
    assert "choose a .dot, .svg or .png file" in run("draw", GOOGLENET, "-o", tmp_path / "net.pdf").stderr
    assert os.path.exists(fake)


def test_a_drawing_replaces_a_link_and_a_failed_write_is_one_line(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep\n")
    (tmp_path / "net.png").symlink_to(target)
    result = run("draw", ROOT / "configs" / "lenet" / "lenet_deploy.yaml", "-o", tmp_path / "net.png")
    assert result.returncode == 0, result.stderr
    assert target.read_text() == "keep\n" and not (tmp_path / "net.png").is_symlink()
    assert (tmp_path / "net.png").read_bytes().startswith(b"\x89PNG")
    failed = run("draw", GOOGLENET, "-o", target / "net.dot")  # (a file where a folder would be)
    assert (failed.returncode, failed.stderr) == (1, f"error: {target}/net.dot: cannot write: File exists\n")
