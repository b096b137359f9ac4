"""Commands about datasets: convert (digits and the other examples' data, imageset, arrays), compute-mean,
data inspect."""

from __future__ import annotations

import os

import click

from netspec.cli.errors import user_errors
from netspec.cli.options import Integer, Real
from netspec.cli.output import echo
from netspec.cli.progress import progress_bar
from netspec.data.dataset import Dataset, read_manifest
from netspec.data.transform import save_mean
from netspec.interop.caffemodel import read_mean
from netspec.tools.arrays import convert_arrays
from netspec.tools.dataset_info import augmented_grid, describe, sample_grid, train_transform, verify_in_child
from netspec.tools.digit_pairs import convert_digit_pairs
from netspec.tools.digits import convert_digits
from netspec.tools.imageset import ImagesetOptions, convert_imageset, parse_size
from netspec.tools.mean import compute_mean
from netspec.tools.shapes import convert_shapes
from netspec.tools.text import convert_text


@click.group()
def convert():
    """Turn datasets into files the data layers read."""


@convert.command("digits")
@click.argument("out_dir", type=click.Path(file_okay=False))
@user_errors
def convert_digits_command(out_dir):
    """Write scikit-learn's 8x8 digits to OUT_DIR as HDF5 (train.h5/test.h5 and list files)."""
    counts = convert_digits(out_dir)
    click.echo(f"wrote {counts['train']} training and {counts['test']} test digits to {out_dir} "
               f"(train.txt, test.txt list the HDF5 files)")


@convert.command("digit-pairs")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--seed", type=Integer(), default=0, show_default=True, help="seed of the pairs drawn")
@user_errors
def convert_digit_pairs_command(out_dir, seed):
    """Write pairs of the 8x8 digits, same or different (half each), to OUT_DIR as HDF5, for siamese nets."""
    counts = convert_digit_pairs(out_dir, seed=seed)
    click.echo(f"wrote {counts['train']} training and {counts['test']} test pairs to {out_dir} "
               f"(train.txt, test.txt list the HDF5 files)")


@convert.command("shapes")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--size", type=Integer(min=8), default=32, show_default=True, help="image height and width")
@click.option("--seed", type=Integer(), default=0, show_default=True, help="seed of the images drawn")
@user_errors
def convert_shapes_command(out_dir, size, seed):
    """Write generated images of rectangles, discs and triangles with per-pixel labels to OUT_DIR as HDF5."""
    counts = convert_shapes(out_dir, size=size, seed=seed)
    click.echo(f"wrote {counts['train']} training and {counts['test']} test images of shapes to {out_dir} "
               f"(train.txt, test.txt list the HDF5 files)")


@convert.command("text")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--source", type=click.Path(dir_okay=False), default=None,
              help="a UTF-8 text file  [default: Python's help text, which ships with Python]")
@click.option("--length", type=Integer(min=1), default=64, show_default=True, help="characters per window")
@click.option("--test-fraction", type=Real(0, 1, min_open=True, max_open=True), default=0.1, show_default=True,
              help="the share of the text, at its end, kept for testing")
@user_errors
def convert_text_command(out_dir, source, length, test_fraction):
    """Write a text as windows of character ids (data, cont, label) to OUT_DIR as HDF5, and its vocab.json."""
    counts = convert_text(out_dir, source, length, test_fraction)
    click.echo(f"wrote {counts['train']} training and {counts['test']} test windows of {length} characters "
               f"({counts['vocab']} distinct) to {out_dir} (train.txt, test.txt, vocab.json)")


def resize_option(value: str | None) -> tuple[int, int] | None:
    """The ``--resize HxW`` option as ``(H, W)``."""
    try:
        return None if value is None else parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--resize") from None


@convert.command("imageset")
@click.argument("paths", nargs=-1, required=True, metavar="ROOT [LISTFILE] OUT")
@click.option("--backend", type=click.Choice(["lmdb", "hdf5"]), default="lmdb", show_default=True)
@click.option("--resize", metavar="HxW", default=None, help="resize every image to H x W (bilinear)")
@click.option("--keep-aspect", is_flag=True,
              help="with --resize: scale each image as one (its short side to fit) and crop it about its centre, "
                   "instead of squashing it")
@click.option("--gray", is_flag=True, help="one grey channel instead of RGB")
@click.option("--shuffle", is_flag=True, help="write the records in a random order (see --seed)")
@click.option("--seed", type=Integer(), default=0, show_default=True, help="seed of --shuffle and --val-fraction")
@click.option("--encoded", type=click.Choice(["none", "png", "jpg"]), default="none", show_default=True,
              help="store records as raw pixels or as PNG/JPEG files (LMDB only)")
@click.option("--workers", type=Integer(min=1), default=os.cpu_count() or 1, show_default="all cores",
              help="decoding processes")
@click.option("--val-fraction", type=Real(0, 1, max_open=True), default=0.0,
              help="also write a validation set with this fraction of each class: OUT/train and OUT/val")
@click.option("--labels", "labels_file", type=click.Path(dir_okay=False), default=None,
              help="class names, one a line (line k names label k); with class folders it fixes their labels")
@click.option("--strict", is_flag=True, help="stop at the first image that cannot be read instead of skipping it")
@click.option("--overwrite", is_flag=True, help="replace OUT if it exists (once the new dataset is complete)")
@click.option("--allow-mixed-sizes", is_flag=True,
              help="without --resize, keep images of different sizes (LMDB; a net then needs a crop_size)")
@user_errors
def convert_imageset_command(paths, backend, resize, keep_aspect, gray, shuffle, seed, encoded, workers,
                             val_fraction, labels_file, strict, overwrite, allow_mixed_sizes):
    """Convert the images under ROOT into a dataset folder OUT that the Data layer reads.

    With LISTFILE, its lines are Caffe's 'relative/path label'; without it,
    each subfolder of ROOT is a class, labelled in sorted order (written to labels.txt).
    """
    if len(paths) not in (2, 3):
        raise click.UsageError(f"expected ROOT [LISTFILE] OUT, got {len(paths)} path(s)")
    root, list_file, out = (paths[0], None, paths[1]) if len(paths) == 2 else paths
    if keep_aspect and not resize:
        raise click.UsageError("--keep-aspect says how --resize resizes: give --resize HxW too")
    if encoded != "none" and backend == "hdf5":
        raise click.UsageError("--encoded stores image files in LMDB records; HDF5 datasets hold raw pixels")
    options = ImagesetOptions(backend=backend, resize=resize_option(resize), keep_aspect=keep_aspect, gray=gray,
                              shuffle=shuffle, seed=seed,
                              encoding="raw" if encoded == "none" else encoded, workers=workers,
                              val_fraction=val_fraction, strict=strict, overwrite=overwrite,
                              allow_mixed_sizes=allow_mixed_sizes)
    report = convert_imageset(root, out, list_file, labels_file, options,
                              progress_factory=lambda total: progress_bar(total, "converting"))
    for problem in report.skipped:
        echo(f"skipped {problem}", err=True)
    for path, count in report.written.items():
        click.echo(f"wrote {count} records to {path}")
    if report.skipped:
        click.echo(f"skipped {len(report.skipped)} image(s) that could not be read (--strict stops instead)")


@convert.command("caffe-mean")
@click.argument("source", type=click.Path(dir_okay=False))
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="the .npy file to write")
@user_errors
def convert_caffe_mean_command(source, out):
    """Convert a Caffe mean file (.binaryproto) into netspec's: a C x H x W .npy for transform_param.mean_file."""
    mean = read_mean(source)
    save_mean(mean, out)
    click.echo(f"wrote {out}: a {'x'.join(map(str, mean.shape))} mean (C x H x W, in the channel order Caffe "
               "trained with: BGR for its models)")


@convert.command("arrays")
@click.argument("source", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--data-key", default="data", show_default=True, help="the .npz array holding the rows")
@click.option("--label-key", default=None, help="the .npz array or .csv column holding labels [default: label, "
                                                 "when present]")
@click.option("--chunk", type=Integer(min=1), default=4096, show_default=True, help="rows copied at a time")
@click.option("--overwrite", is_flag=True, help="replace OUT if it exists")
@user_errors
def convert_arrays_command(source, out, data_key, label_key, chunk, overwrite):
    """Convert numeric rows (.npz, .npy, or .csv with a header) into the HDF5 file OUT (datasets data, label)."""
    shapes = convert_arrays(source, out, data_key, label_key, chunk, overwrite)
    click.echo(f"wrote {out}: " + ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
               + " (HDF5Data reads it as source)")


@click.command("compute-mean")
@click.argument("dataset", type=click.Path(file_okay=False))
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="the .npy to write (C x H x W)")
@user_errors
def compute_mean_command(dataset, out):
    """Write the per-pixel mean of DATASET's records (for transform_param.mean_file)."""

    count = read_manifest(dataset)["count"]
    with progress_bar(count, "averaging") as advance:
        mean = compute_mean(dataset, advance)
    save_mean(mean, out)
    channels = ", ".join(f"{value:.4g}" for value in mean.mean(axis=(1, 2)))
    click.echo(f"wrote the mean of {count} records to {out} (shape {list(mean.shape)}); per-channel means: "
               f"mean_value: [{channels}]")


@click.group()
def data():
    """Look into datasets."""


@data.command("inspect")
@click.argument("dataset", type=click.Path(file_okay=False))
@click.option("--grid", type=Integer(min=1), default=4, show_default=True, help="samples per side of the grid")
@click.option("-o", "--out", type=click.Path(dir_okay=False), default=None,
              help="draw a grid of samples with their labels into this PNG")
@click.option("--augmented", "net_file", type=click.Path(dir_okay=False), default=None,
              help="with -o: draw each sample as stored and as the TRAIN transform_param of this net makes it")
@click.option("--seed", type=Integer(), default=0, show_default=True, help="the random draws of --augmented")
@click.option("--verify", is_flag=True, help="read and decode every record, and check them against the manifest")
@user_errors
def data_inspect_command(dataset, grid, out, net_file, seed, verify):
    """Show DATASET's record count, shapes, dtype and label histogram; with -o, a grid of samples.

    Opening the dataset checks its files against the manifest without reading the records; --verify reads
    them all.
    """
    if net_file and not out:
        raise click.UsageError("--augmented draws a picture: give it a file with -o")
    params = train_transform(net_file) if net_file else None
    opened = Dataset(dataset)
    try:
        if verify:
            with progress_bar(opened.count, "verifying") as advance:
                verify_in_child(opened, advance)
        for line in describe(opened):
            echo(line)
        if verify:
            click.echo(f"  verified: all {opened.count} records read, decode and match the manifest")
        if params is not None:
            shown = augmented_grid(opened, params, grid, grid, out, seed)
            click.echo(f"wrote {len(shown)} samples, each as stored and in {grid} augmented draws, to {out}")
        elif out:
            shown = sample_grid(opened, grid, out)
            click.echo(f"wrote {len(shown)} samples to {out}")
    finally:
        opened.close()
