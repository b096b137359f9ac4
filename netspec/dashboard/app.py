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
import os
import socket

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    PlainTextResponse,
)
from starlette.routing import Mount, Route

from netspec.dashboard import dataset_pages, model_pages, pages
from netspec.dashboard.security import MAX_UPLOAD, Guard
from netspec.dashboard.state import Dashboard
from netspec.dashboard.workspace import RefusedPathError, Workspace
from netspec.errors import NetspecError
from netspec.model_zoo.zoo import Zoo

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


def static(request: Request) -> FileResponse:
    """``/static/NAME``: the dashboard's script and style sheet, and plotly.js."""
    name = request.path_params["name"]
    files = Dashboard.of(request).static_files
    if name not in files:
        raise RefusedPathError(f"/static/{name}: no such file", 404)
    return FileResponse(files[name], media_type=CONTENT_TYPES[os.path.splitext(name)[1]],
                        headers={"cache-control": "max-age=3600"})


ROUTES = [
    Route("/", pages.show_runs),
    Route("/run", pages.show_run),
    Route("/new", pages.show_new_run),
    Route("/new", pages.start_run, methods=["POST"]),
    Route("/api/runs", pages.list_runs),
    Route("/api/runs/metrics", pages.run_metrics),
    Route("/api/runs/stream", pages.run_stream),
    Route("/api/runs/net.svg", pages.run_net_svg),
    Route("/api/runs/snapshot", pages.snapshot_run, methods=["POST"]),
    Route("/api/runs/stop", pages.stop_run, methods=["POST"]),
    Route("/datasets", dataset_pages.show_datasets),
    Route("/datasets", dataset_pages.start_conversion, methods=["POST"]),
    Route("/dataset", dataset_pages.show_dataset),
    Route("/api/datasets/conversions", dataset_pages.list_conversions),
    Route("/api/datasets/record.png", dataset_pages.record_image),
    Route("/models", model_pages.show_models),
    Route("/model", model_pages.show_model),
    Route("/api/models/predict", model_pages.predict, methods=["POST"]),
    Route("/publish", model_pages.show_publish),
    Route("/publish", model_pages.publish, methods=["POST"]),
    Route("/static/{name:str}", static),
]


def create_app(root: str, token: str, token_required: bool, zoo: str | None = None, prefix: str = "") -> Starlette:
    """The dashboard over the workspace folder ``root`` and the zoo folder ``zoo`` (default: the user's);
    ``token_required`` guards reads too (see security).  Every page lies under ``/PREFIX/`` (``netspec dashboard``
    draws one per launch; empty: the root), and the pages link to each other relatively."""
    dashboard = Dashboard(Workspace(root), Zoo(zoo), static_files())
    base = f"/{prefix}" if prefix else ""
    app = Starlette(routes=[Mount(base, routes=ROUTES)] if prefix else ROUTES,
                    exception_handlers={RefusedPathError: refused, NetspecError: cannot_show},
                    middleware=[Middleware(Guard, token=token, token_required=token_required, base=base,
                                           uploads={f"{base}/api/models/predict": MAX_UPLOAD})])
    app.state.dashboard = dashboard
    return app


def refused(request: Request, exc: RefusedPathError) -> PlainTextResponse:
    """A path the dashboard will not serve, in one line."""
    return PlainTextResponse(str(exc), status_code=exc.status)


def cannot_show(request: Request, exc: NetspecError) -> HTMLResponse:
    """A page the dashboard cannot show (a damaged dataset, a model not in the zoo): why, in a page."""
    return HTMLResponse(pages.problem_page(str(exc)), status_code=getattr(exc, "status", 400))


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
