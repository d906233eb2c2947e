"""checkpoint -- benchmark 3: save and load of a ~1 GiB state dict, ours vs torch.save/torch.load vs dd.

Ours: build/bin/bench_checkpoint saves a 16 x 64 MiB float32 state dict with
booster::checkpoint::save_state_dict (sharded, 256 MiB shards) as safetensors and as .bin, loads each
back with load_state_dict and checks every tensor equals what was saved. Peer:
benchmarks/peers/torch_checkpoint.py (the venv's python3, torch 2.11) reads our .bin
checkpoint with torch.load, checks it against bench_checkpoint's checksums, then times torch.save
(+ fsync) and torch.load of that same dict and checks the checksums again. Limit: dd of the same
number of bytes (write from /dev/zero with and without conv=fsync, read to /dev/null).
The three are interleaved, order alternating per repetition; medians are reported.
"""
import os
import shutil

import bench_util as bu

ID = "checkpoint"
FULL = {"tensors": 16, "tensor_kb": 64 << 10, "shard_mb": 256}   # 1 GiB, 4 shards
SMOKE = {"tensors": 4, "tensor_kb": 1 << 10, "shard_mb": 2}        # 4 MiB, 2 shards
MAX_REPS = 3


def _dd_write(path, mib, fsync):
    if os.path.exists(path):
        os.remove(path)
    cmd = ["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "status=none"]
    if fsync:
        cmd.append("conv=fsync")
    return bu.timed(cmd)


def run(ctx):
    exe = bu.program(ctx, "bench_checkpoint")
    peer_script = os.path.join(ctx.source_dir, "benchmarks", "peers", "torch_checkpoint.py")
    cfg = SMOKE if ctx.smoke else FULL
    # A repetition writes ~5 GiB (most of it fsynced) and takes ~30 s here: at most 3 keep the suite < 15 min.
    reps = 1 if ctx.smoke else min(ctx.reps, MAX_REPS)
    work = os.path.join(ctx.tmp_dir, "checkpoint")
    total = cfg["tensors"] * cfg["tensor_kb"] * 1024
    mib = total >> 20
    ctx.log(f"checkpoint: {bu.fmt_bytes(total)} in {cfg['tensors']} tensors, {reps} reps")

    samples = {k: [] for k in ("ours_st_save", "ours_st_load", "ours_bin_save", "ours_bin_load", "peer_save",
                               "peer_save_fsync", "peer_load", "dd_write", "dd_write_fsync", "dd_read")}

    def ours():
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        out = os.path.join(ctx.tmp_dir, "checkpoint_ours.json")
        # bench_checkpoint exits non-zero if a loaded tensor differs from the saved one.
        bu.run([exe, "--dir", work, "--tensors", str(cfg["tensors"]), "--tensor_kb", str(cfg["tensor_kb"]),
                "--shard_mb", str(cfg["shard_mb"]), "--formats", "safetensors,bin", "--out", out], timeout=900)
        d = bu.read_json(out)
        if d["total_bytes"] != total:
            raise bu.BenchError(f"bench_checkpoint wrote {d['total_bytes']} bytes, expected {total}")
        samples["ours_st_save"].append(d["safetensors"]["save_s"])
        samples["ours_st_load"].append(d["safetensors"]["load_s"])
        samples["ours_bin_save"].append(d["bin"]["save_s"])
        samples["ours_bin_load"].append(d["bin"]["load_s"])

    def peer():
        # Needs the .bin checkpoint and checksums of the last ours() run (same dict: fixed seed).
        out = os.path.join(ctx.tmp_dir, "checkpoint_peer.json")
        pt = os.path.join(ctx.tmp_dir, "checkpoint_peer.pt")
        if os.path.exists(pt):
            os.remove(pt)
        bu.run([ctx.python, peer_script, "--ours", os.path.join(work, "bin"),
                "--checksums", os.path.join(ctx.tmp_dir, "checkpoint_ours.json"), "--file", pt, "--out", out],
               timeout=900)
        d = bu.read_json(out)
        samples["peer_save"].append(d["save_s"])
        samples["peer_save_fsync"].append(d["save_fsync_s"])
        samples["peer_load"].append(d["load_s"])
        os.remove(pt)

    def dd():
        path = os.path.join(ctx.tmp_dir, "checkpoint_dd.bin")
        samples["dd_write"].append(_dd_write(path, mib, fsync=False))
        samples["dd_write_fsync"].append(_dd_write(path, mib, fsync=True))
        samples["dd_read"].append(bu.timed(["dd", f"if={path}", "of=/dev/null", "bs=1M", "status=none"]))
        os.remove(path)

    for r in range(reps):
        # The peer reads the checkpoint ours() just wrote, so ours() comes first; dd moves around it.
        order = [ours, peer, dd] if r % 2 == 0 else [dd, ours, peer]
        for step in order:
            step()
    shutil.rmtree(work, ignore_errors=True)

    m = {k: bu.median(v) for k, v in samples.items()}
    shards = -(-total // (cfg["shard_mb"] << 20))

    def row(op, ours_key, peer_key, limit_key, peer_name, limit_name):
        o, p, l = m[ours_key], m[peer_key], m[limit_key]
        return [op, f"{bu.fmt_s(o)} ({bu.fmt_bw(total, o)})", f"{peer_name}: {bu.fmt_s(p)} ({bu.fmt_bw(total, p)})",
                bu.ratio(o, p), bu.verdict_vs_peer(o, p), f"{limit_name}: {bu.fmt_s(l)} ({bu.fmt_bw(total, l)})",
                bu.ratio(o, l)]

    rows = [
        row(f"save, safetensors, {shards} shards", "ours_st_save", "peer_save_fsync", "dd_write_fsync",
            "torch.save + fsync", "dd conv=fsync"),
        row(f"save, .bin, {shards} shards", "ours_bin_save", "peer_save_fsync", "dd_write_fsync",
            "torch.save + fsync", "dd conv=fsync"),
        row("load, safetensors (warm cache)", "ours_st_load", "peer_load", "dd_read", "torch.load", "dd read"),
        row("load, .bin (warm cache)", "ours_bin_load", "peer_load", "dd_read", "torch.load", "dd read"),
        ["write without fsync (page cache only; reference)", "n/a: our save always fsyncs",
         f"torch.save: {bu.fmt_s(m['peer_save'])} ({bu.fmt_bw(total, m['peer_save'])})", "", "",
         f"dd: {bu.fmt_s(m['dd_write'])} ({bu.fmt_bw(total, m['dd_write'])})", ""],
    ]
    return {
        "id": ID,
        "title": f"Checkpoint: save and load of a {bu.fmt_bytes(total)} state dict",
        "description": (
            f"A state dict of {cfg['tensors']} float32 tensors of {bu.fmt_bytes(cfg['tensor_kb'] * 1024)} "
            f"({bu.fmt_bytes(total)}, random values, fixed seed). *Ours*: `booster::checkpoint::save_state_dict` "
            f"sharded at {cfg['shard_mb']} MiB (HuggingFace layout, atomic: temporary directory, fsync of every "
            "file and the directory, rename) in safetensors and in .bin, and `load_state_dict` of each; one "
            "intra-op thread. *Peer*: Python `torch.save` of the same dict to one file followed by `os.fsync` "
            "(our save fsyncs, so the peer does too), and `torch.load` (torch 2.11, one thread). "
            "*Limit*: `dd` of the same number of bytes from /dev/zero with `conv=fsync` (write) and to /dev/null "
            "(read). Loads read files just written, so they come from the page cache (warm; dropping caches needs "
            "root). Correctness: bench_checkpoint checks every loaded tensor equals the saved one; the peer loads "
            "our .bin checkpoint with torch.load and checks each tensor's checksum (int64 sum of its 32-bit words, "
            "first and last word) against the one computed before saving, then checks its own torch.load the same "
            "way. Ours, peer and dd are interleaved per repetition; medians are shown. Bandwidth = bytes / time."),
        "columns": ["operation", "ours (time, bandwidth)", "peer", "ours / peer", "verdict", "limit",
                    "ours / limit"],
        "rows": rows,
        "notes": [
            f"Median of {reps} repetitions (at most {MAX_REPS}, whatever --reps says: each one writes about "
            f"{bu.fmt_bytes(5 * total)}). Disk writes on this shared virtual machine vary a lot between runs; "
            "compare ratios, not absolute times.",
            "The peer writes one file; ours writes shards + an index into a temporary directory and renames it.",
        ],
        "command": "~/.cache/booster/venv/bin/python3 benchmarks/run_benchmarks.py --only checkpoint",
    }
