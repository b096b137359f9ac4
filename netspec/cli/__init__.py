"""The ``netspec`` command: one module per command family, each parsing options and calling the library.

User errors become one-line messages (:mod:`netspec.cli.errors`), never tracebacks.
"""

from __future__ import annotations

import click

from netspec.cli import configs, dashboard, data, features, interop, nets, train, zoo


@click.group()
@click.version_option(package_name="netspec")
def main():
    """netspec: declarative deep-learning nets and solvers in YAML."""


for command in (
    nets.check, nets.layers, nets.solvers, nets.render, nets.deploy_net, nets.draw, nets.time_command,
    nets.test_command, nets.device_query, features.extract_features_command,
    train.train, train.plot, train.lr_plot,
    data.convert, data.compute_mean_command, data.data, configs.configs,
    zoo.zoo, zoo.predict,
    interop.export, interop.import_group,
    dashboard.dashboard,
):
    main.add_command(command)
