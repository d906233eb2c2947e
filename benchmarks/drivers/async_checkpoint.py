"""async_checkpoint -- how long a checkpoint save blocks the training loop: asynchronous
(booster/checkpoint/async_save.h, CheckpointManager::set_async) against blocking, for the GPT
example's model + AdamW state and for a 1 GiB state dict.

build/bin/bench_async_checkpoint saves one-commit checkpoint sets with CheckpointManager, `reps`
times per mode, and reports the time save() held the training thread (blocked), and for async the
time the background writer took after that until the set was committed. Peer: our blocking save
of the same set in the same run. Limit: one clone of the same bytes (staging copies every byte
once). The program checks that the committed files hold the values of save time although training
changed them right after save() returned, and (1 GiB case) that the async files equal the blocking
ones byte for byte.
"""
import os
import shutil

import bench_util as bu

ID = "async_checkpoint"
CASES = {"gpt": {}, "big": {"tensors": 16, "tensor_kb": 64 << 10}}
SMOKE_BIG = {"tensors": 4, "tensor_kb": 1 << 10}


def run(ctx):
    exe = bu.program(ctx, "bench_async_checkpoint")
    reps = 2 if ctx.smoke else max(3, min(ctx.reps, 5))
    work = os.path.join(ctx.tmp_dir, "async_checkpoint")
    rows, notes = [], []
    for case, extra in CASES.items():
        if case == "big" and ctx.smoke:
            extra = SMOKE_BIG
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        out = os.path.join(ctx.tmp_dir, f"async_checkpoint_{case}.json")
        cmd = [exe, "--dir", work, "--case", case, "--reps", str(reps), "--out", out]
        for k, v in extra.items():
            cmd += [f"--{k}", str(v)]
        ctx.log(f"async_checkpoint: {case}, {reps} saves per mode")
        bu.run(cmd, timeout=1200)
        d = bu.read_json(out)
        size = bu.fmt_bytes(d["bytes"])
        sync_b, async_b = bu.median(d["sync"]["blocked_s"]), bu.median(d["async"]["blocked_s"])
        async_done = bu.median(d["async"]["done_s"])
        copy = bu.median(d["memcpy_s"])
        what = (f"GPT example (4 layers, C 256): model + AdamW, {size}" if case == "gpt"
                else f"{size} state dict (16 tensors, 256 MiB shards)")
        rows.append([what, f"{bu.fmt_s(async_b)}", f"blocking save: {bu.fmt_s(sync_b)}", bu.ratio(async_b, sync_b),
                     bu.verdict_vs_peer(async_b, sync_b), f"one copy of the bytes: {bu.fmt_s(copy)}",
                     bu.verdict_vs_limit(async_b, copy), f"{bu.fmt_s(async_done)}"])
        if case == "gpt" and d["step_s"]:
            notes.append(f"GPT example: a training step (batch 16 x 128, one thread) takes {bu.fmt_s(bu.median(d['step_s']))}; "
                         f"{d['async']['steps_during_write']} steps ran while the {reps} async saves were being written (the loop "
                         "trains until the writer is done, so the last column is measured in whole steps there).")
    shutil.rmtree(work, ignore_errors=True)
    return {
        "id": ID,
        "title": "Asynchronous checkpoint saves: time the training loop is blocked per save",
        "description": (
            "`CheckpointManager::save` of one set (model/ + optimizer/ as safetensors + trainer_state.json, "
            "as the examples write) with `set_async(true)` (*ours*: the files are staged in host memory, "
            "a background thread writes, fsyncs and commits them with the one rename) against the same "
            "save blocking (*peer*: write + fsync + rename on the training thread). Blocked = the time "
            "save() held the training thread, with the writer idle before each save. *Limit*: one clone of "
            "the same bytes (staging copies every byte once). The last column is how long the background "
            "writer took after save() returned until the set was committed. Correctness is checked by the "
            "program (committed files hold the values of save time although training changed them; the "
            "async files equal the blocking ones byte for byte)."),
        "columns": ["state", "ours: async, blocked", "peer", "ours / peer", "verdict", "limit", "ours / limit",
                    "async: written + committed after"],
        "rows": rows,
        "notes": notes + [f"Median of {reps} saves per mode; one intra-op thread. Disk writes on this shared "
                          "virtual machine vary between runs."],
        "command": "~/.cache/booster/venv/bin/python3 benchmarks/run_benchmarks.py --only async_checkpoint",
    }
