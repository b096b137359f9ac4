"""netspec: declarative, config-driven deep learning in the tradition of Caffe.

>>> import netspec
>>> net = netspec.load_net("configs/lenet/lenet_timing.yaml", phase="TRAIN")
>>> loss = net.forward(); net.backward()

Importing netspec is cheap: the names below and the subpackages
(``netspec.model_zoo``...) load when first used, and the layer types and
update rules register on the registry's first lookup
(:mod:`netspec.engine.registry`).  ARCHITECTURE.md maps the packages.
"""

import importlib

from netspec import threads

threads.size_pools()  # before anything imports NumPy

from netspec.errors import (
    ConfigError,
    DataError,
    NetspecError,
    ShapeError,
    StateError,
    TrainingError,
    WeightsError,
)
from netspec.version import __version__

# the public names that load a module of their own, by the module that defines them
LAZY = {
    "L": "netspec.engine.builder",
    "NetSpec": "netspec.engine.builder",
    "Net": "netspec.engine.net",
    "load_net": "netspec.engine.net",
    "OutputFolder": "netspec.engine.outputs",
    "PythonLayer": "netspec.layers.python_layer",
    "Solver": "netspec.training.solver",
    "load_solver": "netspec.training.solver",
}
# netspec.<name> after a bare `import netspec`
SUBMODULES = ("cli", "configs", "dashboard", "data", "engine", "graph", "inspect", "interop", "layers", "model_zoo",
              "solvers", "spec", "testing", "tools", "training")

__all__ = ["ConfigError", "DataError", "L", "Net", "NetSpec", "NetspecError", "OutputFolder", "PythonLayer",
           "ShapeError", "Solver", "StateError", "TrainingError", "WeightsError", "load_net", "load_solver",
           "__version__"]


def __getattr__(name: str):
    """A public name or a submodule (``netspec.load_net``, ``netspec.model_zoo``...), imported when first asked for."""
    if name in LAZY:
        value = getattr(importlib.import_module(LAZY[name]), name)
        globals()[name] = value
        return value
    if name in SUBMODULES:
        return importlib.import_module(f"netspec.{name}")
    raise AttributeError(f"module 'netspec' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *LAZY, *SUBMODULES})
