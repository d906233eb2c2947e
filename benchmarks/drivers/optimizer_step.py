"""optimizer_step -- benchmark 5: optimizer step time, Booster's CPUAdam (the fused SIMD kernel) and
LibTorch's torch::optim::AdamW, vs the bytes-moved bound.

Runs build/bin/bench_optimizer_step (one process): AdamW and CPUAdam on a flat float32 parameter of
10M and 100M elements, both checked against a hand-written reference after two steps (and against
each other in ulps), then timed interleaved with a memcpy that moves the same 28 bytes/param (the
bound an fp32 Adam step cannot beat), with 1 and 2 intra-op threads. See
benchmarks/bench_optimizer_step.cpp. Targets (issue 14): CPUAdam >= 3x faster than AdamW and within
1.5x of the bound.
"""
import os

import bench_util as bu

ID = "optimizer_step"
NUMELS = [10_000_000, 100_000_000]
SMOKE_NUMELS = [200_000]
BYTES_PER_PARAM = 28


def _count(n):
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def _span(values):
    lo, hi = min(values), max(values)
    return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}"


def run(ctx):
    exe = bu.program(ctx, "bench_optimizer_step")
    numels = SMOKE_NUMELS if ctx.smoke else NUMELS
    reps = 1 if ctx.smoke else ctx.reps
    out = os.path.join(ctx.tmp_dir, "optimizer_step.json")
    sample_numel = 1_000_000 if ctx.smoke else 30_000_000
    ctx.log(f"optimizer_step: {[_count(n) for n in numels]} parameters, threads 1 and 2, {reps} reps")
    # Exits non-zero when AdamW or CPUAdam differs from the reference formula: no figure is reported then.
    bu.run([exe, "--numels", ",".join(map(str, numels)), "--threads", "1,2", "--reps", str(reps),
            "--sample_numel", str(sample_numel), "--out", out],
           timeout=900)
    data = bu.read_json(out)

    rows = []
    isa = ""
    speedups, vs_copy, vs_inplace = [], [], []
    for res in data["results"]:
        n, threads = res["numel"], res["threads"]
        step, ours, copy = bu.median(res["step_s"]), bu.median(res["cpu_adam_s"]), bu.median(res["copy_s"])
        inplace = bu.median(res["inplace_s"])
        moved = BYTES_PER_PARAM * n
        if 2 * res["copy_bytes"] != moved:
            raise bu.BenchError(f"memcpy moved {2 * res['copy_bytes']} bytes, expected {moved}")
        isa = res["cpu_adam_isa"]
        speedups.append(step / ours)
        vs_copy.append(ours / copy)
        vs_inplace.append(ours / inplace)
        rows.append([f"{_count(n)} fp32 parameters", str(threads),
                     f"{bu.fmt_s(ours)} ({bu.fmt_bw(moved, ours)} effective)",
                     f"{bu.fmt_s(step)} ({bu.fmt_bw(moved, step)} effective)",
                     f"{bu.fmt_s(copy)} ({bu.fmt_bw(moved, copy)})",
                     f"{bu.fmt_s(inplace)} ({bu.fmt_bw(moved, inplace)})",
                     bu.ratio(step, ours), bu.ratio(ours, copy), bu.ratio(ours, inplace), bu.ratio(step, copy),
                     f"{res['cpu_adam_max_rel_err']:.1e} / {res['check_max_rel_err']:.1e}; "
                     f"{res['cpu_adam_max_ulp_vs_adamw']} ulp"])

    return {
        "id": ID,
        "title": "Optimizer step: Booster's CPUAdam and torch::optim::AdamW vs the bytes-moved bound",
        "description": (
            "One optimizer step (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01) on one flat float32 "
            "parameter with a gradient, with 1 and 2 intra-op threads: Booster's `booster::optim::CPUAdam` (the "
            f"fused single-pass SIMD kernel of `kernels/cpu`, path `{isa}`, OpenMP) and LibTorch 2.11's "
            "`torch::optim::AdamW`. *Limit*: an fp32 "
            f"Adam step must move at least {BYTES_PER_PARAM} bytes per parameter (read param, grad, exp_avg, "
            "exp_avg_sq; write param, exp_avg, exp_avg_sq); the bound is the time of a memcpy "
            "(`at::Tensor::copy_`, same threads) of 14 bytes/param, which reads 14 and writes 14 bytes/param, "
            "measured in the same process. A copy into a separate destination also reads each destination line "
            "before writing it (write-allocate), so its DRAM traffic is ~42 bytes/param, while an Adam step updates "
            "its three arrays in place; the tighter bound is therefore an in-place pass over the same bytes "
            "(`at::Tensor::mul_` on 14 bytes/param: read 14, write 14 in place), also shown. "
            "Effective bandwidth = 28 bytes/param / time. Correctness: after "
            "two steps the first and last 100k parameters of each must match a hand-written AdamW in double "
            "within 1e-6 relative, and CPUAdam's whole parameter must be within 4 float32 ulps of AdamW's "
            "(column *check*: CPUAdam / AdamW relative error; CPUAdam vs AdamW ulps). CPUAdam, AdamW, the "
            "copy and the in-place pass are interleaved in rotating order; medians are shown. Targets "
            "(issue 14): CPUAdam >= 3x faster than AdamW and within 1.5x of the memcpy limit."),
        "columns": ["configuration", "intra-op threads", "CPUAdam step (ours)", "AdamW step (LibTorch)",
                    "28 bytes/param at memcpy bandwidth (limit)", "28 bytes/param in place (tighter limit)",
                    "AdamW / CPUAdam", "CPUAdam / limit", "CPUAdam / in-place limit", "AdamW / limit", "check"],
        "rows": rows,
        "notes": [
            f"Median of {reps} interleaved repetitions (each the mean of back-to-back steps worth ~{_count(sample_numel)} "
            "parameters).",
            f"CPUAdam is {_span(speedups)}x faster than LibTorch's AdamW (target >= 3x: "
            f"{'met' if min(speedups) >= 3 else 'NOT met'}) and takes {_span(vs_copy)}x the memcpy limit (target <= 1.5x: "
            f"{'met' if max(vs_copy) <= 1.5 else 'NOT met'}). It is below 1x of that limit because the memcpy is not a "
            f"strict bound (write-allocate, see above); against the in-place pass it takes {_span(vs_inplace)}x"
            + (", i.e. it runs at about the memory bandwidth, its two divisions and square root per element (kept for "
               "bit-equality with LibTorch) hidden behind the memory traffic." if max(vs_inplace) <= 1.25 else "."),
            "LibTorch's AdamW makes several passes over memory (one per tensor operation) and allocates temporaries "
            "per step; the kernel reads and writes each array once.",
        ],
        "command": "~/.cache/booster/venv/bin/python3 benchmarks/run_benchmarks.py --only optimizer_step",
    }
