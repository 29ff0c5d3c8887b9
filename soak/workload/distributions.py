"""Seeded sampling from the config's distributions (pure: the caller owns the RNG)."""

from __future__ import annotations

import math
import random

from soak.workload.config import ConstantDist, LognormalDist, UniformDist


def sample(dist: ConstantDist | UniformDist | LognormalDist, rng: random.Random) -> float:
    if isinstance(dist, ConstantDist):
        return dist.value
    if isinstance(dist, UniformDist):
        return rng.uniform(dist.low, dist.high)
    value = rng.lognormvariate(math.log(dist.median), dist.sigma)
    if dist.min is not None:
        value = max(value, dist.min)
    if dist.max is not None:
        value = min(value, dist.max)
    return value


def sample_int(dist: ConstantDist | UniformDist | LognormalDist, rng: random.Random, *, minimum: int = 0) -> int:
    return max(minimum, int(round(sample(dist, rng))))
