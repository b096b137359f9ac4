"""What the dashboard's handlers work on: one app's workspace, zoo, caches and background work.

``create_app`` makes one :class:`Dashboard` and keeps it in the app's state;
each handler (at module level in the page module it serves) finds it with
:meth:`Dashboard.of` and reads the query parameters naming a run or a
dataset through it, so every path a client names is confined to the
workspace.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import Request

from netspec.dashboard.datasets import Conversions
from netspec.dashboard.metrics import MetricsCache
from netspec.dashboard.models import Predictors
from netspec.dashboard.runs import NetDrawings, row
from netspec.dashboard.workspace import RefusedPathError, Workspace
from netspec.data.dataset import Dataset
from netspec.model_zoo.zoo import Zoo


@dataclass
class Dashboard:
    """The workspace and zoo one dashboard serves, with what it caches and runs in the background."""

    workspace: Workspace
    zoo: Zoo
    static_files: dict[str, str]
    cache: MetricsCache = field(default_factory=MetricsCache)
    drawings: NetDrawings = field(default_factory=NetDrawings)
    conversions: Conversions = field(init=False)
    predictors: Predictors = field(init=False)

    def __post_init__(self):
        self.conversions, self.predictors = Conversions(self.workspace), Predictors(self.zoo)

    @staticmethod
    def of(request: Request) -> Dashboard:
        """The dashboard serving ``request``."""
        return request.app.state.dashboard

    def run(self, request: Request) -> tuple[str, str]:
        """The ``run`` query parameter and its folder."""
        run = request.query_params.get("run")
        if run is None:
            raise RefusedPathError("name a run: ?run=PATH (relative to the workspace)", 400)
        return run, self.workspace.run(run)

    def rows(self) -> list[dict]:
        """The runs list: a row for every run in the workspace (one removed or renamed since the walk left out)."""
        rows = []
        for run in self.workspace.runs():
            try:
                folder = self.workspace.run(run)
            except (RefusedPathError, OSError):  # (gone since the walk)
                continue
            rows.append(row(run, folder, self.cache))
        return rows

    def dataset(self, request: Request) -> tuple[str, Dataset]:
        """The ``path`` query parameter and its dataset, opened (the caller closes it)."""
        path = request.query_params.get("path")
        if path is None:
            raise RefusedPathError("name a dataset folder: ?path=PATH (relative to the workspace)", 400)
        return path, Dataset(self.workspace.folder(path))
