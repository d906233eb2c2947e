"""optimizer_step -- benchmark 5: torch::optim::AdamW step time vs the bytes-moved bound.

Runs build/bin/bench_optimizer_step (one process): AdamW on a flat float32 parameter of 10M and 100M
elements, checked against a hand-written reference after two steps, then timed interleaved with a
memcpy that moves the same 28 bytes/param (the bound an fp32 Adam step cannot beat), with 1 and 2
intra-op threads. See benchmarks/bench_optimizer_step.cpp. This is the baseline the CPU Adam kernel
of a later issue must beat.
"""
import os

import bench_util as bu

ID = "optimizer_step"
NUMELS = [10_000_000, 100_000_000]
SMOKE_NUMELS = [200_000]
BYTES_PER_PARAM = 28


def _count(n):
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def run(ctx):
    exe = bu.program(ctx, "bench_optimizer_step")
    numels = SMOKE_NUMELS if ctx.smoke else NUMELS
    reps = 1 if ctx.smoke else ctx.reps
    out = os.path.join(ctx.tmp_dir, "optimizer_step.json")
    sample_numel = 1_000_000 if ctx.smoke else 30_000_000
    ctx.log(f"optimizer_step: {[_count(n) for n in numels]} parameters, threads 1 and 2, {reps} reps")
    # Exits non-zero when AdamW differs from the reference formula: no figure is reported then.
    bu.run([exe, "--numels", ",".join(map(str, numels)), "--threads", "1,2", "--reps", str(reps),
            "--sample_numel", str(sample_numel), "--out", out],
           timeout=900)
    data = bu.read_json(out)

    rows = []
    for res in data["results"]:
        n, threads = res["numel"], res["threads"]
        step, copy = bu.median(res["step_s"]), bu.median(res["copy_s"])
        moved = BYTES_PER_PARAM * n
        if 2 * res["copy_bytes"] != moved:
            raise bu.BenchError(f"memcpy moved {2 * res['copy_bytes']} bytes, expected {moved}")
        rows.append([f"{_count(n)} fp32 parameters", str(threads),
                     f"{bu.fmt_s(step)} ({bu.fmt_bw(moved, step)} effective)",
                     f"{bu.fmt_s(copy)} ({bu.fmt_bw(moved, copy)})",
                     bu.ratio(step, copy), f"{res['check_max_rel_err']:.1e}"])

    return {
        "id": ID,
        "title": "Optimizer step: torch::optim::AdamW vs the bytes-moved bound",
        "description": (
            "One `torch::optim::AdamW` step (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01) on one flat "
            "float32 parameter with a gradient, LibTorch 1.13, with 1 and 2 intra-op threads. *Limit*: an fp32 "
            f"Adam step must move at least {BYTES_PER_PARAM} bytes per parameter (read param, grad, exp_avg, "
            "exp_avg_sq; write param, exp_avg, exp_avg_sq); the bound is the time of a memcpy "
            "(`at::Tensor::copy_`, same threads) of 14 bytes/param, which reads 14 and writes 14 bytes/param, "
            "measured in the same process. Effective bandwidth = 28 bytes/param / step time. Correctness: after "
            "two steps the first and last 100k parameters must match a hand-written AdamW in double within 1e-6 "
            "relative (column *check*). Steps and copies are interleaved; medians are shown. This is the "
            "baseline the fused CPU Adam kernel of a later issue must beat; there is no Booster figure yet, "
            "only the LibTorch optimizer every plugin uses today."),
        "columns": ["configuration", "intra-op threads", "AdamW step (ours today: LibTorch's)",
                    "28 bytes/param at memcpy bandwidth (limit)", "step / limit", "check (max rel. error)"],
        "rows": rows,
        "notes": [
            f"Median of {reps} interleaved repetitions (each the mean of back-to-back steps worth ~{_count(sample_numel)} "
            "parameters).",
            "LibTorch's AdamW makes several passes over memory and allocates a temporary per step, so it stays "
            "well above the bound; a fused single-pass kernel could approach it.",
        ],
        "command": "/usr/bin/python3 benchmarks/run_benchmarks.py --only optimizer_step",
    }
