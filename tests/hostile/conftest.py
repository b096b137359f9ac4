"""What the hostile tests share: the digits quickstart, ready to train."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile import run

ROOT = Path(__file__).parent.parent.parent


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """The digits quickstart's files and data, snapshotting every 2 iterations and logging every one."""
    folder = tmp_path_factory.mktemp("digits")
    result = run("convert", "digits", folder / "data")
    assert result.returncode == 0, result.stderr
    (folder / "digits_net.yaml").write_text((ROOT / "configs" / "digits" / "digits_net.yaml").read_text())
    solver = (ROOT / "configs" / "digits" / "solver.yaml").read_text()
    (folder / "solver.yaml").write_text(solver.replace("snapshot: 500", "snapshot: 2").replace("display: 50",
                                                                                                 "display: 1"))
    return folder
