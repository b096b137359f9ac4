"""Building nets in Python: ``NetSpec`` and the layer factory ``L`` (Caffe's pycaffe.NetSpec, for netspec YAML).

>>> from netspec import NetSpec, L
>>> n = NetSpec("tiny")
>>> n.data = L.Input(shape=dict(dim=[8, 1, 28, 28]))
>>> n.conv1 = L.Convolution(n.data, num_output=20, kernel_size=5, weight_filler=dict(type="xavier"))
>>> n.relu1 = L.ReLU(n.conv1, in_place=True)
>>> text = n.to_yaml()

``L.Type(*bottoms, **params)`` makes a layer: a keyword that names a field of
one of the type's parameter blocks goes into that block (``num_output`` into
``convolution_param``), a block name takes a whole mapping, and ``param``,
``include``, ``exclude``, ``loss_weight`` and ``propagate_down`` are the
layer's own keys; ``ntop=N`` gives N tops and ``in_place=True`` writes the top
over the first bottom.  Assigning a top to an attribute names it (and the
layer, after its first top).  Each layer is validated and its top shapes
inferred as soon as it is named, so a wrong shape stops the script at the line
that made it.
"""

from __future__ import annotations

import dataclasses

from netspec.engine.registry import layer_class, layer_schemas, layer_types
from netspec.errors import ConfigError, ParamError, ShapeError, did_you_mean, shown
from netspec.spec.net_spec import parse_layer
from netspec.spec.schema import Context
from netspec.spec.yaml_lines import YamlList, YamlMap
from netspec.spec.yaml_text import config_yaml

LAYER_KEYS = ("param", "include", "exclude", "loss_weight", "propagate_down")


class Top:
    """One output of a layer, named when assigned to a NetSpec attribute."""

    def __init__(self, function: Function, index: int):
        self.function, self.index = function, index

    @property
    def name(self) -> str | None:
        """The blob's name (None until assigned); an in-place top is its bottom's blob."""
        if self.function.in_place:
            return self.function.bottoms[0].name
        return self.function.top_names[self.index]


class Function:
    """A layer waiting for its tops' names."""

    def __init__(self, type_name: str, bottoms: tuple, params: dict, ntop: int, in_place: bool):
        self.type, self.bottoms, self.ntop, self.in_place = type_name, list(bottoms), ntop, in_place
        self.layer_keys, self.blocks = _route(type_name, params)
        self.tops = [Top(self, i) for i in range(ntop)]
        self.top_names: list[str | None] = [None] * ntop
        self.name: str | None = None

    def entry(self) -> dict:
        """The layer as a YAML mapping."""
        tops = [self.bottoms[0].name] if self.in_place else self.top_names
        layer = {"name": self.name, "type": self.type}
        if self.bottoms:
            layer["bottom"] = [b.name for b in self.bottoms] if len(self.bottoms) > 1 else self.bottoms[0].name
        if tops:
            layer["top"] = tops if len(tops) > 1 else tops[0]
        layer.update(self.layer_keys)
        layer.update(self.blocks)
        return layer


def _route(type_name: str, params: dict) -> tuple[dict, dict]:
    """Split keyword arguments into the layer's own keys and its parameter blocks."""
    schemas = layer_schemas()
    if type_name not in schemas:
        raise ConfigError(f"L.{type_name}: unknown layer type{did_you_mean(type_name, layer_types())}")
    schema = schemas[type_name]
    layer_keys, blocks = {}, {}
    for key, value in params.items():
        if key in LAYER_KEYS:
            layer_keys[key] = value
        elif key in schema:
            blocks.setdefault(key, {}).update(value)
        else:
            owners = [block for block, cls in schema.items() if key in {f.name for f in dataclasses.fields(cls)}]
            if not owners:
                fields = [f.name for cls in schema.values() for f in dataclasses.fields(cls)]
                raise ConfigError(f"L.{type_name}: no parameter '{key}'{did_you_mean(key, fields + list(LAYER_KEYS))}"
                                  f" (netspec layers {type_name} lists them)")
            blocks.setdefault(owners[0], {})[key] = value
    return layer_keys, blocks


class _LayerFactory:
    """``L.Convolution(...)`` and so on, for every registered layer type."""

    def __getattr__(self, type_name: str):
        if type_name.startswith("__"):
            raise AttributeError(type_name)

        def make(*bottoms, ntop: int = 1, in_place: bool = False, **params):
            for bottom in bottoms:
                if not isinstance(bottom, Top):
                    raise ConfigError(f"L.{type_name}: bottoms must be tops of other layers, got {shown(bottom)}")
            function = Function(type_name, bottoms, params, ntop, in_place)
            return function.tops[0] if ntop == 1 else tuple(function.tops)

        return make


L = _LayerFactory()


class NetSpec:
    """A net under construction: assign tops to attributes, then :meth:`to_yaml`."""

    def __init__(self, name: str = "", phase: str = "TRAIN"):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_phase", phase)
        object.__setattr__(self, "_functions", [])
        object.__setattr__(self, "_tops", {})
        object.__setattr__(self, "_shapes", {})

    def __setattr__(self, name: str, top) -> None:
        if not isinstance(top, Top):
            raise ConfigError(f"NetSpec.{name}: assign a top of a layer (L.Type(...)), got {type(top).__name__}")
        function = top.function
        if any(b.name is None for b in function.bottoms):
            raise ConfigError(f"NetSpec.{name}: a bottom of this {function.type} layer was never assigned a name")
        if function.in_place and function.name is not None:
            raise ConfigError(f"NetSpec.{name}: this in-place {function.type} layer is already named "
                              f"'{function.name}'")
        first = function.name is None
        function.top_names[top.index] = name
        if first:
            function.name = name
        if all(function.top_names) or function.in_place:
            try:
                self._check(function)
            except (ConfigError, ShapeError):
                function.top_names[top.index] = None
                if first:
                    function.name = None
                raise
        if first:
            self._functions.append(function)
        self._tops[name] = top

    def __getattr__(self, name: str) -> Top:
        tops = object.__getattribute__(self, "_tops")
        if name not in tops:
            raise AttributeError(f"no top '{name}' yet{did_you_mean(name, tops)}")
        return tops[name]

    def _check(self, function: Function) -> None:
        """Validate the layer and infer its top shapes from those of its bottoms."""
        node = _yaml_map(function.entry())
        ctx = Context(None, ".")
        spec = parse_layer(node, len(self._functions) - 1, layer_schemas(), ctx, 0)
        if ctx.problems or spec is None:
            raise ConfigError([dataclasses.replace(p, file=None, line=None) for p in ctx.problems])
        layer = layer_class(function.type)(spec, self._phase)
        try:
            bottom_shapes = [self._shapes[b.name] for b in function.bottoms]
            shapes = layer.top_shapes(bottom_shapes)
        except (ShapeError, ParamError) as exc:
            key = f"{exc.key}: " if getattr(exc, "key", None) else ""
            raise ShapeError(f"layer '{function.name}' ({function.type}): {key}{exc}") from None
        for name, shape in zip(spec.tops, shapes):
            self._shapes[name] = tuple(int(d) for d in shape)

    def shape(self, top: str) -> tuple[int, ...]:
        """The inferred shape of top ``top``."""
        return self._shapes[top]

    def to_dict(self) -> dict:
        """The net as plain data (a netspec net file's content)."""
        unnamed = [f.type for f in self._functions if not all(f.top_names) and not f.in_place]
        if unnamed:
            raise ConfigError(f"a {unnamed[0]} layer has tops that were never assigned to the NetSpec")
        net = {"name": self._name} if self._name else {}
        net["layers"] = [f.entry() for f in self._functions]
        return net

    def to_yaml(self) -> str:
        """A plain netspec net file."""
        return config_yaml(self.to_dict())


def _yaml_map(value):
    """Plain data as YamlMap/YamlList (what the config readers take)."""
    if isinstance(value, dict):
        return YamlMap({k: _yaml_map(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return YamlList(_yaml_map(v) for v in value)
    return value
