"""Progress reporting and per-stage timings of one encode."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import contextmanager

logger = logging.getLogger("visionmoe.splat.encoder")

ProgressFn = Callable[[str, int, int], None]


class Progress:
    """Reports ``(stage, done, total)`` to a callback, or to a tqdm bar (``progress=True``)."""

    def __init__(self, progress: bool | ProgressFn = False):
        self.fn, self.bar = None, None
        if callable(progress):
            self.fn = progress
        elif progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=4, desc="pgms", unit="step", leave=False)

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.fn is not None:
            self.fn(stage, done, total)
        if self.bar is not None:
            self.bar.set_description(f"pgms: {stage}")
            if done == total:
                self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class StageTimes:
    """Seconds per stage of one encode (``CompressResult.timings``). ``stage(name)`` times a
    block and logs its result at INFO (``visionmoe-splat compress --verbose`` shows them);
    ``add`` accumulates the sub-steps that run many times (quantise, encode, verify).
    ``enabled=False`` (the pruning search's variants): nothing is recorded."""

    def __init__(self, enabled: bool = True):
        self.seconds: dict[str, float] = {}
        self.enabled = enabled

    def add(self, name: str, seconds: float) -> None:
        if self.enabled:
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def set(self, name: str, seconds: float) -> None:
        if self.enabled:
            self.seconds[name] = seconds

    @contextmanager
    def stage(self, name: str, summary: Callable[[], str] | None = None):
        """Time the block as stage ``name``; ``summary()`` (called after it) describes its result."""
        t = time.perf_counter()
        yield
        dt = time.perf_counter() - t
        self.set(name, dt)
        if self.enabled:
            logger.info("stage %s: %.2f s%s", name, dt, f" ({summary()})" if summary is not None else "")

    @contextmanager
    def step(self, name: str):
        """Time the block and add it to ``name`` (a sub-step that runs many times)."""
        t = time.perf_counter()
        yield
        self.add(name, time.perf_counter() - t)

    def disabled(self) -> StageTimes:
        return StageTimes(enabled=False)
