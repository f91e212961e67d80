"""CUDA graphs of the paged decode step, one per shape key, replayed over static buffers.

A decode step of a 135M-parameter model is a few hundred small kernels; launched one by one from
Python they cost more than they compute (docs/LOG.md: the H200 run was launch-bound). Captured
once per key (the batch-size bucket, the pages bucket of the gather attention, whether a row
filters top-k/top-p) and replayed, a step is one launch. The step reads only static buffers
(``cuda_step.DecodeBuffers``, the runner's weight buffers, the store), which the host updates in
place, so a graph stays valid until the shape changes; weights are refreshed with ``copy_``.

Where graphs are off (a CPU, or ``enabled=False``) :meth:`StepGraphs.run` calls the step directly:
the same operations, launched eagerly.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch


class StepGraphs:
    """Captured steps by key. ``step(advance)`` must run device operations only; ``advance=False``
    (the warm-up runs before a capture) must leave the buffers as they were, apart from rewriting
    the same keys and values and outputs."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self.captures = 0
        self._pool = None

    def run(self, key: Hashable, step: Callable[[bool], None]) -> None:
        if not self.enabled:
            step(True)
            return
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = self._capture(step)
        graph.replay()

    def _capture(self, step: Callable[[bool], None]) -> torch.cuda.CUDAGraph:
        if self._pool is None:  # one memory pool: graphs are replayed one at a time
            self._pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (kernel selection, compilation) off the capture
            for _ in range(2):
                step(False)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            step(True)
        self.captures += 1
        return graph

    def clear(self) -> None:
        self.graphs.clear()
