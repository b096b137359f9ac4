"""The extract-features command: chosen blobs' values for every record of a net's data, into an HDF5 file."""

from __future__ import annotations

import click

from netspec.cli.errors import user_errors
from netspec.cli.options import (
    Integer,
    level_option,
    no_python_layers_option,
    outputs_anywhere_option,
    own_net_trust,
    phase_option,
    stage_option,
    threads_option,
)
from netspec.cli.progress import progress_bar
from netspec.engine.net import load_net
from netspec.inspect.features import blob_list, check_blobs, extract_features, pass_size, refuse_existing, shape_text


@click.command("extract-features")
@click.argument("net_file", type=click.Path(dir_okay=False))
@click.argument("weights", type=click.Path(dir_okay=False))
@click.argument("blobs")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="the HDF5 file to write (.h5)")
@click.option("--iterations", "-n", type=Integer(min=1), default=None,
              help="batches to run, every row kept [default: one pass over the dataset, each record once]")
@phase_option("TEST")
@stage_option
@level_option
@click.option("--device", default="cpu", show_default=True, help="cpu, gpu or gpu:N")
@threads_option
@click.option("--overwrite", is_flag=True, help="replace OUT if it exists (once the new file is complete)")
@outputs_anywhere_option
@no_python_layers_option
@user_errors
def extract_features_command(net_file, weights, blobs, out, iterations, phase, stages, level, device, overwrite,
                             outputs_anywhere, no_python_layers):
    """Write the values of BLOBS for every record of NET_FILE's data, run with WEIGHTS, to an HDF5 file.

    BLOBS are blob names separated by commas (conv1,ip2).  OUT gets a dataset per blob, named after it, with a row
    per record in the order the data layer reads them (float32), and the data layer's labels as 'label'.  WEIGHTS
    is a .weights.h5 file.  Caffe's extract_features.
    """
    names = blob_list(blobs)
    refuse_existing(out, overwrite)  # (before the net is built and run)
    net = load_net(net_file, phase=phase.upper(), device=device, stages=stages or None, level=level,
                   trust=own_net_trust(no_python_layers, outputs_anywhere, "extraction"), inference=True,
                   reuse_memory=True, keep=tuple(names))  # (the chosen blobs keep arrays of their own)
    try:
        check_blobs(net, names)
        net.load_weights(weights)
        net.freeze()
        rows = pass_size(net, iterations)[1]
        with progress_bar(rows, "extracting") as advance:
            shapes = extract_features(net, names, out, iterations, overwrite, advance)
    finally:
        net.close()
    listed = [f"{name} ({shape_text(shape)})" for name, shape in shapes.items()]
    what = f"{rows:,} records" if iterations is None else f"{rows:,} rows ({iterations} batches of {net.batch_size})"
    click.echo(f"wrote {what} of {', '.join(listed[:-1])}{' and ' if len(listed) > 1 else ''}{listed[-1]} to {out}")
