"""``netspec draw``: a net's layer graph in Graphviz's DOT language, and SVG/PNG through Graphviz.

SVG and PNG use the ``dot`` program when it is installed, else pygraphviz
(the ``draw`` extra, which carries Graphviz in its wheel).

Layers are boxes labelled with their name, type and parameter count; edges
carry the blob's name and shape.  In-place layers sit on their blob's path,
and the Split layers the compiler inserts are drawn as small dots.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from netspec.atomic import write_bytes
from netspec.data.files import writing
from netspec.errors import NetspecError
from netspec.graph.graph import Graph
from netspec.inspect.report import human_count

FORMATS = (".dot", ".svg", ".png")


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(graph: Graph, rankdir: str = "TB") -> str:
    """The graph as DOT text."""
    lines = [f"digraph {_quote(graph.name or 'net')} {{", f"  rankdir={rankdir};",
             '  node [shape=box, style="rounded,filled", fillcolor="#eef3fb", fontname="Helvetica", fontsize=11];',
             '  edge [fontname="Helvetica", fontsize=9, color="#555555"];']
    producer: dict[str, str] = {}
    for index, node in enumerate(graph.nodes):
        ident = f"n{index}"
        if node.layer.type == "Split":
            lines.append(f"  {ident} [shape=point, width=0.08, label=\"\"];")
        else:
            params = node.learnable_count()
            label = f"{node.name}\n{node.layer.type}" + (f"\n{human_count(params)} params" if params else "")
            lines.append(f"  {ident} [label={_quote(label)}];")
        for blob, shape in zip(node.bottoms, node.bottom_shapes):
            if blob in producer:
                dims = "x".join(map(str, shape))
                lines.append(f"  {producer[blob]} -> {ident} [label={_quote(f'{blob} {dims}')}];")
        for blob in node.tops:
            producer[blob] = ident
    lines.append("}")
    return "\n".join(lines) + "\n"


def draw(graph: Graph, out: str, rankdir: str = "TB") -> None:
    """Write ``out`` as .dot, or as .svg/.png through Graphviz's ``dot``: rendered in memory, then written
    atomically (never through a link; a failed write is one error naming the file)."""
    extension = os.path.splitext(out)[1].lower()
    if extension not in FORMATS:
        raise NetspecError(f"{out}: choose a .dot, .svg or .png file")
    text = to_dot(graph, rankdir)
    if extension == ".dot":
        drawn = text.encode("utf-8")
    elif (program := shutil.which("dot")) is None:
        drawn = _draw_with_pygraphviz(text, out, extension[1:])
    else:
        result = subprocess.run([program, f"-T{extension[1:]}"], input=text.encode("utf-8"), capture_output=True,
                                check=False)
        if result.returncode:
            raise NetspecError(f"{out}: dot failed: {result.stderr.decode('utf-8', 'replace').strip()}")
        drawn = result.stdout
    with writing(out):
        write_bytes(out, drawn)


def _draw_with_pygraphviz(text: str, out: str, fmt: str) -> bytes:
    """Lay out and render with pygraphviz (which carries Graphviz) when no ``dot`` program is installed."""
    try:
        import pygraphviz
    except ImportError:
        raise NetspecError(f"{out}: drawing {fmt} needs Graphviz: install its dot program or "
                           "python3 -m pip install 'netspec[draw]', or write a .dot file") from None
    return pygraphviz.AGraph(string=text).draw(format=fmt, prog="dot")
