"""Dataset conversion and inspection tools (installed as netspec.tools)."""

if not __name__.startswith("netspec."):
    raise ImportError(f"import this package as netspec.tools, not as '{__name__}'")
