"""Learning-rate policies: Caffe's seven formulas, as pure functions of the iteration."""

from __future__ import annotations

import bisect
import math


def multistep_count(p, iteration: int) -> int:
    """How many ``stepvalue`` entries ``iteration`` has reached (Caffe's ``current_step``)."""
    return bisect.bisect_right(p.stepvalue, iteration)


def sigmoid(p, iteration: int) -> float:
    """Caffe's sigmoid policy; far below the midpoint the rate is 0 rather than an overflow."""
    exponent = -p.gamma * (iteration - p.stepsize)
    return 0.0 if exponent > 700 else p.base_lr / (1.0 + math.exp(exponent))


POLICIES = {
    "fixed": lambda p, it: p.base_lr,
    "step": lambda p, it: p.base_lr * p.gamma ** (it // p.stepsize),
    "exp": lambda p, it: p.base_lr * p.gamma ** it,
    "inv": lambda p, it: p.base_lr * (1.0 + p.gamma * it) ** (-p.power),
    "multistep": lambda p, it: p.base_lr * p.gamma ** multistep_count(p, it),
    "poly": lambda p, it: p.base_lr * (1.0 - it / p.max_iter) ** p.power,
    "sigmoid": sigmoid,
}

FORMULAS = {
    "fixed": "base_lr",
    "step": "base_lr * gamma ^ floor(iter / stepsize)",
    "exp": "base_lr * gamma ^ iter",
    "inv": "base_lr * (1 + gamma * iter) ^ (-power)",
    "multistep": "base_lr * gamma ^ (number of stepvalue entries <= iter)",
    "poly": "base_lr * (1 - iter / max_iter) ^ power",
    "sigmoid": "base_lr / (1 + exp(-gamma * (iter - stepsize)))",
}


def learning_rate(params, iteration: int) -> float:
    """The learning rate at ``iteration`` (counted from 0) under ``params.lr_policy``."""
    return float(POLICIES[params.lr_policy](params, iteration))
