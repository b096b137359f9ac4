"""The reference nets and solvers that ship with netspec, one folder each (installed as netspec.configs).

``index.yaml`` names each folder with one line saying what it holds; ``netspec configs`` lists them and
``netspec configs copy NAME`` copies one (:mod:`netspec.tools.configs`).  :data:`FOLDER` is where they are,
in a source checkout and in an installed wheel alike.
"""

from pathlib import Path

if not __name__.startswith("netspec."):
    raise ImportError(f"import this package as netspec.configs, not as '{__name__}'")

FOLDER = Path(__file__).resolve().parent
INDEX = FOLDER / "index.yaml"
