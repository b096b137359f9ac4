"""Commands about the model zoo: zoo publish | list | show | verify | remove | serve | download | import-caffe |
finetune, and predict."""

from __future__ import annotations

import json
import os
import shlex
import sys

import click

from netspec.cli.errors import user_errors
from netspec.cli.interop import echo_report
from netspec.cli.options import (
    Integer,
    Real,
    outputs_anywhere_option,
    python_layers_option,
    side_effects_option,
    threads_option,
)
from netspec.cli.output import echo
from netspec.cli.progress import progress_bar
from netspec.engine.trust import Trust
from netspec.errors import NetspecError
from netspec.inspect.report import format_table
from netspec.model_zoo.builtin import builtin_cards
from netspec.model_zoo.caffe_zoo import CaffeImport, import_caffe, open_directory
from netspec.model_zoo.card import read_card, readme
from netspec.model_zoo.download import download, read_index
from netspec.model_zoo.finetune import prepare_finetune
from netspec.model_zoo.predict import load, model_folder, read_inputs
from netspec.model_zoo.publish import PublishRequest, publish, untold_preprocessing
from netspec.model_zoo.serve import IDLE_TIMEOUT, make_server
from netspec.model_zoo.sources import FILE_DEADLINE, configured_sources, open_source
from netspec.model_zoo.zoo import Zoo, ZooError

zoo_option = click.option("--zoo", "zoo_dir", type=click.Path(file_okay=False), default=None,
                          help="zoo folder [default: $NETSPEC_ZOO, else ~/.local/share/netspec/zoo]")
timeout_option = click.option("--timeout", type=Real(min=0.1), default=30, show_default=True,
                              help="seconds without data before giving up")
force_option = click.option("--force", is_flag=True, help="replace the model if the zoo already has that version")


def parse_floats(value: str | None, option: str) -> list[float] | None:
    """``1,2.5,3`` as floats."""
    if value is None:
        return None
    try:
        return [float(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"expected numbers separated by commas, got '{value}'", param_hint=option) from None


@click.group()
def zoo():
    """Publish, share, download and check trained models."""


@zoo.command("publish")
@click.option("--name", required=True, help="model name (lower-case letters, digits, '.', '_', '-')")
@click.option("--version", "version", default="1", show_default=True)
@click.option("--net", "net_file", type=click.Path(dir_okay=False), default=None,
              help="the deploy net [default: derived from the run's train net, as netspec deploy-net does]")
@click.option("--weights", type=click.Path(dir_okay=False), default=None,
              help="trained weights (.weights.h5) [default: the run's latest snapshot]")
@click.option("--run", "run_dir", type=click.Path(file_okay=False), default=None,
              help="the training run folder: metrics, provenance, preprocessing, label names and configs come "
                   "from it")
@click.option("--labels", "labels_file", type=click.Path(dir_okay=False), default=None,
              help="class names, one a line [default: those of the run's dataset]")
@click.option("--license", "license_", default="unspecified", show_default=True)
@click.option("--summary", default="", help="one line describing the model")
@click.option("--author", "authors", multiple=True, help="an author (repeatable)")
@click.option("--scale", type=Real(), default=None, help="input scale (default: the run's transform_param, else 1)")
@click.option("--mean-value", default=None, help="per-channel input mean, e.g. 104,117,123")
@click.option("--channels", type=click.Choice(["RGB", "BGR", "GRAY"]), default=None,
              help="input channels [default: GRAY for 1 channel, else the run's transform_param.channel_order, "
                   "else RGB]")
@zoo_option
@click.option("--force", is_flag=True, help="replace an existing name@version")
@side_effects_option
@user_errors
def zoo_publish(name, version, net_file, weights, run_dir, labels_file, license_, summary, authors, scale, mean_value,
                channels, zoo_dir, force, allow_side_effects):
    """Publish a deploy net and its trained weights as NAME@VERSION in a zoo (from a run folder: --run)."""
    request = PublishRequest(name=name, version=version, net=net_file, weights=weights, run_dir=run_dir,
                             labels_file=labels_file, license=license_, summary=summary, authors=list(authors),
                             scale=scale, mean_value=parse_floats(mean_value, "--mean-value"), channels=channels,
                             force=force, trust=Trust.shared(side_effects=allow_side_effects))
    target = Zoo(zoo_dir)
    card = publish(request, target)
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in card.metrics.items())
    echo(f"published {card.ref} to {target.folder(card.name, card.version)}"
               + (f" ({metrics})" if metrics else ""))
    if (note := untold_preprocessing(request)) is not None:
        echo(f"note: {note}")


@zoo.command("list")
@zoo_option
@click.option("--from", "source", default=None,
              help="list another zoo, or a Caffe models tree, instead (folder or URL)")
@click.option("--builtin", is_flag=True, help="the reference architectures shipped with netspec (no weights)")
@user_errors
def zoo_list(zoo_dir, source, builtin):
    """List the models of a zoo, each with its versions."""
    if builtin:
        rows = [[c.name, "x".join(map(str, c.input.shape)), c.net, c.summary] for c in builtin_cards()]
        echo(format_table(["name", "input", "net (config only)", "summary"], rows))
        return
    index, where, notes = read_index(zoo_dir, source)
    if index["models"]:
        rows = [[name, ", ".join(entry["versions"]), entry.get("task", ""), entry.get("summary", "")]
                for name, entry in index["models"].items()]
        echo(format_table(["name", "versions", "task", "summary"], rows))
    else:
        echo(f"{where}: no models")
    for note in notes:
        echo(f"note: {note}")


@zoo.command("show")
@click.argument("ref", metavar="NAME[@VERSION]")
@zoo_option
@user_errors
def zoo_show(ref, zoo_dir):
    """Print the card of a model (its README)."""
    echo(readme(Zoo(zoo_dir).card(ref)), nl=False)


@zoo.command("verify")
@click.argument("ref", metavar="[NAME[@VERSION]]", required=False)
@zoo_option
@user_errors
def zoo_verify(ref, zoo_dir):
    """Re-hash every file of one model (or of every model) against its card."""
    local = Zoo(zoo_dir)
    if ref is None and not local.index()["models"]:
        echo(f"{local.root}: no models to verify" + ("" if os.path.isdir(local.root) else " (no zoo there yet)"))
        return
    problems = local.verify(ref)
    if problems:
        raise ZooError(f"{len(problems)} problem(s): " + "; ".join(problems))
    echo(f"{ref or 'every model'} in {local.root}: every file matches its card")


@zoo.command("remove")
@click.argument("ref", metavar="NAME[@VERSION]")
@zoo_option
@user_errors
def zoo_remove(ref, zoo_dir):
    """Delete one version of a model, or all its versions."""
    for removed in Zoo(zoo_dir).remove(ref):
        echo(f"removed {removed}")


@zoo.command("serve")
@zoo_option
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=Integer(0, 65535), default=8765, show_default=True, help="0 picks a free port")
@click.option("--verbose", is_flag=True, help="log every request")
@click.option("--idle-timeout", type=Real(min=0.1), default=IDLE_TIMEOUT, show_default=True,
              help="seconds a connection may send or take nothing before it is closed")
@user_errors
def zoo_serve(zoo_dir, host, port, verbose, idle_timeout):
    """Serve a zoo read-only over HTTP until interrupted."""
    local = Zoo(zoo_dir)
    local.index()  # refuse a broken zoo before serving it
    try:
        server = make_server(local.root, host, port, verbose, idle_timeout)
    except OSError as exc:
        raise NetspecError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    echo(f"serving {local.root} at http://{host}:{server.server_address[1]}/ (Ctrl-C stops)")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@zoo.command("download")
@click.argument("ref", metavar="NAME[@VERSION]")
@click.option("--from", "sources", multiple=True,
              help="zoo or Caffe models tree (folder or URL) to look in (repeatable, tried in order) [default: the "
                   "sources of ~/.config/netspec/zoo.yaml]")
@zoo_option
@timeout_option
@click.option("--deadline", type=Real(min=1), default=FILE_DEADLINE, show_default=True,
              help="seconds the transfer of one file may take (what came is kept: run again to continue)")
@force_option
@user_errors
def zoo_download(ref, sources, zoo_dir, timeout, deadline, force):
    """Download a model, check the size and sha256 of every file, then install it (from a Caffe models tree:
    import it, as import-caffe does)."""
    opened = [open_source(s, timeout, deadline) for s in (sources or configured_sources())]
    local = Zoo(zoo_dir)
    card = download(ref, opened, local, force=force, progress_factory=download_progress, timeout=timeout)
    echo_installed(card, local)


@zoo.command("import-caffe")
@click.argument("location", metavar="DIR_OR_URL")
@click.option("--name", default=None, help="model name [default: the directory's name, lower-case]")
@click.option("--weights", type=click.Path(dir_okay=False), default=None,
              help="the .caffemodel [default: the file beside readme.md, else the readme's caffemodel_url]")
@click.option("--mean-value", default=None, help="per-channel input mean in B, G, R order, e.g. 104,117,123 "
                                                 "[default: none]")
@click.option("--labels", "labels_file", type=click.Path(dir_okay=False), default=None,
              help="class names, one a line")
@zoo_option
@timeout_option
@force_option
@user_errors
def zoo_import_caffe(location, name, weights, mean_value, labels_file, zoo_dir, timeout, force):
    """Import a Caffe Model Zoo directory (readme.md with front matter, deploy.prototxt, ...) as one model."""
    request = CaffeImport(name=name, weights=weights, mean_value=parse_floats(mean_value, "--mean-value"),
                          labels_file=labels_file, force=force, timeout=timeout)
    local = Zoo(zoo_dir)
    card, report = import_caffe(open_directory(location, timeout), local, request, download_progress)
    echo_installed(card, local)
    echo_report(report)


@zoo.command("finetune")
@click.argument("model", metavar="MODEL")
@click.argument("dataset", type=click.Path(file_okay=False))
@click.option("--out", "run_dir", required=True, type=click.Path(file_okay=False),
              help="the run folder of the training (the configs go into OUT/finetune/)")
@zoo_option
@user_errors
def zoo_finetune(model, dataset, run_dir, zoo_dir):
    """Prepare fine-tuning MODEL (a zoo name[@version] or a model folder) on DATASET (a dataset folder, or a folder
    of train/ and val/ datasets) and print the netspec train command that runs it."""
    prepared = prepare_finetune(model, dataset, run_dir, zoo_dir)
    for note in prepared.notes:
        echo(f"note: {note}")
    echo(f"prepared {prepared.solver}; train with:")
    echo(shlex.join(prepared.command))


def download_progress(total: int | None):
    """The progress bar of a download (sizes and speed; total None: not known beforehand)."""
    return progress_bar(total, "downloading", in_bytes=True)


def echo_installed(card, local: Zoo) -> None:
    """The line saying a downloaded or imported model is installed."""
    size = sum(f.size for f in card.files)
    echo(f"installed {card.ref} ({len(card.files)} files, {size} bytes, all verified) in "
               f"{local.folder(card.name, card.version)}")


@click.command()
@click.argument("model")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--top-k", type=Integer(min=1), default=5, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of lines")
@click.option("--device", default="cpu", show_default=True, help="cpu, gpu or gpu:N")
@side_effects_option
@outputs_anywhere_option
@click.option("--allow-missing-weights", is_flag=True,
              help="predict even though the weights leave some learnable layers at their initial values")
@zoo_option
@threads_option
@python_layers_option
@user_errors
def predict(model, inputs, top_k, as_json, device, allow_side_effects, outputs_anywhere, allow_missing_weights,
            zoo_dir, allow_python_layers):
    """Classify image files (or .npy arrays) with MODEL, a zoo name[@version] or a model folder."""
    folder = model_folder(model, zoo_dir)
    prepared, adjustments = read_inputs(list(inputs), read_card(folder))
    if adjustments:
        echo(str(adjustments), err=True)
    trust = Trust.shared(python_layers=allow_python_layers, side_effects=allow_side_effects,
                         outputs_anywhere=outputs_anywhere)
    loaded = load(folder, device=device, batch_size=min(len(prepared), 64), trust=trust,
                  allow_missing_weights=allow_missing_weights)
    try:
        results = loaded.classify(prepared, top_k)
    finally:
        loaded.close()
    if as_json:
        click.echo(json.dumps({"model": loaded.card.ref, "results": results}))
        return
    for result in results:
        best = ", ".join(f"{p['name']} {p['probability']:.4f}" for p in result["predictions"])
        echo(f"{result['input']}: {best}")
