"""What a net read from a file may do beyond computing, as its user allows: one options object, :class:`Trust`.

Three things a net can do to the machine it runs on are each allowed or not:
a Python layer imports its module (which runs that module's code), a layer
with side effects (``HDF5Output``) writes files, and those files may land
outside the output folder.  A user's own nets (``netspec train``, ``time``,
``test``) may do the first two (:data:`OWN`); a net from someone else (a zoo
model) none unless the user says so (:data:`SHARED`); a library call, and
what the commands only check, draw or convert, may write files inside the
folder but import no module (:data:`LIBRARY`; the imports and ``export
onnx``, which never run the net, let its paths point anywhere).  The ways from
a file to a net (:func:`netspec.engine.net.compile_file` and ``compile_net``,
``load_net``, the zoo's ``load`` and ``publish``, the solver) take a
:class:`Trust` and check it here: Python layers before any module is
imported, side effects once the net is compiled.
"""

from __future__ import annotations

from dataclasses import dataclass

from netspec.engine.outputs import OutputFolder
from netspec.errors import ConfigError

ALLOW_PYTHON = "pass --allow-python-layers if you trust this file"
ALLOW_SIDE_EFFECTS = "a net shared through a zoo runs without side effects unless its user allows them " \
                     "(--allow-side-effects)"


@dataclass(frozen=True)
class Trust:
    """What a net may do: ``python_layers`` (import their modules), ``side_effects`` (hold layers that write
    files), ``outputs_anywhere`` (those files may leave the output folder).

    The default is a library call's: a net may write files inside its folder but run no module.
    ``python_refusal`` and ``side_effect_refusal`` end the messages refusing either, saying how to allow it
    where the net is built.
    """

    python_layers: bool = False
    side_effects: bool = True
    outputs_anywhere: bool = False
    python_refusal: str = ALLOW_PYTHON
    side_effect_refusal: str = ALLOW_SIDE_EFFECTS

    @classmethod
    def own(cls, **changes) -> Trust:
        """A net the user runs as their own (training, ``netspec time`` and ``test``): Python layers allowed."""
        return cls(**{"python_layers": True, **changes})

    @classmethod
    def shared(cls, **changes) -> Trust:
        """A net from someone else (a zoo model): neither Python layers nor side effects, unless ``changes``."""
        return cls(**{"side_effects": False, **changes})

    def output_folder(self, root: str = ".") -> OutputFolder:
        """Where the net's layers may write: inside ``root``, or anywhere when ``outputs_anywhere``."""
        return OutputFolder(root, self.outputs_anywhere)

    def check_config(self, config) -> None:
        """Refuse a parsed net's Python layers, before any of their modules is imported, unless allowed."""
        if self.python_layers:
            return
        named = [layer.problem(f"a Python layer imports module '{layer.blocks['python_param'].module}', which runs "
                               f"its code: {self.python_refusal}", "type")
                 for layer in config.layers if layer.type == "Python"]
        if named:
            raise ConfigError(named)

    def check_graph(self, graph, where: str) -> None:
        """Refuse a compiled net (read from ``where``) holding layers with side effects, unless allowed."""
        found = [f"'{node.name}' ({node.layer.type})" for node in graph.nodes if node.layer.writes_files]
        if found and not self.side_effects:
            raise ConfigError(f"{where}: layer {', '.join(found)} writes files; {self.side_effect_refusal}")


LIBRARY = Trust()  # a library call's: files written inside the folder, no module run
OWN = Trust.own()  # a user's own net
SHARED = Trust.shared()  # a net from someone else
