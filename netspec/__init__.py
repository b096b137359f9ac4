"""netspec: declarative, config-driven deep learning in the tradition of Caffe.

>>> import netspec
>>> net = netspec.load_net("configs/lenet/lenet_timing.yaml", phase="TRAIN")
>>> loss = net.forward(); net.backward()

Importing netspec registers the built-in layer types and update rules
(``netspec.layers``, ``netspec.solvers``); ARCHITECTURE.md maps the packages.
"""

import importlib
import warnings

from netspec import threads

threads.size_pools()  # before anything below imports NumPy

from netspec import layers, solvers  # noqa: F401 - importing them registers the built-in types
from netspec.engine.builder import L, NetSpec
from netspec.engine.net import Net, load_net
from netspec.engine.outputs import OutputFolder
from netspec.engine.registry import load_plugins
from netspec.errors import (
    ConfigError,
    DataError,
    NetspecError,
    ShapeError,
    StateError,
    TrainingError,
    WeightsError,
)
from netspec.layers.python_layer import PythonLayer
from netspec.training.solver import Solver, load_solver
from netspec.version import __version__

__all__ = ["ConfigError", "DataError", "L", "Net", "NetSpec", "NetspecError", "OutputFolder", "PythonLayer",
           "ShapeError", "Solver", "StateError", "TrainingError", "WeightsError", "load_net", "load_solver",
           "__version__"]

# netspec.<name> after a bare `import netspec` (imported when first used)
SUBMODULES = ("cli", "dashboard", "data", "engine", "graph", "inspect", "interop", "layers", "model_zoo", "solvers",
              "spec", "testing", "tools", "training")


def __getattr__(name: str):
    """The submodule ``name`` (``netspec.model_zoo``...), imported when first asked for."""
    if name in SUBMODULES:
        return importlib.import_module(f"netspec.{name}")
    raise AttributeError(f"module 'netspec' has no attribute {name!r}")


for _failure in load_plugins():  # layer types installed packages add (entry-point group netspec.layers), last
    warnings.warn(_failure, stacklevel=1)
