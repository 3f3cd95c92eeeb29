"""Launch configurations replaced from the environment, for measuring alternatives inside a real run (benchmarks/
gpu_decode.py A/B runs), where clocks and the pool differ from a microbenchmark."""
from __future__ import annotations

import os


def env_launch(name: str, keys: tuple[str, ...]) -> dict | None:
    """The integers of environment variable `name` ("v1,v2,...") as a dict over `keys`; None when it is unset."""
    value = os.environ.get(name)
    return dict(zip(keys, map(int, value.split(",")))) if value else None
