"""Registries of layer types and solver types (update rules), with "did you mean" lookups.

Types register themselves with a decorator when their module is imported.
The registries fill on first use: the first lookup (or registration of a
type from outside the built-in packages) imports the built-in types
(``netspec.layers``, ``netspec.solvers``), then the layer plug-ins other
packages declare, so ``import netspec`` stays cheap.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
import warnings

from netspec.errors import NetspecError, did_you_mean

_LAYERS: dict[str, type] = {}
_SOLVERS: dict[str, type] = {}
BUILTIN = ("netspec.layers", "netspec.solvers")  # the packages whose modules register the built-in types
_plugins = threading.RLock()
_stage = "empty"  # then "plugins" while this thread loads the plug-ins (they register), then "filled"


def _fill() -> None:
    """Import the built-in types, then the plug-ins, once.

    The built-in packages are imported without a lock of this module held (the import system serialises them,
    and their registrations do not wait for this), so two threads never wait on each other; the plug-ins load
    after both packages are whole, so a plug-in can look up a built-in type and one taking a built-in's name is
    the one refused.
    """
    global _stage
    if _stage == "filled":
        return
    for package in BUILTIN:
        importlib.import_module(package)
    with _plugins:
        if _stage != "empty":  # filled by another thread meanwhile, or this thread is loading the plug-ins
            return
        _stage = "plugins"
        try:
            failures = load_plugins()
        finally:
            _stage = "filled"
    for failure in failures:
        warnings.warn(failure, stacklevel=2)


def _register(table: dict[str, type], kind: str, cls):
    if not cls.__module__.startswith(tuple(f"{package}." for package in BUILTIN)):
        _fill()  # the built-in types first, so that a class taking one's name is refused, not the built-in one
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


def load_plugins(group: str = "netspec.layers") -> list[str]:
    """Import the layer plug-ins installed packages declare under the entry-point ``group`` (each names a module
    whose classes register themselves, or a layer class); return a line for each that failed to load."""
    failures = []
    for entry in importlib.metadata.entry_points(group=group):
        try:
            loaded = entry.load()
            if isinstance(loaded, type) and _LAYERS.get(loaded.type) is not loaded:
                register_layer(loaded)  # (a type another class has is refused: a warning naming both)
        except Exception as exc:  # noqa: BLE001 - a broken plug-in costs its own layers, not netspec
            failures.append(f"layer plug-in '{entry.name}' ({entry.value}) did not load: {type(exc).__name__}: "
                            f"{exc}")
    return failures


def layer_types() -> dict[str, type]:
    """Every registered layer type, by name, in alphabetical order (BatchNorm before BNLL)."""
    _fill()
    return dict(sorted(_LAYERS.items(), key=lambda item: item[0].lower()))


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
    _fill()
    return dict(sorted(_SOLVERS.items()))


def solver_class(type_name: str) -> type:
    """The update rule registered as ``type_name``."""
    types = solver_types()
    if type_name not in types:
        raise NetspecError(f"unknown solver type '{type_name}'{did_you_mean(type_name, types)}")
    return types[type_name]
