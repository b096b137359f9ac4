"""Update rules, one module each, and learning-rate policies (installed as netspec.solvers)."""

if not __name__.startswith("netspec."):
    raise ImportError(f"import this package as netspec.solvers, not as '{__name__}'")

from netspec.solvers import adadelta, adagrad, adam, adamw, nesterov, rmsprop, sgd  # noqa: F401 - registers the rules
