"""Reading solver files: Caffe's SolverParameter names, validated like net files (every error at once).

A solver file names its nets as paths (relative to the solver file) or writes
them inline; either way they are read and validated here, so one run of
:func:`parse_solver` reports every mistake in the solver and in its nets.
Which update rules exist is passed in by the caller, so this module knows
nothing of solvers' code.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Literal

from netspec.errors import ConfigError, Problem, did_you_mean, shown
from netspec.spec.net_spec import NetConfig, NetState, config_hash, read_net
from netspec.spec.schema import Context, FilePath, doc, read_block, required
from netspec.spec.yaml_lines import YamlList, YamlMap, load_yaml, read_source

# The learning-rate policies and their formulas (netspec.solvers.lr_policies computes them).
LR_FORMULAS = {
    "fixed": "base_lr",
    "step": "base_lr * gamma ^ floor(iter / stepsize)",
    "exp": "base_lr * gamma ^ iter",
    "inv": "base_lr * (1 + gamma * iter) ^ (-power)",
    "multistep": "base_lr * gamma ^ (number of stepvalue entries <= iter)",
    "poly": "base_lr * (1 - iter / max_iter) ^ power",
    "sigmoid": "base_lr / (1 + exp(-gamma * (iter - stepsize)))",
    "cosine": "min_lr + (base_lr - min_lr) * (1 + cos(pi * iter / max_iter)) / 2",
}
LR_POLICIES = tuple(LR_FORMULAS)
WARMUP_FORMULA = ("with warmup_iter W > 0, for iter < W: "
                  "warmup_start_lr + (lr_policy(W) - warmup_start_lr) * iter / W")
TEST_EPOCH = "epoch"  # a test_iter value: one pass over the test data, every record once
EPOCH_KEYS = {"max_epoch": "max_iter", "test_interval_epochs": "test_interval", "snapshot_epochs": "snapshot"}
NET_KEYS = {
    "net": "the net to train and test (its TRAIN and TEST phases): a path relative to this file, or a net inline",
    "train_net": "the net to train, when the test nets are other files (a path or a net inline)",
    "test_net": "with train_net: the test nets, one per test_iter value (paths or nets inline)",
}


@dataclass
class WatchedOutput:
    """A scalar output of a test net followed across test passes (``snapshot_best``)."""

    output: str = required(doc="name of a scalar output of the test net (e.g. accuracy, loss)")
    mode: Literal["max", "min"] = required(doc="max: larger is better; min: smaller is better")
    test_net: int = doc(0, "which test net's results to follow")


@dataclass
class EarlyStop(WatchedOutput):
    """Stop training when a test output has stopped improving (``early_stop``)."""

    patience: int = required(doc="test passes without improvement before stopping (>= 1)")
    min_delta: float = doc(0.0, "smallest change that counts as an improvement")


@dataclass
class SolverParams:
    """The hyper-parameters of a solver file (Caffe's SolverParameter; the nets are read separately)."""

    base_lr: float = required(doc="starting learning rate (> 0)")
    max_iter: int | None = doc(None, "iterations to train (> 0); or give max_epoch")
    max_epoch: float | None = doc(None, "passes over the train data to train (needs a data layer that knows its size)")
    lr_policy: Literal[LR_POLICIES] = doc("fixed", "how the rate changes: " + ", ".join(LR_POLICIES))
    gamma: float | None = doc(None, "factor of the step, exp, inv, multistep and sigmoid policies")
    power: float | None = doc(None, "exponent of the inv and poly policies")
    stepsize: int | None = doc(None, "iterations per step (step) or the midpoint (sigmoid)")
    stepvalue: list[int] = doc([], "iterations at which multistep multiplies the rate by gamma")
    min_lr: float = doc(0.0, "the cosine policy's rate at max_iter")
    warmup_iter: int = doc(0, "iterations of linear warm-up before the policy takes over (0: none)")
    warmup_start_lr: float = doc(0.0, "the rate at iteration 0 when warming up")
    momentum: float = doc(0.0, "momentum of the update history (AdaDelta: its decay; Adam: beta1)")
    momentum2: float = doc(0.999, "Adam's second-moment decay (beta2)")
    rms_decay: float = doc(0.99, "RMSProp's decay of the mean square")
    delta: float = doc(1e-8, "AdaGrad/RMSProp/AdaDelta/Adam's small constant against division by zero")
    weight_decay: float = doc(0.0, "regularisation strength (times each blob's decay_mult)")
    regularization_type: Literal["L2", "L1"] = doc("L2", "L2: decay * w; L1: decay * sign(w)")
    clip_gradients: float = doc(-1.0, "scale gradients down to this global L2 norm (negative: off)")
    iter_size: int = doc(1, "batches whose gradients are accumulated per update")
    type: str = doc("SGD", "update rule (netspec solvers lists them)")
    test_iter: list[int | Literal["epoch"]] = doc(
        [], "batches per test pass, one value per test net; epoch (the default where a net is tested): one pass "
            "over the test data, every record once")
    test_interval: int = doc(0, "test every this many iterations (0: never)")
    test_interval_epochs: float | None = doc(None, "test every this many epochs (instead of test_interval)")
    test_initialization: bool = doc(True, "also test before the first iteration")
    display: int = doc(0, "log every this many iterations (0: never)")
    average_loss: int = doc(1, "iterations over which the logged loss is averaged")
    tensorboard: bool = doc(False, "also write the logged values as TensorBoard event files into the run folder's "
                                   "tensorboard/ (needs the tensorboard extra; --tensorboard does the same)")
    snapshot: int = doc(0, "write weights and solver state every this many iterations (0: only at the end)")
    snapshot_epochs: float | None = doc(None, "snapshot every this many epochs (instead of snapshot)")
    keep_last: int | None = doc(None, "keep only the newest K periodic snapshots (never the best, never the last)")
    snapshot_best: WatchedOutput | None = doc(None, "keep <prefix>_best.weights.h5 for the best test value of an "
                                                    "output: {output, mode: max|min}")
    early_stop: EarlyStop | None = doc(None, "stop when a test output stops improving: "
                                             "{output, mode, patience, min_delta}")
    snapshot_prefix: FilePath | None = doc(None, "path prefix of snapshot files (default: the solver file's "
                                                 "path without its extension)")
    snapshot_after_train: bool = doc(True, "write a snapshot when training ends")
    random_seed: int = doc(-1, "seed of fillers, data order and dropout (negative: a random seed)")
    solver_mode: Literal["CPU", "GPU"] = doc("CPU", "device kind (overridden by --device)")
    device_id: int = doc(0, "GPU number with solver_mode GPU")
    deterministic: bool = doc(False, "on a GPU, only the cuDNN engines that compute the same bits every time, so "
                                     "that a run and its resumptions repeat exactly (some convolutions run slower)")
    precision: Literal["fp32", "tf32", "bf16-mixed", "fp16-mixed"] = doc(
        "fp32", "on a GPU, fp32: float32 products and convolutions computed in float32; tf32: those made through "
                "cuBLAS and cuDNN on TF32 tensor cores (inputs rounded to 10 bits of significand, sums in float32); "
                "bf16-mixed: those take their operands (and a bias cuDNN adds) rounded to bfloat16 (7 bits) and sum "
                "in float32, cuBLAS writing float32 and cuDNN bfloat16, widened, as PyTorch's autocast; the weights, "
                "their gradients' sums, the other layers and the solver's state stay float32; fp16-mixed: the same "
                "with float16 (10 bits, up to 65,504), the loss scaled so that the gradients fit it")
    cuda_graph: bool = doc(False, "on a GPU, capture one training iteration as a CUDA graph once warm and launch it "
                                  "for the others (--cuda-graph does the same); a net or setting that cannot be "
                                  "captured trains without, saying why")
    train_state: NetState | None = doc(None, "stages and level of the train net (its phase is always TRAIN)")
    test_state: list[NetState] = doc([], "stages and level of each test net")


@dataclass
class SolverSpec:
    """A whole solver file, validated: hyper-parameters, the train net and the test nets."""

    params: SolverParams
    train_net: NetConfig
    test_nets: list[NetConfig]
    file: str | None
    text: str
    config_hash: str
    net_texts: dict[str, str] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)

    @property
    def train_net_text(self) -> str:
        """The train net file's text as read ('' when the net is written inline in the solver file)."""
        return self.net_texts.get(self.train_net.file, "")

    @property
    def snapshot_prefix(self) -> str:
        """Where snapshots go: ``snapshot_prefix``, else beside the solver file, else ./<net name>."""
        if self.params.snapshot_prefix:
            return self.params.snapshot_prefix
        if self.file:
            return os.path.splitext(os.path.abspath(self.file))[0]
        return os.path.abspath(self.train_net.name or "netspec")

    def problem(self, message: str, key: str | None = None) -> Problem:
        """A Problem located at ``key`` of the solver file."""
        return Problem(message, file=self.file or "<string>", line=self.lines.get(key, 1), key=key)

    @property
    def epoch_keys(self) -> list[str]:
        """The ``*_epoch(s)`` keys the file sets."""
        return [key for key in EPOCH_KEYS if getattr(self.params, key) is not None]

    def in_iterations(self, iterations_per_epoch: float | None, size_unknown: str) -> SolverParams:
        """The parameters with epoch counts turned into iterations (:func:`with_epochs_resolved`).

        ``iterations_per_epoch`` is None when the train data cannot tell its
        size; a file counting epochs is then refused, with ``size_unknown`` saying why.
        """
        used = self.epoch_keys
        if not used:
            return self.params
        if iterations_per_epoch is None:
            raise ConfigError([self.problem(
                f"counts epochs, but the train net cannot tell how many records an epoch has: {size_unknown}; give "
                "iteration counts instead, or read the data with HDF5Data", key) for key in used])
        resolved = with_epochs_resolved(self.params, iterations_per_epoch)
        if resolved.warmup_iter >= resolved.max_iter:
            raise ConfigError(self.problem(f"must be less than max_iter ({resolved.max_iter} from max_epoch), "
                                           f"got {self.params.warmup_iter}", "warmup_iter"))
        return resolved


def _read_net_value(value, ctx: Context, key: str, line: int, layer_schemas,
                    net_texts: dict[str, str]) -> NetConfig | None:
    """A net given as a path (relative to the solver file; its text kept in ``net_texts``) or written inline."""
    if isinstance(value, str):
        path = os.path.normpath(os.path.join(ctx.base_dir, os.path.expanduser(value)))
        if not os.path.isfile(path):
            ctx.add(f"net file '{path}' does not exist", line, key)
            return None
        text, filename = read_source(path)
        net_texts[path] = text
        net_ctx = Context(filename, os.path.dirname(path))
        spec = read_net(load_yaml(text, filename), net_ctx, layer_schemas, 1)
        ctx.problems.extend(net_ctx.problems)
        return spec
    if isinstance(value, YamlMap):
        return read_net(value, ctx, layer_schemas, line)
    ctx.add(f"expected a net file path or an inline net (a mapping), got {type(value).__name__} {shown(value)}",
            line, key)
    return None


MAX_COUNT = 2 ** 31 - 1  # the largest iteration count or interval: Caffe's int32
COUNTS = ("max_iter", "stepsize", "stepvalue", "warmup_iter", "iter_size", "test_iter", "test_interval", "display",
          "average_loss", "snapshot", "keep_last")


def _check_values(p: SolverParams, ctx: Context, tree: YamlMap, solver_types) -> None:
    """Range and consistency checks that a type annotation cannot express."""
    def bad(key: str, message: str) -> None:
        ctx.add(message, tree.line_of(key), key)

    if p.base_lr is not None and not (p.base_lr > 0 and math.isfinite(p.base_lr)):
        bad("base_lr", f"must be a positive number, got {p.base_lr}")
    if (p.max_iter is None) == (p.max_epoch is None):
        bad("max_epoch" if "max_epoch" in tree else "max_iter",
            "give the length of training as max_iter or max_epoch" + (", not both" if p.max_iter is not None else ""))
    if p.max_iter is not None and p.max_iter <= 0:
        bad("max_iter", f"must be a positive integer, got {p.max_iter}")
    for key, iterations_key in EPOCH_KEYS.items():
        value = getattr(p, key)
        if value is not None and not (value > 0 and math.isfinite(value)):
            bad(key, f"must be a positive number, got {value}")
        if value is not None and key != "max_epoch" and getattr(p, iterations_key):
            bad(key, f"give {iterations_key} or {key}, not both")
    for key in ("warmup_iter", "warmup_start_lr", "min_lr"):
        if getattr(p, key) < 0:
            bad(key, f"must not be negative, got {getattr(p, key)}")
    for key in COUNTS:  # (Caffe's int32 fields: a count past them is a slip, and would run for ever)
        values = getattr(p, key)
        for value in values if isinstance(values, list) else [values]:
            if isinstance(value, int) and value > MAX_COUNT:
                bad(key, f"must be at most {MAX_COUNT:,}, as in Caffe, got {value:,}")
                break
    if p.max_iter is not None and 0 < p.max_iter <= p.warmup_iter:
        bad("warmup_iter", f"must be less than max_iter ({p.max_iter}), got {p.warmup_iter}")
    if "min_lr" in tree and p.lr_policy != "cosine":
        bad("min_lr", f"only the cosine policy uses min_lr (lr_policy is '{p.lr_policy}')")
    if p.base_lr is not None and p.base_lr > 0 and p.min_lr > p.base_lr:
        bad("min_lr", f"must not exceed base_lr ({p.base_lr}), got {p.min_lr}")
    if p.keep_last is not None and p.keep_last < 1:
        bad("keep_last", f"must be at least 1 (the newest snapshot is always kept), got {p.keep_last}")
    for key in ("snapshot_best", "early_stop"):
        _check_watch(key, getattr(p, key), p, bad)
    for key in ("iter_size", "average_loss"):
        if getattr(p, key) < 1:
            bad(key, f"must be at least 1, got {getattr(p, key)}")
    for key in ("display", "snapshot", "test_interval", "momentum", "weight_decay"):
        if getattr(p, key) < 0:
            bad(key, f"must not be negative, got {getattr(p, key)}")
    if any(n != TEST_EPOCH and n <= 0 for n in p.test_iter):
        bad("test_iter", f"every value must be positive, got {p.test_iter}")
    if p.type not in solver_types:
        bad("type", f"unknown solver type '{p.type}'{did_you_mean(p.type, solver_types)} "
                    "(netspec solvers lists them)")
    needs = {"step": ("gamma", "stepsize"), "exp": ("gamma",), "inv": ("gamma", "power"),
             "multistep": ("gamma", "stepvalue"), "poly": ("power",), "sigmoid": ("gamma", "stepsize")}
    for key in needs.get(p.lr_policy, ()):
        if getattr(p, key) in (None, []):
            bad(key, f"lr_policy '{p.lr_policy}' needs {key}")
    if p.lr_policy == "step" and p.stepsize is not None and p.stepsize <= 0:
        bad("stepsize", f"must be a positive integer, got {p.stepsize}")
    if any(b <= a for a, b in zip(p.stepvalue, p.stepvalue[1:])):
        bad("stepvalue", f"values must increase, got {p.stepvalue}")


def _check_watch(key: str, watch: WatchedOutput | None, p: SolverParams, bad) -> None:
    """``snapshot_best`` and ``early_stop`` follow a test net's results, so they need one that is tested."""
    if watch is None:
        return
    if not p.test_iter or not (p.test_interval or p.test_interval_epochs):
        bad(key, "follows test results, so it needs a test net and test_interval (or test_interval_epochs)")
    elif not 0 <= watch.test_net < len(p.test_iter):
        bad(key, f"test_net {watch.test_net} does not exist (the solver has {len(p.test_iter)} test net(s), "
                 "numbered from 0)")
    if isinstance(watch, EarlyStop):
        if watch.patience is not None and watch.patience < 1:
            bad(key, f"patience must be at least 1, got {watch.patience}")
        if watch.min_delta < 0:
            bad(key, f"min_delta must not be negative, got {watch.min_delta}")


def with_epochs_resolved(params: SolverParams, iterations_per_epoch: float) -> SolverParams:
    """A copy of ``params`` with every ``*_epoch(s)`` value turned into its iteration count.

    Training lengths round up (at least the asked epochs are seen); intervals
    round to the nearest iteration, at least 1.
    """
    values = {}
    for key, iterations_key in EPOCH_KEYS.items():
        epochs = getattr(params, key)
        if epochs is not None:
            iterations = epochs * iterations_per_epoch
            values[iterations_key] = max(1, math.ceil(iterations - 1e-9) if key == "max_epoch" else round(iterations))
    return dataclasses.replace(params, **values)


def parse_solver(source, layer_schemas: dict[str, dict[str, type]], solver_types) -> SolverSpec:
    """Read and validate a solver from a path or YAML text, with its nets.

    ``solver_types`` names the registered update rules.  Raises ConfigError
    listing every problem in the solver and its nets.
    """
    text, filename = read_source(source)
    tree = load_yaml(text, filename)
    base_dir = os.path.dirname(os.path.abspath(filename)) if filename else os.getcwd()
    ctx = Context(filename, base_dir)
    if not isinstance(tree, YamlMap):
        raise ConfigError(Problem("a solver file must be a mapping (base_lr, max_iter, net, ...)",
                                  file=filename or "<string>", line=1))
    if ("layers" in tree or "layer" in tree) and "net" not in tree and "train_net" not in tree:
        key = "layers" if "layers" in tree else "layer"
        raise ConfigError(Problem(f"this is a net file (it has '{key}'), not a solver: give a solver file, which "
                                  f"names it with net: (netspec check takes a net file)", file=filename or "<string>",
                                  line=tree.line_of(key)))
    hyper = YamlMap({k: v for k, v in tree.items() if k not in NET_KEYS})
    hyper.line, hyper.key_lines = tree.line, dict(tree.key_lines)
    params = read_block(SolverParams, hyper, ctx, "", 1)
    net_texts: dict[str, str] = {}

    def net_at(key: str, value, line: int) -> NetConfig | None:
        return _read_net_value(value, ctx, key, line, layer_schemas, net_texts)

    train_net, test_nets = None, []
    tested = params.test_interval or params.test_interval_epochs
    if ("net" in tree) == ("train_net" in tree):
        ctx.add("give the net to train as 'net' (train and test phases of one file) or 'train_net'",
                tree.line_of("train_net" if "train_net" in tree else "net"), "net")
    elif "net" in tree:
        train_net = net_at("net", tree["net"], tree.line_of("net"))
        if "test_net" in tree:
            ctx.add("with 'net', the test nets are its TEST phase; use train_net with test_net",
                    tree.line_of("test_net"), "test_net")
        if tested and not params.test_iter:
            params.test_iter = [TEST_EPOCH] * max(1, len(params.test_state))  # its TEST phase, over one pass
        test_nets = [train_net] * len(params.test_iter)
    else:
        train_net = net_at("train_net", tree["train_net"], tree.line_of("train_net"))
        given = tree.get("test_net", [])
        given = given if isinstance(given, list) else [given]
        for index, value in enumerate(given):
            line = given.line_of(index) if isinstance(given, YamlList) else tree.line_of("test_net")
            test_nets.append(net_at(f"test_net[{index}]", value, line))
        if tested and not params.test_iter:
            params.test_iter = [TEST_EPOCH] * len(test_nets)
        if len(params.test_iter) != len(test_nets):
            ctx.add(f"test_iter needs one value per test net: {len(test_nets)} test net(s), "
                    f"{len(params.test_iter)} value(s)" + ("; add test_net" if not test_nets else ""),
                    tree.line_of("test_iter"), "test_iter")
    for key in ("test_interval", "test_interval_epochs"):
        if getattr(params, key) and not params.test_iter and train_net is not None:
            ctx.add("needs a net to test: give test_net", tree.line_of(key), key)
    if params.test_state and len(params.test_state) != len(params.test_iter):
        ctx.add(f"give one test_state per test net ({len(params.test_iter)})", tree.line_of("test_state"),
                "test_state")
    _check_values(params, ctx, tree, solver_types)
    if ctx.problems:
        raise ConfigError(ctx.problems)
    return SolverSpec(params=params, train_net=train_net, test_nets=test_nets, file=filename, text=text,
                      config_hash=config_hash(tree), net_texts=net_texts, lines=dict(tree.key_lines))
