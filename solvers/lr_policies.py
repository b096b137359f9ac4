"""Learning-rate policies: Caffe's seven formulas plus cosine, and linear warm-up, as pure functions of the iteration.

Warm-up composes with every policy: for ``iter < warmup_iter`` the rate rises
linearly from ``warmup_start_lr`` to the policy's rate at ``warmup_iter``;
from there on the policy alone sets it.
"""

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


# One function per policy of netspec.spec.solver_spec.LR_POLICIES, where the names and formulas are listed.
POLICIES = {
    "fixed": lambda p, it: p.base_lr,
    "step": lambda p, it: p.base_lr * p.gamma ** (it // p.stepsize),
    "exp": lambda p, it: p.base_lr * p.gamma ** it,
    "inv": lambda p, it: p.base_lr * (1.0 + p.gamma * it) ** (-p.power),
    "multistep": lambda p, it: p.base_lr * p.gamma ** multistep_count(p, it),
    "poly": lambda p, it: p.base_lr * (1.0 - it / p.max_iter) ** p.power,
    "sigmoid": sigmoid,
    "cosine": lambda p, it: p.min_lr + (p.base_lr - p.min_lr) * 0.5 * (1.0 + math.cos(math.pi * it / p.max_iter)),
}
READS_MAX_ITER = frozenset({"poly", "cosine"})  # the policies whose rate depends on the length of training


def learning_rate(params, iteration: int) -> float:
    """The learning rate at ``iteration`` (counted from 0) under ``params.lr_policy`` and warm-up."""
    policy = POLICIES[params.lr_policy]
    warmup = params.warmup_iter
    if iteration < warmup:
        start = params.warmup_start_lr
        return float(start + (policy(params, warmup) - start) * iteration / warmup)
    return float(policy(params, iteration))


def rate_problem(params) -> str | None:
    """Why the schedule of ``params`` has no finite, non-negative learning rate at some iteration from 0 to
    ``max_iter``; None if it has one at every iteration.  Each policy rises or falls steadily, so where it
    starts, where warm-up ends and where it ends tell; inv with a negative gamma also where its base
    1 + gamma * iter first reaches 0 or goes below."""
    iterations = {0, params.warmup_iter, params.max_iter}
    if params.lr_policy == "inv" and params.gamma < 0:
        iterations.add(min(params.max_iter, math.ceil(-1 / params.gamma)))
    for iteration in sorted(iterations):
        try:
            rate = learning_rate(params, iteration)
        except (OverflowError, ZeroDivisionError, TypeError):  # (TypeError: a negative base's power is complex)
            rate = math.inf
        if not (math.isfinite(rate) and rate >= 0):
            return (f"lr_policy '{params.lr_policy}' gives {'a negative' if rate < 0 else 'no finite'} learning rate "
                    f"at iteration {iteration} (base_lr {params.base_lr}, gamma {params.gamma}, power {params.power})")
    return None
