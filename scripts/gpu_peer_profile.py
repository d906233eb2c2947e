"""gpu_peer_profile.py — the PyTorch peers' side of examples/common/step_profiler.h.

BOOSTER_EXAMPLE_PROFILE="FIRST-LAST:PATH" (e.g. "201-210:/tmp/peer.json"): torch.profiler records CPU
operators and, with a GPU, CUDA runtime calls and kernels from the start of training step FIRST to the
end of step LAST (1-based), then writes a Chrome trace to PATH. Unset or empty: nothing. The peers
(gpu_peer_fashion_mnist.py, gpu_peer_gpt.py) import it from their own directory.
"""
import os
import sys

import torch


class StepProfiler:
    def __init__(self):
        value = os.environ.get("BOOSTER_EXAMPLE_PROFILE", "")
        self.first = self.last = 0
        self.path = ""
        self.prof = None
        if not value:
            return
        span, _, self.path = value.partition(":")
        first, _, last = span.partition("-")
        try:
            self.first, self.last = int(first), int(last)
        except ValueError:
            self.first = 0
        if self.first < 1 or self.last < self.first or not self.path:
            raise ValueError('BOOSTER_EXAMPLE_PROFILE="%s": expected FIRST-LAST:PATH with 1 <= FIRST <= LAST, '
                             'e.g. "201-210:/tmp/trace.json"' % value)

    def begin_step(self, step):
        """Call before training step `step` (1-based) starts."""
        if not self.path or self.prof is not None or step != self.first:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=activities)
        self.prof.__enter__()

    def end_step(self, step):
        """Call after training step `step` ended."""
        if self.prof is None or step != self.last:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.prof.__exit__(None, None, None)
        self.prof.export_chrome_trace(self.path)
        print("step_profiler: steps %d-%d traced to %s" % (self.first, self.last, self.path), file=sys.stderr)
        self.prof = None
