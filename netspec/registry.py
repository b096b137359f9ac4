"""Registries of layer types and solver types (update rules), with "did you mean" lookups."""

from __future__ import annotations

from netspec.config import did_you_mean
from netspec.errors import NetspecError

_LAYERS: dict[str, type] = {}
_SOLVERS: dict[str, type] = {}


def _register(table: dict[str, type], kind: str, cls):
    existing = table.get(cls.type)
    if existing is not None and existing is not cls:
        raise NetspecError(f"{kind} type '{cls.type}' is registered twice "
                           f"({existing.__module__} and {cls.__module__})")
    table[cls.type] = cls
    return cls


def register_layer(cls):
    """Class decorator: make ``cls`` available under ``cls.type``; a second class of one type is refused."""
    return _register(_LAYERS, "layer", cls)


def register_solver(cls):
    """Class decorator for update rules, like :func:`register_layer`."""
    return _register(_SOLVERS, "solver", cls)


def _load_builtin_layers() -> None:
    import netspec.layers  # noqa: F401, PLC0415 - registers every built-in layer


def layer_types() -> dict[str, type]:
    """Every registered layer type, by name, sorted."""
    _load_builtin_layers()
    return dict(sorted(_LAYERS.items()))


def layer_class(type_name: str) -> type:
    """The class registered as ``type_name``."""
    types = layer_types()
    if type_name not in types:
        raise NetspecError(f"unknown layer type '{type_name}'{did_you_mean(type_name, types)} "
                           "(netspec layers lists them)")
    return types[type_name]


def layer_schemas() -> dict[str, dict[str, type]]:
    """``{type: {block name: params dataclass}}`` for config validation."""
    return {name: dict(cls.param_blocks) for name, cls in layer_types().items()}


def solver_types() -> dict[str, type]:
    """Every registered solver type (update rule), by name, sorted."""
    import netspec.solvers  # noqa: F401, PLC0415 - registers every built-in update rule

    return dict(sorted(_SOLVERS.items()))


def solver_class(type_name: str) -> type:
    """The update rule registered as ``type_name``."""
    types = solver_types()
    if type_name not in types:
        raise NetspecError(f"unknown solver type '{type_name}'{did_you_mean(type_name, types)}")
    return types[type_name]
