"""The dashboard's Starlette app: its routes, and ``serve`` to run it with uvicorn.

Pages: ``/`` (the runs list), ``/run?run=PATH[&with=PATH...]`` (a run, other runs overlaid), ``/new``
(the New run form; posting it starts a training and leads to its run page, or shows why not),
``/datasets`` (the dataset folders; posting its form starts a conversion), ``/dataset?path=PATH``,
``/models`` (the zoo's cards), ``/model?ref=NAME@VERSION`` and ``/publish?run=PATH`` (posting it
publishes the run and leads to the model's page).
API: ``GET /api/runs`` (the list as JSON), ``GET /api/runs/metrics?run=PATH`` (every event and
damaged line, and the position after them), ``GET /api/runs/stream?run=PATH&since=POSITION``
(server-sent events: the lines appended after the position, as they come), ``GET
/api/runs/net.svg?run=PATH``, ``POST /api/runs/snapshot?run=PATH`` and ``/api/runs/stop``,
which send the run's training SIGHUP and SIGINT, as a terminal would; ``GET
/api/datasets/conversions`` (their progress), ``GET /api/datasets/record.png?path=PATH&index=N``, and
``POST /api/models/predict?ref=NAME@VERSION&name=FILE`` (the body: an image file; the answer: its top
classes as JSON).  Every path lies under the launch's secret ``/PREFIX`` (``create_app``'s ``prefix``), and the
pages link to each other relatively.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import signal
import socket

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route

from netspec.dashboard import dataset_pages, model_pages, new_run, pages
from netspec.dashboard.datasets import (
    ConversionRequest,
    Conversions,
    dataset_folders,
    folders_for_datasets,
    histogram,
    record_png,
    samples,
    summary,
    training_sets,
)
from netspec.dashboard.forms import parse_form
from netspec.dashboard.metrics import MetricsCache, Position, current, read_from
from netspec.dashboard.models import Predictors, PublishForm, finetunable, models, publish_run, publishable
from netspec.dashboard.runs import NetDrawings, config_files, per_class, row, snapshots
from netspec.dashboard.security import MAX_UPLOAD, Guard
from netspec.dashboard.workspace import RefusedPathError, Workspace
from netspec.data.dataset import Dataset
from netspec.errors import NetspecError
from netspec.model_zoo.zoo import Zoo, ZooError
from netspec.training import run_folder

POLL_SECONDS = 0.5  # how often a stream looks for new metrics lines
KEEPALIVE_SECONDS = 15.0  # a stream with nothing new sends a comment this often, to find closed connections
CONTENT_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}


def static_files() -> dict[str, str]:
    """The files under /static/: the dashboard's script and style sheet, and plotly.js as plotly ships it."""
    try:
        plotly = importlib.resources.files("plotly") / "package_data" / "plotly.min.js"
    except ModuleNotFoundError:
        raise NetspecError("netspec dashboard needs plotly: python3 -m pip install 'netspec[dashboard]'") from None
    own = importlib.resources.files("netspec.dashboard") / "static"
    files = {"plotly.min.js": str(plotly), "dashboard.js": str(own / "dashboard.js"),
             "dashboard.css": str(own / "dashboard.css")}
    missing = [path for path in files.values() if not os.path.isfile(path)]
    if missing:
        raise NetspecError(f"netspec dashboard: {', '.join(missing)} missing; reinstall netspec[dashboard]")
    return files


def create_app(root: str, token: str, token_required: bool, zoo: str | None = None, prefix: str = "") -> Starlette:
    """The dashboard over the workspace folder ``root`` and the zoo folder ``zoo`` (default: the user's);
    ``token_required`` guards reads too (see security).  Every page lies under ``/PREFIX/`` (``netspec dashboard``
    draws one per launch; empty: the root), and the pages link to each other relatively."""
    workspace, cache, drawings, files = Workspace(root), MetricsCache(), NetDrawings(), static_files()
    local_zoo = Zoo(zoo)
    conversions, predictors = Conversions(workspace), Predictors(local_zoo)

    def run_of(request: Request) -> tuple[str, str]:
        """The ``run`` query parameter and its folder."""
        run = request.query_params.get("run")
        if run is None:
            raise RefusedPathError("name a run: ?run=PATH (relative to the workspace)", 400)
        return run, workspace.run(run)

    def rows() -> list[dict]:
        """The runs list: a row for every run in the workspace."""
        return [row(run, workspace.run(run), cache) for run in workspace.runs()]

    def runs_page(request: Request) -> HTMLResponse:
        return HTMLResponse(pages.runs_page(workspace.root, rows()))

    def runs_list(request: Request) -> JSONResponse:
        return JSONResponse(rows())

    def run_page(request: Request) -> HTMLResponse:
        run, folder = run_of(request)
        overlaid = [other for other in request.query_params.getlist("with") if other != run]
        for other in overlaid:
            workspace.run(other)
        _, damaged, _ = cache.events_json(run_folder.metrics_path(folder))
        others = [other for other in workspace.runs() if other != run]
        return HTMLResponse(pages.run_page(run, row(run, folder, cache), overlaid, others, damaged,
                                           drawings.drawing(folder), config_files(folder), snapshots(folder),
                                           per_class(folder, cache)))

    def metrics(request: Request) -> Response:
        run, folder = run_of(request)
        events, damaged, position = cache.events_json(run_folder.metrics_path(folder))
        body = (f'{{"run":{json.dumps(run)},"events":{events},"damaged":{json.dumps(damaged)},'
                f'"position":"{position.token}"}}')
        return Response(body, media_type="application/json")

    def stream(request: Request) -> StreamingResponse:
        _, folder = run_of(request)
        since = Position.parse(request.headers.get("last-event-id") or request.query_params.get("since", ""))
        return StreamingResponse(tail(run_folder.metrics_path(folder), since), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})

    def net_svg(request: Request) -> Response:
        run, folder = run_of(request)
        drawing = drawings.drawing(folder)
        if drawing.svg is None:
            return PlainTextResponse(drawing.message or f"{run}: no drawing", status_code=404)
        return Response(drawing.svg, media_type="image/svg+xml")

    def new_run_page(form: dict[str, str], message: str = "", status: int = 200) -> HTMLResponse:
        try:
            tunable, zoo_problem = finetunable(models(local_zoo)), ""
        except ZooError as exc:
            tunable, zoo_problem = [], str(exc)
        page = pages.new_run_page(new_run.solver_files(workspace), tunable, training_sets(dataset_folders(workspace)),
                                  form, message, zoo_problem)
        return HTMLResponse(page, status_code=status)

    def new_run_form(request: Request) -> HTMLResponse:
        return new_run_page(dict(request.query_params))

    async def start_run(request: Request) -> Response:
        form = parse_form(await request.body())
        try:
            wanted = new_run.Start.from_form(form)
            run = await anyio.to_thread.run_sync(new_run.start, workspace, wanted, local_zoo)
        except NetspecError as exc:
            return new_run_page(form, str(exc), getattr(exc, "status", 400))
        return RedirectResponse(pages.run_link(run), status_code=303)

    def datasets_page(form: dict[str, str] | None = None, message: str = "", status: int = 200) -> HTMLResponse:
        datasets, sources = folders_for_datasets(workspace)
        rows = [(path, summary(workspace.folder(path))) for path in datasets]
        return HTMLResponse(dataset_pages.datasets_page(rows, sources, conversions.views(),
                                                        form or {}, message), status_code=status)

    def datasets(request: Request) -> HTMLResponse:
        return datasets_page()

    async def convert(request: Request) -> Response:
        form = parse_form(await request.body())
        try:
            await anyio.to_thread.run_sync(conversions.start, ConversionRequest.from_form(form))
        except NetspecError as exc:
            return datasets_page(form, str(exc), getattr(exc, "status", 400))
        return RedirectResponse("datasets#conversions", status_code=303)

    def conversions_list(request: Request) -> JSONResponse:
        return JSONResponse(conversions.views())

    def dataset_of(request: Request) -> tuple[str, Dataset]:
        """The ``path`` query parameter and its dataset, opened (the caller closes it)."""
        path = request.query_params.get("path")
        if path is None:
            raise RefusedPathError("name a dataset folder: ?path=PATH (relative to the workspace)", 400)
        return path, Dataset(workspace.folder(path))

    def dataset_page(request: Request) -> HTMLResponse:
        path, dataset = dataset_of(request)
        try:
            return HTMLResponse(dataset_pages.dataset_page(path, dataset, histogram(dataset), samples(dataset)))
        finally:
            dataset.close()

    def record(request: Request) -> Response:
        _, dataset = dataset_of(request)
        index = request.query_params.get("index", "")
        try:
            if not (index.isascii() and index.isdigit() and len(index) <= 18):  # (int() of 5000 digits fails)
                raise RefusedPathError(f"index: {index!r} is not a record number", 400)
            return Response(record_png(dataset, int(index)), media_type="image/png",
                            headers={"cache-control": "max-age=60"})
        finally:
            dataset.close()

    def models_page(request: Request) -> HTMLResponse:
        return HTMLResponse(model_pages.models_page(local_zoo.root, models(local_zoo)))

    def ref_of(request: Request) -> str:
        """The ``ref`` query parameter: a model of the zoo."""
        ref = request.query_params.get("ref")
        if ref is None:
            raise RefusedPathError("name a model: ?ref=NAME@VERSION", 400)
        return ref

    def model_page(request: Request) -> HTMLResponse:
        return HTMLResponse(model_pages.model_page(local_zoo.root, local_zoo.card(ref_of(request))))

    async def predict(request: Request) -> JSONResponse:
        ref, name = ref_of(request), request.query_params.get("name", "image")
        try:
            answer = await anyio.to_thread.run_sync(predictors.predict, ref, await request.body(), name)
        except NetspecError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse(answer)

    def publish_form(request: Request) -> HTMLResponse:
        run, folder = run_of(request)
        return HTMLResponse(model_pages.publish_page(run, publishable(folder), {}))

    async def publish(request: Request) -> Response:
        run, folder = run_of(request)
        form = parse_form(await request.body())
        try:
            card = await anyio.to_thread.run_sync(publish_run, local_zoo, folder, PublishForm.from_form(form))
        except NetspecError as exc:
            page = model_pages.publish_page(run, publishable(folder), form, str(exc))
            return HTMLResponse(page, status_code=getattr(exc, "status", 400))
        return RedirectResponse(model_pages.model_link(card.ref), status_code=303)

    def static(request: Request) -> FileResponse:
        name = request.path_params["name"]
        if name not in files:
            raise RefusedPathError(f"/static/{name}: no such file", 404)
        return FileResponse(files[name], media_type=CONTENT_TYPES[os.path.splitext(name)[1]],
                            headers={"cache-control": "max-age=3600"})

    def signaller(number: signal.Signals, wanted: str):
        """The endpoint sending a run's training ``number``, which asks it for ``wanted``.

        SIGHUP waits until the training is in its loop: before, it would end the process.
        """

        def send_signal(request: Request) -> PlainTextResponse:
            run, folder = run_of(request)
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

        return send_signal

    routes = [
        Route("/", runs_page),
        Route("/run", run_page),
        Route("/new", new_run_form),
        Route("/new", start_run, methods=["POST"]),
        Route("/api/runs", runs_list),
        Route("/api/runs/metrics", metrics),
        Route("/api/runs/stream", stream),
        Route("/api/runs/net.svg", net_svg),
        Route("/api/runs/snapshot", signaller(signal.SIGHUP, "a snapshot"), methods=["POST"]),
        Route("/api/runs/stop", signaller(signal.SIGINT, "a stop"), methods=["POST"]),
        Route("/datasets", datasets),
        Route("/datasets", convert, methods=["POST"]),
        Route("/dataset", dataset_page),
        Route("/api/datasets/conversions", conversions_list),
        Route("/api/datasets/record.png", record),
        Route("/models", models_page),
        Route("/model", model_page),
        Route("/api/models/predict", predict, methods=["POST"]),
        Route("/publish", publish_form),
        Route("/publish", publish, methods=["POST"]),
        Route("/static/{name:str}", static),
    ]
    base = f"/{prefix}" if prefix else ""
    return Starlette(routes=[Mount(base, routes=routes)] if prefix else routes,
                     exception_handlers={RefusedPathError: refused, NetspecError: cannot_show},
                     middleware=[Middleware(Guard, token=token, token_required=token_required, base=base,
                                            uploads={f"{base}/api/models/predict": MAX_UPLOAD})])


def refused(request: Request, exc: RefusedPathError) -> PlainTextResponse:
    """A path the dashboard will not serve, in one line."""
    return PlainTextResponse(str(exc), status_code=exc.status)


def cannot_show(request: Request, exc: NetspecError) -> HTMLResponse:
    """A page the dashboard cannot show (a damaged dataset, a model not in the zoo): why, in a page."""
    return HTMLResponse(pages.problem_page(str(exc)), status_code=getattr(exc, "status", 400))


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


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (0: any free port), or a NetspecError saying why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        raise NetspecError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def serve(app: Starlette, listening: socket.socket) -> None:
    """Serve ``app`` on the socket until interrupted (Ctrl-C)."""
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)
    uvicorn.Server(config).run(sockets=[listening])
