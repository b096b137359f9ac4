"""The ``netspec`` command: one module per command family, each parsing options and calling the library.

The group loads a family's module only when one of its commands runs (or
prints its own help), so ``netspec --help`` imports none of the library.
User errors become one-line messages (:mod:`netspec.cli.errors`), never
tracebacks.
"""

from __future__ import annotations

import importlib

import click

# every command: its family's module, the click object's name there, and what `netspec --help` shows for it
# (the first paragraph of the command's own help, on one line; a test keeps the two equal)
COMMANDS = {
    "check": ("nets", "check", "Validate NET_FILE and print every layer's tops, parameters and memory."),
    "layers": ("nets", "layers", "List every layer type, or print the documentation of LAYER_TYPE."),
    "solvers": ("nets", "solvers", "List every solver type (update rule), or print the formulas of SOLVER_TYPE."),
    "render": ("nets", "render", "Print NET_FILE with its modules, repeats and includes expanded: a plain net file."),
    "deploy-net": ("nets", "deploy_net", "Derive the deploy net of a train/val net: Input for the data, losses and "
                                         "accuracy dropped, Softmax added."),
    "draw": ("nets", "draw", "Draw NET_FILE's layer graph with blob shapes on the edges (.svg/.png need Graphviz's "
                             "dot)."),
    "time": ("nets", "time_command", "Time forward and backward passes of NET_FILE, layer by layer."),
    "test": ("nets", "test_command", "Score trained WEIGHTS on NET_FILE: each output averaged over one pass of its "
                                     "dataset (or N batches)."),
    "device-query": ("nets", "device_query", "Print the devices nets can run on here: the CPU (cores, NumPy, oneDNN, "
                                             "threads) and each GPU CuPy sees (name, compute capability, free memory, "
                                             "with the CuPy, CUDA and driver versions)."),
    "extract-features": ("features", "extract_features_command", "Write the values of BLOBS for every record of "
                         "NET_FILE's data, run with WEIGHTS, to an HDF5 file."),
    "train": ("train", "train", "Train the net of SOLVER_FILE, testing, logging and snapshotting as it says."),
    "plot": ("train", "plot", "Draw train loss, test outputs and learning rate of one or more runs (their "
                              "metrics.jsonl) into a PNG."),
    "lr-plot": ("train", "lr_plot", "Draw the learning rate SOLVER_FILE gives at every iteration, before training."),
    "convert": ("data", "convert", "Turn datasets into files the data layers read."),
    "compute-mean": ("data", "compute_mean_command", "Write the per-pixel mean of DATASET's records (for "
                                                     "transform_param.mean_file)."),
    "data": ("data", "data", "Look into datasets."),
    "configs": ("configs", "configs", "List the reference nets and solvers that ship with netspec (copy one with: "
                                      "netspec configs copy NAME)."),
    "zoo": ("zoo", "zoo", "Publish, share, download and check trained models."),
    "predict": ("zoo", "predict", "Classify image files (or .npy arrays) with MODEL, a zoo name[@version] or a model "
                                  "folder."),
    "export": ("interop", "export", "Write nets in other formats."),
    "import": ("interop", "import_group", "Bring nets, solvers and weights over from Caffe and ONNX."),
    "dashboard": ("dashboard", "dashboard", "Serve WORKSPACE (default: this folder) in the browser: its runs (state, "
                                            "live curves, configs, net), new runs, its datasets (and new ones from "
                                            "image folders), and the zoo's models (publish, predict)."),
}


class LazyGroup(click.Group):
    """A click group whose commands are imported from their module when asked for by name."""

    def list_commands(self, context: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, context: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attribute, _ = COMMANDS[name]
        return getattr(importlib.import_module(f"netspec.cli.{module}"), attribute)

    def format_commands(self, context: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``netspec --help``, from the table: no command module is imported."""
        limit = formatter.width - 6 - max(map(len, COMMANDS))
        rows = [(name, shortened(COMMANDS[name][2], limit)) for name in sorted(COMMANDS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def shortened(text: str, limit: int) -> str:
    """``text`` cut at a word to fit ``limit`` characters, ending in "..." when cut."""
    if len(text) <= limit:
        return text
    return text[:max(limit - 3, 1)].rsplit(" ", 1)[0].rstrip(",;:") + "..."


@click.group(cls=LazyGroup)
@click.version_option(package_name="netspec")
def main():
    """netspec: declarative deep-learning nets and solvers in YAML."""
