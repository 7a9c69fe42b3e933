"""Progress reporting and per-stage timings of one encode."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import contextmanager

logger = logging.getLogger("visionmoe.splat.encoder")

ProgressFn = Callable[[str, int, int], None]


class Progress:
    """Reports the encode's progress to a callback, or to a tqdm bar (``progress=True``), as
    ``(stage, done, total)``: ``total`` counts the steps of the whole encode and is fixed before
    the first report (:meth:`plan`: each stage's share, the refinement's Adam steps one step
    each); ``done`` never decreases and reaches ``total`` when the encode ends. A stage reports
    its own ``(stage, i, n)`` and lands within its share; a stage that ends early or does not
    run (a refinement stopped by its check, a skipped search) jumps to the end of its share."""

    def __init__(self, progress: bool | ProgressFn = False):
        self.fn, self.bar, self.wanted = None, None, bool(progress)
        if callable(progress):
            self.fn = progress
        self.start: dict[str, int] = {}
        self.share: dict[str, int] = {}
        self.total, self.done = 1, 0

    def plan(self, shares: list[tuple[str, int]]) -> None:
        """The stages in order with their step counts (stages absent or of 0 steps report no
        progress of their own)."""
        self.start, self.share, at = {}, {}, 0
        for stage, steps in shares:
            self.start[stage], self.share[stage] = at, max(0, int(steps))
            at += self.share[stage]
        self.total, self.done = max(at, 1), 0
        if self.wanted and self.fn is None and self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, desc="pgms", unit="step", leave=False)

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage in self.start:
            part = self.share[stage] * min(max(done, 0), max(total, 0)) // max(total, 1)
            self.done = max(self.done, self.start[stage] + part)
        self._emit(stage)

    def finish(self, stage: str) -> None:
        """``stage`` is over (run in full, stopped early or skipped)."""
        if stage in self.start:
            self.done = max(self.done, self.start[stage] + self.share[stage])
        self._emit(stage)

    def end(self) -> None:
        """The encode is over: ``done`` = ``total``."""
        self.done = self.total
        self._emit("done")

    def _emit(self, stage: str) -> None:
        if self.fn is not None:
            self.fn(stage, self.done, self.total)
        if self.bar is not None:
            self.bar.set_description(f"pgms: {stage}")
            self.bar.n = self.done
            self.bar.refresh()

    def quiet(self) -> Progress:
        """A progress that reports nothing: the inner runs of a search report as the search."""
        return Progress(False)

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
