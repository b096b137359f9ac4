"""The Datasets pages: the list with the New dataset form and the conversions, and one dataset's page; their HTML
and the handlers that serve them (``/datasets``, ``/dataset``, ``/api/datasets/...``)."""

from __future__ import annotations

import json
import os
import urllib.parse
from html import escape

import anyio
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from netspec.dashboard.datasets import (
    ENCODINGS,
    ConversionRequest,
    folders_for_datasets,
    histogram,
    record_png,
    samples,
    summary,
)
from netspec.dashboard.forms import parse_form
from netspec.dashboard.pages import page, refused_message
from netspec.dashboard.state import Dashboard
from netspec.dashboard.workspace import RefusedPathError
from netspec.data.dataset import BACKENDS, Dataset, shapes_text
from netspec.errors import NetspecError


def dataset_link(path: str) -> str:
    """The address of the dataset folder ``path``'s page."""
    return "dataset?" + urllib.parse.urlencode({"path": path})


def datasets_page(rows: list[tuple[str, dict]], image_folders: list[str], conversions: list[dict],
                  form: dict[str, str], message: str = "") -> str:
    """The dataset folders of the workspace, the form making one from an image folder, and the conversions."""
    lines = []
    for path, row in rows:
        cells = (f'<td colspan="4" class="refused">{escape(row["problem"])}</td>' if "problem" in row else
                 f"<td>{escape(row['backend'])}</td><td>{row['count']}</td><td>{shapes_text(row['shapes'], '×')}</td>"
                 f"<td>{row['classes']}</td>")
        lines.append(f'<tr><td><a href="{escape(dataset_link(path))}">{escape(path)}</a></td>{cells}</tr>')
    table = "\n".join(lines) or '<tr><td colspan="5">no dataset folders in the workspace yet</td></tr>'
    return page("Datasets", f"""<h1>Datasets</h1>
<table id="datasets">
<thead><tr><th>dataset folder</th><th>backend</th><th>records</th><th>record shape</th><th>classes</th></tr></thead>
<tbody>
{table}
</tbody>
</table>
<section id="conversions" data-conversions="{escape(json.dumps(conversions))}">
<h2>Conversions</h2>
<ul id="conversion-list" class="conversions"></ul>
</section>
<section>
<h2>New dataset from an image folder</h2>
{refused_message(message)}
{new_dataset_form(image_folders, form)}
</section>""")


def new_dataset_form(image_folders: list[str], form: dict[str, str]) -> str:
    """The form: ``netspec convert imageset``'s options, its image folders offered from the workspace."""
    def field(name: str, label: str, placeholder: str = "", extra: str = "") -> str:
        return (f'<label>{label} <input name="{name}" value="{escape(form.get(name, ""))}" '
                f'placeholder="{escape(placeholder)}"{extra}></label>\n')

    def box(name: str, label: str) -> str:
        ticked = " checked" if form.get(name) else ""
        return f'<label><input type="checkbox" name="{name}" value="1"{ticked}> {label}</label>\n'

    def select(name: str, label: str, options: tuple[str, ...]) -> str:
        chosen = form.get(name, options[0])
        items = "".join(f'<option{" selected" if option == chosen else ""}>{escape(option)}</option>'
                        for option in options)
        return f'<label>{label} <select name="{name}">{items}</select></label>\n'

    folders = "".join(f'<option value="{escape(folder)}">' for folder in image_folders)
    return f"""<form method="post" action="datasets" class="form">
<p class="where">Each subfolder of the image folder is a class (labelled in sorted order); every image is decoded,
optionally resized, and written to the new dataset folder, as <code>netspec convert imageset</code> does.</p>
{field("source", "image folder", "a folder of the workspace", ' list="image-folders" required')}
<datalist id="image-folders">{folders}</datalist>
{field("out", "dataset folder to make", "e.g. data/flowers", " required")}
{select("backend", "backend", BACKENDS)}{field("resize", "resize to", "HxW, e.g. 32x32 (default: as they are)")}
{box("gray", "one grey channel instead of RGB")}{box("shuffle", "shuffle the records")}
{field("seed", "seed (shuffle, validation split)", "0")}
{field("val_fraction", "validation fraction", "0: no validation set; .2 makes train/ and val/")}
{select("encoding", "records stored as", ENCODINGS)}{box("strict", "stop at the first unreadable image")}
<button type="submit">Convert</button>
</form>"""


def dataset_page(path: str, dataset: Dataset, histogram: list[dict], samples: list[dict]) -> str:
    """One dataset: its manifest, the label histogram and a grid of records."""
    manifest = dataset.manifest
    largest = max((bar["count"] for bar in histogram), default=1)
    bars = "".join(f'<tr><td>{bar["label"]}</td><td>{escape(bar["name"])}</td><td>{bar["count"]}</td>'
                   f'<td class="bar"><span style="width: {100 * bar["count"] / largest:.1f}%"></span></td></tr>'
                   for bar in histogram)
    query = urllib.parse.urlencode({"path": path})
    cells = "".join(f'<figure><img src="api/datasets/record.png?{escape(query)}&amp;index={sample["index"]}" '
                    f'alt="record {sample["index"]}"><figcaption>{escape(sample["name"])}<br><span class="where">'
                    f'#{sample["index"]}</span></figcaption></figure>' for sample in samples)
    return page(path, f"""<h1>{escape(path)}</h1>
<p class="where">{escape(manifest["backend"].upper())} dataset of {dataset.count} records of
{shapes_text(dataset.shapes, "×")} ({escape(manifest["dtype"])}, stored
{escape(manifest["encoding"])})</p>
<section>
<h2>Labels</h2>
<table id="histogram" class="histogram"><thead><tr><th>label</th><th>name</th><th>records</th><th></th></tr></thead>
<tbody>{bars or '<tr><td colspan="4">no labels</td></tr>'}</tbody></table>
</section>
<section>
<h2>Samples</h2>
<div id="samples" class="samples">{cells}</div>
</section>
<section>
<h2>Manifest</h2>
<pre>{escape(json.dumps(manifest, indent=2))}</pre>
</section>""")


def datasets_response(dashboard: Dashboard, form: dict[str, str] | None = None, message: str = "",
                      status: int = 200) -> HTMLResponse:
    """The Datasets page, its form holding ``form``, with ``message`` saying why the last conversion was refused."""
    datasets, sources = folders_for_datasets(dashboard.workspace)
    rows = []
    for path in datasets:
        try:
            folder = dashboard.workspace.folder(path)
        except RefusedPathError:  # (gone since the walk)
            continue
        row = summary(folder)
        if "problem" not in row or os.path.isdir(folder):  # (a manifest unread as the folder moved: gone too)
            rows.append((path, row))
    return HTMLResponse(datasets_page(rows, sources, dashboard.conversions.views(), form or {}, message),
                        status_code=status)


def show_datasets(request: Request) -> HTMLResponse:
    """``/datasets``: the dataset folders, the New dataset form and the conversions."""
    return datasets_response(Dashboard.of(request))


async def start_conversion(request: Request) -> Response:
    """``POST /datasets``: start converting an image folder, or show why not."""
    dashboard = Dashboard.of(request)
    form = parse_form(await request.body())
    try:
        await anyio.to_thread.run_sync(dashboard.conversions.start, ConversionRequest.from_form(form))
    except NetspecError as exc:
        return datasets_response(dashboard, form, str(exc), getattr(exc, "status", 400))
    return RedirectResponse("datasets#conversions", status_code=303)


def list_conversions(request: Request) -> JSONResponse:
    """``/api/datasets/conversions``: the conversions' progress."""
    return JSONResponse(Dashboard.of(request).conversions.views())


def show_dataset(request: Request) -> HTMLResponse:
    """``/dataset?path=PATH``: a dataset's manifest, label histogram and records."""
    path, dataset = Dashboard.of(request).dataset(request)
    try:
        return HTMLResponse(dataset_page(path, dataset, histogram(dataset), samples(dataset)))
    finally:
        dataset.close()


def record_image(request: Request) -> Response:
    """``/api/datasets/record.png?path=PATH&index=N``: one record drawn as a PNG."""
    _, dataset = Dashboard.of(request).dataset(request)
    index = request.query_params.get("index", "")
    try:
        if not (index.isascii() and index.isdigit() and len(index) <= 18):  # (int() of 5000 digits fails)
            raise RefusedPathError(f"index: {index!r} is not a record number", 400)
        return Response(record_png(dataset, int(index)), media_type="image/png",
                        headers={"cache-control": "max-age=60"})
    finally:
        dataset.close()
