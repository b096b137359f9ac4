"""Cards of the reference architectures in ``netspec.configs`` (nets, no weights): ``netspec zoo list --builtin``."""

from __future__ import annotations

import os
from dataclasses import dataclass

from netspec.configs import FOLDER
from netspec.errors import ConfigError, Problem
from netspec.model_zoo.card import InputSpec
from netspec.spec.schema import Context, doc, read_block, required
from netspec.spec.yaml_lines import YamlList, load_yaml, read_source

BUILTIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "builtin.yaml")


@dataclass
class BuiltinCard:
    """A reference architecture: its deploy net among the reference configs and what it takes."""

    name: str = required(doc="model name")
    summary: str = required(doc="one line for people")
    net: str = required(doc="deploy net, relative to the reference configs' folder (resnet50/resnet50_deploy.yaml)")
    input: InputSpec = required(doc="what the net takes")
    task: str = doc("image-classification", "what the model does")

    @property
    def net_path(self) -> str:
        """The deploy net's path in this installation."""
        return os.path.join(FOLDER, self.net)


def builtin_cards() -> list[BuiltinCard]:
    """Every built-in card, validated."""
    text, filename = read_source(BUILTIN)
    tree = load_yaml(text, filename)
    ctx = Context(filename, os.path.dirname(filename))
    if not isinstance(tree, YamlList):
        raise ConfigError(Problem("the built-in cards must be a list", file=filename, line=1))
    cards = [read_block(BuiltinCard, item, ctx, "", tree.line_of(i)) for i, item in enumerate(tree)]
    if ctx.problems:
        raise ConfigError(ctx.problems)
    return cards
