"""netspec: declarative, config-driven deep learning in the tradition of Caffe.

>>> import netspec
>>> net = netspec.load_net("configs/lenet/lenet_train_test.yaml", phase="TRAIN")
>>> loss = net.forward(); net.backward()
"""

__version__ = "0.1.0"

from netspec.errors import (  # noqa: E402
    ConfigError, DataError, NetspecError, ShapeError, StateError, TrainingError, WeightsError,
)
from netspec.builder import L, NetSpec  # noqa: E402
from netspec.net import Net, load_net  # noqa: E402
from netspec.solver import Solver, load_solver  # noqa: E402

__all__ = ["ConfigError", "DataError", "L", "Net", "NetSpec", "NetspecError", "ShapeError", "Solver", "StateError",
           "TrainingError", "WeightsError", "load_net", "load_solver", "__version__"]
