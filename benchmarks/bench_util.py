"""bench_util.py -- helpers shared by the benchmark drivers (benchmarks/drivers/*.py).

Stdlib only. run_benchmarks.py puts benchmarks/ on sys.path, so a driver does `import bench_util`.
Times are always compared within one run: every figure in docs/benchmarks.md is a median of
interleaved repetitions and is shown next to its peer or limit and the ratio of the two.
"""
import json
import os
import re
import socket
import statistics
import subprocess
import time


class BenchError(RuntimeError):
    """A benchmark could not produce a trustworthy figure (a program failed or sides disagree)."""


def median(values):
    values = [v for v in values if v is not None]
    if not values:
        raise BenchError("no samples")
    return statistics.median(values)


def free_port():
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n):
    """n distinct free ports (sockets kept open until all are chosen, so they differ)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def peer_module(ctx, name):
    """benchmarks/peers/<name>.py loaded as a module (a driver's Python peer, whose helpers the
    driver calls, e.g. to write the shared starting weights): (path, module)."""
    import importlib.util
    path = os.path.join(ctx.source_dir, "benchmarks", "peers", name + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return path, module


def program(ctx, name):
    """Absolute path of build_dir/bin/<name>; BenchError if it was not built."""
    path = os.path.join(ctx.build_dir, "bin", name)
    if not os.access(path, os.X_OK):
        raise BenchError(f"{path} not found: build it first (bash scripts/run_benchmarks.sh builds everything)")
    return path


def run_gpt_example(ctx, tag, sets, timeout=1200):
    """Runs build/bin/gpt as one process with examples/configs/gpt_ddp.toml, the --set overrides
    `sets` and output_dir tmp_dir/<tag>, under /usr/bin/time. Returns (output text, peak RSS in MiB);
    BenchError when it fails or reports no peak RSS."""
    cmd = ["/usr/bin/time", "-f", "MAXRSS_KB %M", program(ctx, "gpt"),
           "--config", os.path.join(ctx.source_dir, "examples", "configs", "gpt_ddp.toml"),
           "--output_dir", os.path.join(ctx.tmp_dir, tag)]
    for s in sets:
        cmd += ["--set", s]
    p = run(cmd, timeout=timeout, cwd=ctx.source_dir)
    out = p.stdout + p.stderr
    rss = re.search(r"MAXRSS_KB (\d+)", out)
    if not rss:
        raise BenchError(f"{tag}: no peak RSS in the output of {' '.join(cmd)}")
    return out, int(rss.group(1)) / 1024.0


def run(cmd, timeout=600, env=None, cwd=None):
    """Runs cmd (list); returns CompletedProcess with text output; BenchError with stderr on failure."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise BenchError(f"timed out after {timeout} s: {' '.join(map(str, cmd))}")
    if p.returncode != 0:
        tail = (p.stderr or p.stdout or "").strip().splitlines()[-8:]
        raise BenchError(f"exit code {p.returncode}: {' '.join(map(str, cmd))}\n" + "\n".join(tail))
    return p


def run_parallel(cmds, timeout=600, env=None):
    """Starts all cmds at once (the ranks of one job), waits for all; BenchError if any failed."""
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for c in cmds]
    deadline = time.monotonic() + timeout
    outs, failed = [], []
    for c, p in zip(cmds, procs):
        try:
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise BenchError(f"timed out after {timeout} s: {' '.join(map(str, c))}")
        outs.append((out, err))
        if p.returncode != 0:
            tail = (err or out or "").strip().splitlines()[-8:]
            failed.append(f"exit code {p.returncode}: {' '.join(map(str, c))}\n" + "\n".join(tail))
    if failed:
        raise BenchError("\n".join(failed))
    return outs


def timed(cmd, **kw):
    """Wall time in seconds of running cmd to completion."""
    t0 = time.perf_counter()
    run(cmd, **kw)
    return time.perf_counter() - t0


def read_json(path):
    with open(path) as f:
        return json.load(f)


def fmt_s(seconds):
    """A duration with a unit that keeps 3 significant digits."""
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def fmt_bw(nbytes, seconds):
    """Bandwidth in GB/s (10^9 bytes per second)."""
    return f"{nbytes / seconds / 1e9:.2f} GB/s"


def fmt_bytes(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{n} B"


def ratio(ours, other):
    """ours / other as text, e.g. "1.23x"."""
    return f"{ours / other:.2f}x"


def verdict_vs_peer(ours_time, peer_time, tolerance=0.05):
    """For a peer (another implementation), where a smaller time wins: says plainly when we lose."""
    r = ours_time / peer_time
    if r > 1 + tolerance:
        return f"**we lose**: {r:.2f}x slower"
    if r < 1 - tolerance:
        return f"we win: {1 / r:.2f}x faster"
    return "on par (within 5%)"


def verdict_vs_limit(ours_time, limit_time):
    """For a limit (memcpy, dd, bytes-moved bound): how far from it we are."""
    r = ours_time / limit_time
    if r < 1:
        return f"{r:.2f}x of the limit (faster than it)"
    return f"{r:.2f}x the limit"
