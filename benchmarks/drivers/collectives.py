"""collectives -- benchmark 2: collective bandwidth of our ProcessGroup adapter vs raw c10d Gloo.

Starts 2 fresh processes of build/bin/bench_collectives on 127.0.0.1 (one per rank, one intra-op
thread each). Each process creates our adapter (booster::dist::ProcessGroup::rendezvous) and a raw
c10d::ProcessGroupGloo with the same Gloo options on a second store, checks that both compute the
same result (bit for bit, and equal to the analytic answer), then times them interleaved, with a
single-process memcpy of the same bytes as the limit. Where LibTorch 2.11's Gloo has the operation
itself (all-gather into one tensor, reduce-scatter, bf16, AVG), it is timed too, as a third side.
See benchmarks/bench_collectives.cpp.
"""
import os

import bench_util as bu

ID = "collectives"
SIZES = [1 << 20, 16 << 20, 128 << 20]
SMOKE_SIZES = [64 << 10]
WORLD = 2


def wire_bytes(op, nbytes, world):
    """(ours, peer): payload bytes one rank sends for an op on an nbytes message, from the algorithms'
    layouts (pairwise/ring: (N-1)/N of the buffer per pass; fp8: 1 byte per float32 element plus a
    4-byte scale per piece, dist/fp8.h). The bf16 row's message is already bf16."""
    part = (world - 1) / world
    if op in ("allreduce", "allreduce_avg", "allreduce_bf16"):
        return (2 * part * nbytes, 2 * part * nbytes if op != "allreduce_bf16" else 4 * part * nbytes)
    if op in ("allgather", "reduce_scatter"):
        return (part * nbytes, part * nbytes if op == "allgather" else 2 * part * nbytes)
    if op == "allreduce_fp8":
        return (2 * part * nbytes / 4 + 2 * 4 * (world - 1), 2 * part * nbytes)
    if op == "allgather_fp8":
        return (part * nbytes / 4 + 4 * (world - 1), part * nbytes)
    raise ValueError(op)


def run(ctx):
    exe = bu.program(ctx, "bench_collectives")
    sizes = SMOKE_SIZES if ctx.smoke else SIZES
    reps = 1 if ctx.smoke else ctx.reps
    out = os.path.join(ctx.tmp_dir, "collectives.json")
    sample_bytes = (1 << 20) if ctx.smoke else (32 << 20)
    port, raw_port = bu.free_ports(2)
    cmds = [[exe, "--rank", str(r), "--world_size", str(WORLD), "--port", str(port), "--raw_port", str(raw_port),
             "--sizes_bytes", ",".join(map(str, sizes)), "--reps", str(reps), "--threads", "1",
             "--sample_bytes", str(sample_bytes), "--out", out]
            for r in range(WORLD)]
    ctx.log(f"collectives: {WORLD} ranks, sizes {[bu.fmt_bytes(s) for s in sizes]}, {reps} reps")
    # A rank exits non-zero when ours and raw disagree: run_parallel raises, no figure is reported.
    bu.run_parallel(cmds, timeout=900)
    data = bu.read_json(out)

    rows = []
    for res in data["results"]:
        nbytes = res["bytes"]
        sent = wire_bytes(res["op"], nbytes, WORLD)
        ours, raw, copy = bu.median(res["ours_s"]), bu.median(res["raw_s"]), bu.median(res["memcpy_s"])
        native = bu.median(res["native_s"]) if res.get("native_s") else None
        op = {"allreduce": "allreduce", "allgather": "allgather (into one tensor)",
              "reduce_scatter": "reduce-scatter (pairwise; peer: raw allreduce of the same buffer)",
              "allreduce_bf16": "bf16 allreduce (ours: bf16 reduce-scatter + all-gather; peer: fp32 allreduce of "
                                "the cast buffer)",
              "allreduce_avg": "AVG allreduce (ours: SUM, then divide; peer: the same by hand)",
              "allreduce_fp8": "fp8 allreduce of the float32 tensor (ours: e4m3 reduce-scatter + all-gather, "
                               "per-range scales; peer: fp32 allreduce)",
              "allgather_fp8": "fp8 allgather of the float32 tensor (ours: e4m3 pieces + scales; peer: fp32 "
                               "allgather)"}[res["op"]]
        native_cells = (["—", "—"] if native is None else
                        [f"{bu.fmt_s(native)} ({bu.fmt_bw(nbytes, native)})", bu.ratio(ours, native)])
        rows.append([op, bu.fmt_bytes(nbytes), f"{bu.fmt_bytes(sent[0])} / {bu.fmt_bytes(sent[1])}",
                     f"{bu.fmt_s(ours)} ({bu.fmt_bw(nbytes, ours)})",
                     f"{bu.fmt_s(raw)} ({bu.fmt_bw(nbytes, raw)})",
                     bu.ratio(ours, raw), bu.verdict_vs_peer(ours, raw)] + native_cells +
                    [f"{bu.fmt_s(copy)} ({bu.fmt_bw(nbytes, copy)})", bu.ratio(ours, copy)])

    return {
        "id": ID,
        "title": "Collective bandwidth: ProcessGroup adapter vs raw c10d Gloo vs memcpy",
        "description": (
            f"{WORLD} ranks (separate processes) on 127.0.0.1, Gloo over loopback, float32, one intra-op thread "
            "per rank. *Ours* is `booster::dist::ProcessGroup` (allreduce, all_gather_into_tensor, and "
            "reduce_scatter_tensor, which the adapter builds as a pairwise exchange over Gloo point-to-point: "
            "(N-1)/N of the buffer sent and received per rank). *Peer* is a raw "
            "`c10d::ProcessGroupGloo` created in the same processes with the same Gloo options: allreduce in place, "
            "allgather into views of the flat output, and for reduce-scatter the raw in-place allreduce of the same "
            "buffer plus the chunk copy (what a raw c10d user writes; the bound for a reduce-scatter is 2x its speed). "
            "The bf16 allreduce row moves a bf16 tensor of the given size: ours reduce-scatters and all-gathers it in "
            "bf16 (summed in float32), the peer casts it to float32 for Gloo's allreduce and back (LibTorch 1.13's "
            "Gloo had no bf16), so the bound is 2x. *Native 2.11* is LibTorch 2.11 Gloo's own operation where it "
            "has one: `_allgather_base`, `_reduce_scatter_base`, allreduce of the bf16 tensor (summed in bf16), "
            "allreduce with `ReduceOp::AVG` (SUM then a division inside Gloo's backend). "
            "The fp8 rows move the float32 allreduce / allgather tensors with float8 e4m3 on the wire "
            "(`booster/dist/fp8.h`, ColossalAI's fp8_communication: one scale per piece per rank, dequantized "
            "and summed in float32); their peer is the raw float32 op on the same tensor, and their result is "
            "checked against the analytic answer within fp8.h's error bound instead of bit for bit. "
            "*Bytes sent per rank* is computed from each algorithm's layout (the peer's reduce-scatter is a "
            "full allreduce; the bf16 peer sends the float32 cast). "
            "*Limit* is a single-process memcpy "
            "(`at::Tensor::copy_`) of the same bytes. Size is the message size: the allreduce tensor, the "
            "allgather output, the reduce-scatter input. Bandwidth = size / time. Before timing, each op runs once "
            "on both sides; results must be bit-identical and equal to the analytic answer. Each sample is the "
            f"mean of back-to-back ops worth about {bu.fmt_bytes(sample_bytes)} after a barrier; ours, raw and memcpy are interleaved; "
            "the median of the samples is shown (rank 0's clock)."),
        "columns": ["op", "size", "bytes sent per rank (ours / peer)", "ours (time, bandwidth)", "raw c10d Gloo (peer)", "ours / peer",
                    "verdict", "native 2.11 Gloo op", "ours / native", "memcpy of the same bytes (limit)",
                    "ours / limit"],
        "rows": rows,
        "notes": [
            f"Median of {reps} interleaved repetitions per figure; both ranks share the 2 cores with Gloo's "
            "threads, so small-message times are dominated by scheduling and loopback latency.",
            "Ratios below 1.05x and above 0.95x are within this machine's run-to-run noise.",
        ],
        "command": "~/.cache/booster/venv/bin/python3 benchmarks/run_benchmarks.py --only collectives",
    }
