"""gpu_trace_summary.py — where a training step's time goes, from a Chrome trace written by
examples/common/step_profiler.h (ours) or gpu_peer_profile.py (the PyTorch peers).

    python3 gpu_trace_summary.py TRACE.json STEPS [LABEL]

Prints per step (the trace covers STEPS steps): the wall time the host spent in the traced window,
the GPU's busy time (the union of kernel and memcpy intervals), kernel launches, CUDA runtime calls by
name, host-device synchronisations, and the CPU operators with the most time (inclusive, so nested
operators count in their parents too). Standard library only.
"""
import collections
import json
import sys


def union_length(intervals):
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def main():
    if len(sys.argv) < 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    path, steps = sys.argv[1], int(sys.argv[2])
    label = sys.argv[3] if len(sys.argv) > 3 else path
    with open(path) as f:
        data = json.load(f)
    events = [e for e in (data["traceEvents"] if isinstance(data, dict) else data)
              if e.get("ph") == "X" and "dur" in e]
    host = [e for e in events if e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation")]
    device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if not host:
        print("%s: no host events in %s" % (label, path))
        return 1
    t0 = min(e["ts"] for e in host)
    t1 = max(e["ts"] + e["dur"] for e in host)
    wall = (t1 - t0) / steps
    busy = union_length([(e["ts"], e["ts"] + e["dur"]) for e in device]) / steps
    runtime = collections.Counter(e["name"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver"))
    syncs = sum(n for name, n in runtime.items() if "Synchronize" in name or name in ("cudaMemcpy", "cudaMemcpyAsync"))
    ops = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("cat") == "cpu_op":
            ops[e["name"]][0] += 1
            ops[e["name"]][1] += e["dur"]
    print("%s: %.1f us/step host wall, GPU busy %.1f us/step (%.0f%%), %.1f kernels/step, %d steps" %
          (label, wall, busy, 100.0 * busy / wall if wall else 0, len(kernels) / steps, steps))
    print("  CUDA runtime calls/step: " + ", ".join("%s %.1f" % (n, c / steps) for n, c in runtime.most_common(6)) +
          "; synchronising calls (memcpy / synchronize) %.1f" % (syncs / steps))
    top = sorted(ops.items(), key=lambda kv: -kv[1][1])[:12]
    print("  CPU operators (inclusive us/step, calls/step): " +
          ", ".join("%s %.0f (%.1f)" % (n, v[1] / steps, v[0] / steps) for n, v in top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
