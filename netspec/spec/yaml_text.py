"""YAML as netspec writes it: the files it makes for people to read (imported, rendered, derived nets and solvers).

The top level takes one line per key (or item), whatever it holds; below it a
list or mapping of plain values stays on one line (``kernel_size: [3, 3]``,
``param: {lr_mult: 1}``) and anything holding more is a block; keys keep their order;
a value written twice is written twice, never as a YAML anchor and alias
(``&id001`` / ``*id001``), which people reading the file would have to follow.
"""

from __future__ import annotations

import yaml


class _Writer(yaml.SafeDumper):
    """PyYAML's safe dumper without aliases, its top level always a block."""

    def ignore_aliases(self, data) -> bool:
        return True

    def represent(self, data) -> None:
        node = self.represent_data(data)
        node.flow_style = False  # (the top level: one line per key or item)
        self.serialize(node)
        self.represented_objects, self.object_keeper, self.alias_key = {}, [], None


def config_yaml(data) -> str:
    """``data`` (a net or a solver, as plain dicts, lists and values) as the text of a netspec file."""
    return yaml.dump(data, Dumper=_Writer, sort_keys=False, default_flow_style=None, width=120, allow_unicode=True)
