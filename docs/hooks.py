"""MkDocs hooks: the pages generated from the code while the site builds.

The reference (every layer type, the solvers, the commands, the YAML schema)
comes from :mod:`netspec.inspect.reference`; the architecture page is the
repository's ARCHITECTURE.md; the images the guides show are the
repository's own files, served under ``assets/``.  Each layer type's page is
added to the navigation under its index.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

import netspec.cli
from netspec.engine.registry import layer_types, solver_types
from netspec.inspect import reference

ROOT = Path(__file__).resolve().parent.parent
LAYERS = "reference/layers"
# files of the repository that the guides show, by their path in it
IMAGES = ["configs/augmentation/augmented.png", "configs/cifar10/cifar10_quick_deploy.svg",
          *(f"netspec/dashboard/screenshots/{name}.png"
            for name in ("runs", "run", "new", "datasets", "dataset", "models", "model"))]


def _pages() -> dict[str, str]:
    """Every generated page by its path in the site."""
    types = layer_types()
    pages = {f"{LAYERS}/index.md": reference.layers_index(types),
             "reference/solvers.md": reference.solvers_page(solver_types()),
             "reference/commands.md": reference.commands_page(netspec.cli.main),
             "reference/schema.md": reference.schema_page(),
             "architecture.md": (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")}
    pages.update({f"{LAYERS}/{name}.md": reference.layer_page(cls) for name, cls in types.items()})
    return pages


def on_config(config):
    """List each layer type's page in the navigation, after the index."""
    for section in config.nav:
        if isinstance(section, dict) and "Reference" in section:
            entries = section["Reference"]
            at = entries.index(f"{LAYERS}/index.md")
            entries[at] = {"Layer types": [f"{LAYERS}/index.md", *(f"{LAYERS}/{name}.md" for name in layer_types())]}
    return config


def on_files(files, config):
    """Add the generated pages and the repository's images to the site."""
    for path, content in _pages().items():
        files.append(File.generated(config, path, content=content))
    for image in IMAGES:
        files.append(File.generated(config, f"assets/{image}", abs_src_path=str(ROOT / image)))
    return files
