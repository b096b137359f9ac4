"""Human-readable descriptions: per-layer net summaries and layer documentation."""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing

from netspec.graph.graph import Graph
from netspec.graph.memory import data_aliases, data_plan, diff_blobs, diff_plan, split_aliases
from netspec.spec.schema import type_name
from netspec.spec.solver_spec import LR_FORMULAS, WARMUP_FORMULA


def human_bytes(count: float) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"


def summary_rows(graph: Graph, itemsize: int = 4) -> list[dict]:
    """One dict per layer: name, type, top shapes, learnable params, activation bytes (of the new tops that hold
    data of their own: not in place, no Split top reading its bottom's)."""
    aliases = split_aliases(graph)
    rows = []
    for node in graph.nodes:
        new_tops = [shape for name, shape, inplace in zip(node.tops, node.top_shapes, node.inplace)
                    if not inplace and name not in aliases]
        rows.append({
            "name": node.name,
            "type": node.layer.type,
            "tops": node.top_shapes,
            "params": node.learnable_count(),
            "flops": node.flops,
            "activation_bytes": sum(math.prod(s) for s in new_tops) * itemsize,
        })
    return rows


def format_table(headers: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> str:
    """A plain-text table with a header rule; columns in ``right`` are right-aligned."""
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows)]
    lines = []
    for row in [headers, ["-" * w for w in widths], *rows]:
        cells = [str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def net_summary(graph: Graph, itemsize: int = 4) -> str:
    """The ``netspec check`` report."""
    rows = summary_rows(graph, itemsize)
    table = format_table(
        ["layer", "type", "top shapes", "params", "FLOPs", "activations"],
        [[r["name"], r["type"], " ".join(_shape(s) for s in r["tops"]) or "-", f"{r['params']:,}",
          human_count(r["flops"]), human_bytes(r["activation_bytes"])] for r in rows],
        right={3, 4, 5})
    state = graph.state
    stages = f", stages {','.join(state.stage)}" if state.stage else ""
    lines = [
        f"net '{graph.name}' ({state.phase}, level {state.level}{stages}): {len(graph.nodes)} layers",
        table,
        f"learnable parameters: {graph.learnable_count():,} ({human_bytes(graph.learnable_count() * itemsize)})",
        f"forward FLOPs: {human_count(sum(r['flops'] for r in rows))} per batch of {graph_batch(graph)}",
        activation_line(graph, itemsize),
        f"outputs: {', '.join(graph.outputs) or 'none'}",
    ]
    return "\n".join(lines)


def activation_line(graph: Graph, itemsize: int) -> str:
    """The blobs' bytes, and what a net holds of them with the memory plan (:func:`memory_estimate`)."""
    data, gradients, held, buffers = memory_estimate(graph, itemsize)
    if graph.state.phase == "TRAIN":
        return (f"activations: {human_bytes(data)} of data and {human_bytes(gradients)} of gradients; netspec train "
                f"holds {human_bytes(held)} of them (gradients in {buffers} shared buffers)")
    return (f"activations: {human_bytes(data)} of data; netspec test and predict hold {human_bytes(held)} "
            f"(blobs in {buffers} shared buffers)")


def memory_estimate(graph: Graph, itemsize: int = 4) -> tuple[int, int, int, int]:
    """``(data bytes, gradient bytes, bytes held, shared buffers)`` of the blobs (parameters left out): in TRAIN
    what ``netspec train`` holds with its gradients in shared buffers, else what ``netspec test`` and ``predict``
    hold with their data in shared buffers (:mod:`netspec.graph.memory`).  Split tops that read their bottom's data
    hold none of their own (nor, in ``test`` and ``predict``, sums written over a bottom)."""
    sizes = {name: math.prod(shape) * itemsize for name, shape in graph.blob_shapes.items()}
    aliases = split_aliases(graph)
    data = sum(size for name, size in sizes.items() if name not in aliases)
    if graph.state.phase == "TRAIN":
        needed, plan = diff_blobs(graph), diff_plan(graph)
        own = needed - set(plan.buffer_of)
        gradients = sum(sizes[name] for name in needed)
        return data, gradients, data + plan.elements() * itemsize + sum(sizes[name] for name in own), len(plan.buffers)
    plan, aliases = data_plan(graph), data_aliases(graph)
    own = {name for name in sizes if name not in aliases and name not in plan.buffer_of}
    return data, 0, plan.elements() * itemsize + sum(sizes[name] for name in own), len(plan.buffers)


def human_count(count: int) -> str:
    """A count with a metric prefix: 1.234 G."""
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= size:
            return f"{count / size:.4g} {unit}"
    return str(count)


def graph_batch(graph: Graph) -> int:
    """The first axis of the first layer's first top."""
    first = next((node.top_shapes[0] for node in graph.nodes if node.top_shapes), ())
    return first[0] if first else 1


def _shape(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")" if shape else "()"


def summary(cls) -> str:
    """What a layer type or update rule does, in one line: its docstring's first paragraph, without the leading
    ``Type:``."""
    first = (inspect.getdoc(cls) or "").split("\n\n")[0]
    return " ".join(first.split()).split(":", 1)[-1].strip()


def default_text(spec: dataclasses.Field) -> str:
    """A field's default as the docs show it: ``required``, ``none`` (nothing given: its description says what
    then), a value or the changed keys of a mapping."""
    if spec.metadata.get("required"):
        return "required"
    if spec.default_factory is not dataclasses.MISSING:
        value = spec.default_factory()
        if dataclasses.is_dataclass(value):
            plain = type(value)()
            changed = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)
                       if getattr(value, f.name) != getattr(plain, f.name)}
            shown = changed or {"type": getattr(value, "type", "")}
            return "{" + ", ".join(f"{k}: {v}" for k, v in shown.items()) + "}"
        return str(value) if value or value in (0, False) else "none"
    return "none" if spec.default is None else str(spec.default)


def params_doc(block_name: str, cls) -> str:
    """A parameter list for one params dataclass: name, type, default, description."""
    hints = typing.get_type_hints(cls)
    rows = [[f.name, type_name(hints[f.name]), default_text(f), f.metadata.get("doc", "")]
            for f in dataclasses.fields(cls)]
    return f"{block_name}:\n" + "\n".join(
        "  " + line for line in format_table(["name", "type", "default", "meaning"], rows).splitlines())


def count_text(bounds: tuple[int, int | None]) -> str:
    """A bottom or top count: ``2``, ``1-3`` or ``1+``."""
    low, high = bounds
    return str(low) if low == high else f"{low}+" if high is None else f"{low}-{high}"


def layer_doc(cls) -> str:
    """Everything ``netspec layers TYPE`` prints: the docstring, counts, in-place, parameters."""
    parts = [
        inspect.getdoc(cls) or cls.type,
        f"bottoms: {count_text(cls.num_bottoms)}   tops: {count_text(cls.num_tops)}   "
        f"in place: {'yes' if cls.inplace_ok else 'no'}"
        + ("   loss: yes (loss_weight 1)" if cls.is_loss else ""),
    ]
    parts += [params_doc(name, block) for name, block in cls.param_blocks.items()]
    if not cls.param_blocks:
        parts.append("parameters: none")
    return "\n\n".join(parts)


def solver_doc(cls) -> str:
    """Everything ``netspec solvers TYPE`` prints: the rule's docstring and the learning-rate policies."""
    policies = "\n".join(f"  {name:<10} {formula}" for name, formula in LR_FORMULAS.items())
    decay = ("adds weight decay to the step, times the rate (decoupled)" if cls.decoupled_decay
             else "adds weight decay to the gradient")
    return (f"{inspect.getdoc(cls)}\n\nThe loop first clips the gradient to clip_gradients (global L2 norm), "
            f"divides it by iter_size and {decay}; rate = lr(iter) * lr_mult.\n\n"
            f"lr(iter), by lr_policy:\n{policies}\n{WARMUP_FORMULA}")
