"""Python: a layer the user writes, named in the config by module and class, as Caffe's Python layer.

Naming a module in a config runs its code when the net is built: nets from
someone else are refused (``netspec check``, ``predict`` and the zoo's
``load``) unless the user allows Python layers.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass

from netspec.engine.layer import Layer
from netspec.engine.registry import register_layer
from netspec.errors import ParamError, ShapeError
from netspec.spec.schema import doc, required


@dataclass
class PythonParams:
    """Parameters of Python (Caffe's PythonParameter)."""

    module: str = required(doc="the module holding the class (imported as Python would, else from the net "
                               "file's folder)")
    layer: str = required(doc="the class: a subclass of netspec.PythonLayer")
    param_str: str = doc("", "a string the class reads as it likes (self.param_str)")
    share_in_parallel: bool = doc(False, "Caffe's multi-GPU option; ignored")


@register_layer
class PythonLayer(Layer):
    """Python: a layer written in Python by the user, as Caffe's Python layer.

    ``python_param.module`` and ``layer`` name a subclass of
    ``netspec.PythonLayer``; it implements the contract of every layer
    (``top_shapes``, ``param_shapes``/``param_fillers`` to learn,
    ``forward``, ``backward``; ``num_bottoms``/``num_tops``, ``inplace_ok``,
    ``is_loss`` as class attributes) and reads ``self.param_str``.  Check it
    with ``netspec.testing.check_layer("Python", ...)``.  Building the net
    imports the module, which runs its code: netspec check, predict and the
    zoo refuse nets with Python layers unless ``--allow-python-layers``.

    Example::

        - name: loss
          type: Python
          bottom: [pred, label]
          top: loss
          python_param: {module: my_layers, layer: SquaredError, param_str: "scale: 2"}

    with ``my_layers.py`` beside the net file::

        import netspec

        class SquaredError(netspec.PythonLayer):
            num_bottoms = (2, 2)
            is_loss = True

            def top_shapes(self, bottom_shapes):
                return [()]
            ...
    """

    overwrites = False  # a user's layer: its blobs keep arrays of their own in a net that reuses memory
    changes_blobs = True  # (a user's forward may change its blobs: a frozen net leaves them writable)

    type = "Python"
    param_blocks = {"python_param": PythonParams}
    num_bottoms = (0, None)
    num_tops = (0, None)
    learnable = True

    @property
    def param_str(self) -> str:
        """``python_param.param_str``."""
        return self.block("python_param").param_str

    @classmethod
    def resolve_class(cls, spec) -> type[PythonLayer]:
        """The user's class that ``spec``'s python_param names (ParamError naming the module when it cannot be
        had)."""
        p = spec.blocks["python_param"]
        module = _import(p.module, os.path.dirname(os.path.abspath(spec.file)) if spec.file else None)
        user = getattr(module, p.layer, None)
        if user is None:
            raise ParamError("python_param.layer", f"module '{p.module}' ({module.__file__}) has no class "
                                                   f"'{p.layer}'")
        if not (isinstance(user, type) and issubclass(user, PythonLayer)):
            raise ParamError("python_param.layer", f"'{p.module}.{p.layer}' is not a subclass of "
                                                   "netspec.PythonLayer")
        return user

    @classmethod
    def describe(cls, spec, phase, bottom_shapes):
        try:
            return super().describe(spec, phase, bottom_shapes)
        except (ShapeError, ParamError):
            raise
        except Exception as exc:  # noqa: BLE001 - the user's code: one line naming it, no traceback
            raise ShapeError(f"{_named(spec)} failed to give its shapes: {type(exc).__name__}: {exc}") from None

    def setup(self, bottom, top, backend, dtype) -> None:
        try:
            super().setup(bottom, top, backend, dtype)
        except (ShapeError, ParamError):
            raise
        except Exception as exc:  # noqa: BLE001 - the user's code
            raise ParamError("python_param.layer", f"{_named(self.spec)} failed in setup: "
                                                   f"{type(exc).__name__}: {exc}") from None


def _named(spec) -> str:
    p = spec.blocks["python_param"]
    return f"'{p.module}.{p.layer}'"


MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _import(name: str, folder: str | None):
    """Module ``name`` as Python imports it, else ``name.py`` in ``folder`` (loaded once per file, under a name of
    its own, so that two nets' modules of one name stay apart)."""
    if not MODULE_NAME.fullmatch(name):
        raise ParamError("python_param.module", f"'{name}' is not a module name (dotted Python identifiers)")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name.split(".")[0] or folder is None or not os.path.isfile(os.path.join(folder,
                                                                                               f"{name}.py")):
            looked = f" or in {folder}" if folder else ""
            raise ParamError("python_param.module", f"no module '{name}' on Python's path{looked}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module
        raise ParamError("python_param.module", f"importing '{name}' raised {type(exc).__name__}: {exc}") from None
    path = os.path.join(folder, f"{name}.py")
    unique = f"netspec_python_layers.{hashlib.sha256(path.encode()).hexdigest()[:16]}.{name}"
    if unique in sys.modules:
        return sys.modules[unique]
    spec = importlib.util.spec_from_file_location(unique, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's module
        raise ParamError("python_param.module", f"importing '{path}' raised {type(exc).__name__}: {exc}") from None
    sys.modules[unique] = module
    return module
