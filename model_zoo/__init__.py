"""The model zoo: cards, publish, download, serve (installed as netspec.model_zoo)."""

if not __name__.startswith("netspec."):
    raise ImportError(f"import this package as netspec.model_zoo, not as '{__name__}'")

from netspec.model_zoo.predict import load

__all__ = ["load"]
