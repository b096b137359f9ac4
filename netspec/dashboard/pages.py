"""The dashboard's layout, and its runs and New run pages: their HTML and the handlers that serve them.

The HTML is written as Python string templates; every value from a file or a
client is escaped.  The handlers answer ``/`` (the runs), ``/run``, ``/new``
and the runs' API (``/api/runs...``: the list, a run's metrics and their
stream of server-sent events, its net drawn, snapshot and stop).
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.parse
from html import escape

import anyio
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)

from netspec.dashboard import new_run, runs
from netspec.dashboard.datasets import dataset_folders, training_sets
from netspec.dashboard.forms import parse_form
from netspec.dashboard.metrics import Position, current, read_from
from netspec.dashboard.models import finetunable, models
from netspec.dashboard.runs import PerClass
from netspec.dashboard.state import Dashboard
from netspec.errors import NetspecError
from netspec.model_zoo.zoo import ZooError
from netspec.training import run_folder
from netspec.training.run_folder import EVENT_KEYS

POLL_SECONDS = 0.5  # how often a stream looks for new metrics lines
KEEPALIVE_SECONDS = 15.0  # a stream with nothing new sends a comment this often, to find closed connections

LOWEST_SHARE = 5  # a per-class table marks the lowest fifth of its classes' accuracies (at least one class)


def page(title: str, body: str) -> str:
    """A whole page: the header, ``body``, the dashboard's style sheet and scripts (plotly.js, then its own)."""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} · netspec dashboard</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="static/dashboard.css">
<script src="static/plotly.min.js" defer></script>
<script src="static/dashboard.js" defer></script>
</head>
<body>
<header><a href="./">netspec dashboard</a> <nav><a href="./">Runs</a> <a href="new">New run</a>
<a href="datasets">Datasets</a> <a href="models">Models</a></nav></header>
<main>
{body}
</main>
</body>
</html>
"""


def value(number) -> str:
    """A metric for a table cell: four significant digits, a dash when missing."""
    if number is None:
        return "–"
    return str(number) if isinstance(number, int) else f"{number:.4g}"


def run_link(run: str) -> str:
    """The address of run ``run``'s page."""
    return "run?" + urllib.parse.urlencode({"run": run})


def publish_link(run: str) -> str:
    """The address of the form publishing run ``run`` to the zoo."""
    return "publish?" + urllib.parse.urlencode({"run": run})


def state_badge(state: str, message: str) -> str:
    """A run's state as a coloured label, its message as the tooltip."""
    return f'<span class="state state-{escape(state)}" title="{escape(message)}">{escape(state)}</span>'


def runs_page(workspace: str, rows: list[dict]) -> str:
    """The runs list: one row per run folder with its state, last iteration, loss and test values."""
    lines = []
    for row in rows:
        tests = "<br>".join(f"{escape(t['output'])}: {value(t['last'])} "
                            f"<span class=\"best\">(best {value(t['best'])} at {value(t['best_iter'])})</span>"
                            for t in row["tests"]) or "–"
        lines.append(f"<tr><td><a href=\"{escape(run_link(row['run']))}\">{escape(row['run'])}</a></td>"
                     f"<td>{state_badge(row['state'], row['message'])}</td><td>{value(row['iter'])}</td>"
                     f"<td>{value(row['loss'])}</td><td>{value(row['lr'])}</td><td>{tests}</td>"
                     f"<td>{row['snapshots']}</td></tr>")
    table = "\n".join(lines) or '<tr><td colspan="7">no run folders under the workspace yet</td></tr>'
    return page("Runs", f"""<h1>Runs</h1>
<p class="where">in {escape(workspace)}</p>
<table id="runs" class="runs">
<thead><tr><th>run</th><th>state</th><th>iteration</th><th>train loss</th><th>lr</th>
<th>test: last (best)</th><th>snapshots</th></tr></thead>
<tbody>
{table}
</tbody>
</table>""")


def run_page(run: str, row: dict, overlaid: list[str], others: list[str], damaged: list[dict],
             drawing, configs: list[tuple[str, str]], snapshots: list[dict], per_class: list[PerClass]) -> str:
    """One run: state and actions, live curves (with ``overlaid`` runs), its latest per-class accuracies, the net,
    config files, snapshots."""
    running = row["state"] == "running"
    actions = "".join(f'<button data-action="{action}" data-run="{escape(run)}"{"" if running else " disabled"}>'
                      f"{label}</button>" for action, label in (("snapshot", "Snapshot now"), ("stop", "Stop")))
    actions += f'<a id="publish" href="{escape(publish_link(run))}">Publish to the zoo</a>'
    boxes = "\n".join(f'<label><input type="checkbox" class="overlay" value="{escape(other)}"'
                      f'{" checked" if other in overlaid else ""}> {escape(other)}</label>' for other in others)
    shown = json.dumps([run, *overlaid])
    return page(run, f"""<h1>{escape(run)} <span id="run-state">{state_badge(row['state'], row['message'])}</span></h1>
<p id="run-message" class="message">{escape(row['message'])}</p>
<p class="actions">{actions} <span id="action-result" role="status"></span></p>
<section>
<h2>Curves</h2>
<ul id="damaged" class="damaged">{damaged_items(run, damaged)}</ul>
<div id="charts" data-runs="{escape(shown)}" data-event-keys="{escape(json.dumps(sorted(EVENT_KEYS)))}">
{charts()}
</div>
<details{" open" if overlaid else ""}><summary>Overlay other runs</summary>
<div class="overlays">{boxes or "no other runs"}</div>
</details>
</section>
{per_class_section(per_class, "over its latest test pass; change: since the pass before")}
<section>
<h2>Net</h2>
{net_section(run, drawing)}
</section>
<section>
<h2>Config</h2>
{"".join(f"<h3>{escape(name)}</h3><pre>{escape(text)}</pre>" for name, text in configs) or "<p>no config/ copies</p>"}
</section>
<section id="snapshots">
<h2>Snapshots</h2>
{snapshots_table(snapshots)}
</section>""")


def charts() -> str:
    """The run page's charts, which dashboard.js draws: train loss, test losses, test accuracies (and other
    outputs in [0, 1]), other test outputs (shown once there are some), learning rate; the loss charts with a
    log scale switch."""
    boxes = []
    for chart, log, optional in (("chart-loss", True, False), ("chart-test", True, False),
                                 ("chart-accuracy", False, False), ("chart-other", False, True),
                                 ("chart-lr", False, False)):
        switch = (f'<label class="scale"><input type="checkbox" class="log-scale" data-chart="{chart}"> log scale'
                  "</label>" if log else "")
        boxes.append(f'<div class="chart-box"{" data-optional hidden" if optional else ""}>{switch}'
                     f'<div id="{chart}" class="chart"></div></div>')
    return "\n".join(boxes)


def per_class_section(tables: list[PerClass], note: str) -> str:
    """The Per class section: ``tables``, under a line saying what they hold, ``note`` ending it; an empty hidden
    section when there are none (a run page fills it in when its next test pass has figures)."""
    if not tables:
        return '<section id="per-class" hidden></section>'
    return ('<section id="per-class">\n<h2>Per class</h2>\n<p class="where">Each class\'s accuracy (its hits over '
            f"its records; – where the pass held none of it) {escape(note)}; the lowest marked.</p>\n"
            + "\n".join(map(per_class_table, tables)) + "\n</section>")


def per_class_table(table: PerClass) -> str:
    """``table`` as HTML: class name, label, accuracy (and change), the lowest accuracies' rows marked."""
    figures, previous = table.figures, table.previous
    names = table.names if len(table.names) == len(figures) else [str(label) for label in range(len(figures))]
    marked = lowest(figures)
    rows = []
    for label, (name, figure) in enumerate(zip(names, figures)):
        cells = f"<td>{escape(name)}</td><td>{label}</td><td>{value(figure)}</td>"
        if previous is not None:
            before = previous[label] if label < len(previous) else None
            cells += f"<td>{change(figure, before)}</td>"
        rows.append(f'<tr class="lowest">{cells}</tr>' if label in marked else f"<tr>{cells}</tr>")
    head = "<th>class</th><th>label</th><th>accuracy</th>" + ("<th>change</th>" if previous is not None else "")
    return (f'<table class="per-class"><caption>{escape(table.caption)}</caption><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


def change(figure: float | None, before: float | None) -> str:
    """How far ``figure`` moved from ``before``, signed (four significant digits); a dash when either is missing."""
    return "–" if figure is None or before is None else f"{figure - before:+.4g}"


def lowest(figures: list[float | None]) -> set[int]:
    """The classes whose accuracy is among the lowest LOWEST_SHARE-th of the known ones (at least one class; ties
    with the last of them too); none when every known accuracy is the same."""
    known = sorted(figure for figure in figures if figure is not None)
    if not known or known[0] == known[-1]:
        return set()
    bar = known[max(len(known) // LOWEST_SHARE, 1) - 1]
    return {label for label, figure in enumerate(figures) if figure is not None and figure <= bar}


def damaged_items(run: str, damaged: list[dict]) -> str:
    """List items naming each damaged metrics.jsonl line (skipped in the curves)."""
    return "".join(f'<li data-run="{escape(run)}">{escape(run)}: metrics.jsonl line {line["line"]} skipped: '
                   f"{escape(line['reason'])}</li>" for line in damaged)


def net_section(run: str, drawing) -> str:
    """The train net as the SVG image, or its DOT text with why it is not drawn."""
    if drawing.svg is not None:
        source = "api/runs/net.svg?" + urllib.parse.urlencode({"run": run})
        return f'<img class="net" src="{escape(source)}" alt="the train net of {escape(run)}">'
    message = f'<p class="message">{escape(drawing.message or "")}</p>'
    return message + (f"<pre>{escape(drawing.dot)}</pre>" if drawing.dot else "")


def snapshots_table(snapshots: list[dict]) -> str:
    """The snapshot files with their sizes and times."""
    if not snapshots:
        return "<p>no snapshots yet</p>"
    rows = "".join(f"<tr><td>{escape(s['name'])}</td><td>{s['size'] / 2 ** 20:.2f} MB</td>"
                   f"<td>{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(s['modified']))}</td></tr>"
                   for s in snapshots)
    return f"<table><thead><tr><th>file</th><th>size</th><th>written</th></tr></thead><tbody>{rows}</tbody></table>"


def problem_page(message: str) -> str:
    """A page saying why what was asked cannot be shown."""
    return page("Cannot show this", f"<h1>Cannot show this</h1>\n{refused_message(message)}")


def refused_message(message: str) -> str:
    """Why the form's last submission was refused, shown above the form (nothing when it was not)."""
    return f'<pre id="refused" class="refused" role="alert">{escape(message)}</pre>' if message else ""


def new_run_page(solvers: list[str], models: list[str], datasets: list[str], form: dict[str, str],
                 message: str = "", zoo_problem: str = "") -> str:
    """The New run form: a solver file of the workspace, or a zoo model of ``models`` to fine-tune on one of
    ``datasets``, optional overrides and run folder; ``message`` says why the last start was refused, ``form``
    holds what was asked then, and ``zoo_problem`` why the zoo's models cannot be listed."""
    def select(name: str, choices: list[str], empty: str) -> str:
        chosen = form.get(name, "")
        return f'<select name="{name}"><option value="">{empty}</option>' + "".join(
            f'<option{" selected" if item == chosen else ""}>{escape(item)}</option>' for item in choices) + \
            "</select>"

    devices = "".join(f'<option value="{device}"{" selected" if form.get("device", "") == device else ""}>'
                      f"{label}</option>" for device, label in (("", "as the file says"), ("cpu", "cpu"),
                                                                 ("gpu", "gpu")))
    fields = "".join(f'<label>{label} <input name="{name}" value="{escape(form.get(name, ""))}" '
                     f'placeholder="{placeholder}"></label>\n'
                     for name, label, placeholder in (
                         ("base_lr", "base_lr", "as the file says"), ("max_iter", "max_iter", "as the file says"),
                         ("batch_size", "batch size (train data)", "as the file says"),
                         ("out", "run folder", "snapshot_prefix's folder (needed to fine-tune)")))
    chooser = (f"<label>solver file {select('solver', solvers, 'choose one')}</label>" if solvers
               else "<p>no solver files in the workspace (YAML files named *solver*.yaml, or with a net: or "
                    "train_net: key)</p>")
    tuner = (f"<label>model {select('model', models, 'none: train the solver file')}</label>\n"
             f"<label>dataset {select('dataset', datasets, 'choose one')}</label>" if models
             else f'<p class="refused">{escape(zoo_problem)}</p>' if zoo_problem
             else "<p>no model in the zoo carries its training configs (publish a finished run first)</p>")
    return page("New run", f"""<h1>New run</h1>
{refused_message(message)}
<form method="post" action="new" class="form">
<fieldset><legend>Train a solver file</legend>
{chooser}
</fieldset>
<fieldset><legend>or fine-tune a zoo model on a dataset</legend>
{tuner}
</fieldset>
{fields}<label>device <select name="device">{devices}</select></label>
<button type="submit"{"" if solvers or models else " disabled"}>Start</button>
</form>
<p class="where">Start runs <code>netspec train</code> on the solver file, as a terminal would; nets with Python
layers are started in a terminal only.  Fine-tuning writes the model's train net and solver, pointed at the
dataset (and its classifier re-made when the dataset has another number of classes), into the run folder's
<code>finetune/</code>, as <code>netspec zoo finetune</code> does, then trains starting with its weights.</p>""")


def show_runs(request: Request) -> HTMLResponse:
    """``/``: the runs list."""
    dashboard = Dashboard.of(request)
    return HTMLResponse(runs_page(dashboard.workspace.root, dashboard.rows()))


def list_runs(request: Request) -> JSONResponse:
    """``/api/runs``: the runs list as JSON."""
    return JSONResponse(Dashboard.of(request).rows())


def show_run(request: Request) -> HTMLResponse:
    """``/run?run=PATH[&with=PATH...]``: a run, other runs overlaid."""
    dashboard = Dashboard.of(request)
    run, folder = dashboard.run(request)
    overlaid = [other for other in request.query_params.getlist("with") if other != run]
    for other in overlaid:
        dashboard.workspace.run(other)
    _, damaged, _ = dashboard.cache.events_json(run_folder.metrics_path(folder))
    others = [other for other in dashboard.workspace.runs() if other != run]
    return HTMLResponse(run_page(run, runs.row(run, folder, dashboard.cache), overlaid, others, damaged,
                                 dashboard.drawings.drawing(folder), runs.config_files(folder),
                                 runs.snapshots(folder), runs.per_class(folder, dashboard.cache)))


def run_metrics(request: Request) -> Response:
    """``/api/runs/metrics?run=PATH``: every event and damaged line, and the position after them."""
    dashboard = Dashboard.of(request)
    run, folder = dashboard.run(request)
    events, damaged, position = dashboard.cache.events_json(run_folder.metrics_path(folder))
    body = (f'{{"run":{json.dumps(run)},"events":{events},"damaged":{json.dumps(damaged)},'
            f'"position":"{position.token}"}}')
    return Response(body, media_type="application/json")


def run_stream(request: Request) -> StreamingResponse:
    """``/api/runs/stream?run=PATH&since=POSITION``: the metrics lines appended after the position, as they come."""
    _, folder = Dashboard.of(request).run(request)
    since = Position.parse(request.headers.get("last-event-id") or request.query_params.get("since", ""))
    return StreamingResponse(tail(run_folder.metrics_path(folder), since), media_type="text/event-stream",
                             headers={"cache-control": "no-cache"})


async def tail(path: str, position: Position):
    """Server-sent events of the metrics lines appended after ``position``, as they are written.

    Each message is ``event: metrics`` with ``{"events": [...], "damaged": [...]}`` and the new
    position as its id (a reconnecting browser sends it back); ``event: reset`` when the file was
    replaced or shrank (a resumed run rewrote it): the page then reads it again from the start.
    """
    quiet = 0.0
    while True:
        fresh = await anyio.to_thread.run_sync(current, path, position)
        if fresh is None and (position.offset or os.path.exists(path)):
            yield "event: reset\ndata: {}\n\n"
            return
        if fresh is not None:
            chunk = await anyio.to_thread.run_sync(read_from, path, fresh)
            position = chunk.position
            if chunk.events or chunk.damaged:
                data = json.dumps({"events": chunk.events, "damaged": chunk.damaged}, separators=(",", ":"))
                yield f"id: {position.token}\nevent: metrics\ndata: {data}\n\n"
                quiet = 0.0
        if quiet >= KEEPALIVE_SECONDS:
            yield ": keep-alive\n\n"
            quiet = 0.0
        await anyio.sleep(POLL_SECONDS)
        quiet += POLL_SECONDS


def run_net_svg(request: Request) -> Response:
    """``/api/runs/net.svg?run=PATH``: the run's train net drawn."""
    dashboard = Dashboard.of(request)
    run, folder = dashboard.run(request)
    drawing = dashboard.drawings.drawing(folder)
    if drawing.svg is None:
        return PlainTextResponse(drawing.message or f"{run}: no drawing", status_code=404)
    return Response(drawing.svg, media_type="image/svg+xml")


def snapshot_run(request: Request) -> PlainTextResponse:
    """``POST /api/runs/snapshot?run=PATH``: SIGHUP to the run's training, as a terminal would send."""
    return signal_run(request, signal.SIGHUP, "a snapshot")


def stop_run(request: Request) -> PlainTextResponse:
    """``POST /api/runs/stop?run=PATH``: SIGINT to the run's training, as Ctrl-C would send."""
    return signal_run(request, signal.SIGINT, "a stop")


def signal_run(request: Request, number: signal.Signals, wanted: str) -> PlainTextResponse:
    """Send the training of the request's run ``number``, which asks it for ``wanted``.

    SIGHUP waits until the training is in its loop: before, it would end the process.
    """
    run, folder = Dashboard.of(request).run(request)
    pid = run_folder.lock_holder(folder)
    if pid is None:
        return PlainTextResponse(f"{run} is not running", status_code=409)
    if number == signal.SIGHUP and not run_folder.loop_started(folder):
        return PlainTextResponse(f"{run} has not started training yet: ask again in a moment", status_code=409)
    if not run_folder.is_training(pid):
        return PlainTextResponse(f"{run}: its lock is held by pid {pid}, which is no netspec training: "
                                 "nothing sent", status_code=409)
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        return PlainTextResponse(f"{run} is not running", status_code=409)
    except PermissionError:
        return PlainTextResponse(f"{run}: its training (pid {pid}) belongs to another user", status_code=403)
    return PlainTextResponse(f"asked {run} (pid {pid}) for {wanted} ({number.name})")


def new_run_response(dashboard: Dashboard, form: dict[str, str], message: str = "",
                     status: int = 200) -> HTMLResponse:
    """The New run page holding ``form``, with ``message`` saying why the last start was refused."""
    try:
        tunable, zoo_problem = finetunable(models(dashboard.zoo)), ""
    except ZooError as exc:
        tunable, zoo_problem = [], str(exc)
    workspace = dashboard.workspace
    page = new_run_page(new_run.solver_files(workspace), tunable, training_sets(dataset_folders(workspace)),
                        form, message, zoo_problem)
    return HTMLResponse(page, status_code=status)


def show_new_run(request: Request) -> HTMLResponse:
    """``/new``: the New run form (its fields filled from the query)."""
    return new_run_response(Dashboard.of(request), dict(request.query_params))


async def start_run(request: Request) -> Response:
    """``POST /new``: start a training and lead to its run page, or show why not."""
    dashboard = Dashboard.of(request)
    form = parse_form(await request.body())
    try:
        wanted = new_run.Start.from_form(form)
        run = await anyio.to_thread.run_sync(new_run.start, dashboard.workspace, wanted, dashboard.zoo)
    except NetspecError as exc:
        return new_run_response(dashboard, form, str(exc), getattr(exc, "status", 400))
    return RedirectResponse(run_link(run), status_code=303)
