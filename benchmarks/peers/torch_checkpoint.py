"""torch_checkpoint.py -- the Python peer of benchmark 3 (checkpoint): torch.save / torch.load of the
same state dict that bench_checkpoint saved, run with the venv's python3 (torch 2.11).

    ~/.cache/booster/venv/bin/python3 torch_checkpoint.py --ours DIR/bin --checksums ours.json --file OUT.pt --out peer.json

1. Loads our sharded .bin checkpoint (index + shards, with torch.load) and checks every tensor's
   checksum against the ones bench_checkpoint computed before saving (cross-implementation check).
2. Times torch.save(dict, OUT.pt), then os.fsync of the file (our save fsyncs; both are reported).
3. Times torch.load(OUT.pt) (warm page cache) and checks the checksums again.
Writes {"save_s", "save_fsync_s", "load_s"} to --out. Exits non-zero on a checksum mismatch.
"""
import argparse
import collections
import json
import os
import sys
import time

import torch


def checksum(t):
    """Same fingerprint as bench_checkpoint: int64 sum of the 32-bit words, first word, last word."""
    words = t.contiguous().view(torch.int32).reshape(-1)
    return [int(words.sum(dtype=torch.int64)), int(words[0]), int(words[-1])]


def verify(state, expected, what):
    names = [c["name"] for c in expected]
    if list(state.keys()) != names:
        sys.exit(f"torch_checkpoint: {what}: tensor names differ: {list(state.keys())[:4]}... vs {names[:4]}...")
    for c in expected:
        got = checksum(state[c["name"]])
        if got != [c["sum"], c["first"], c["last"]]:
            sys.exit(f"torch_checkpoint: {what}: tensor {c['name']} has checksum {got}, "
                     f"bench_checkpoint saved {[c['sum'], c['first'], c['last']]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True, help="directory of our sharded .bin checkpoint")
    ap.add_argument("--checksums", required=True, help="bench_checkpoint's JSON output")
    ap.add_argument("--file", required=True, help="where torch.save writes")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)

    expected = json.load(open(a.checksums))["checksums"]
    index = json.load(open(os.path.join(a.ours, "pytorch_model.bin.index.json")))
    shards = {}
    for shard in sorted(set(index["weight_map"].values())):
        shards[shard] = torch.load(os.path.join(a.ours, shard))
    state = collections.OrderedDict((c["name"], shards[index["weight_map"][c["name"]]][c["name"]]) for c in expected)
    verify(state, expected, "our .bin checkpoint read by torch.load")

    t0 = time.perf_counter()
    with open(a.file, "wb") as f:
        torch.save(state, f)
        f.flush()
        t_save = time.perf_counter() - t0
        os.fsync(f.fileno())
    t_save_fsync = time.perf_counter() - t0
    del state, shards

    t0 = time.perf_counter()
    loaded = torch.load(a.file)
    t_load = time.perf_counter() - t0
    verify(loaded, expected, "torch.save + torch.load")

    json.dump({"save_s": t_save, "save_fsync_s": t_save_fsync, "load_s": t_load}, open(a.out, "w"))


if __name__ == "__main__":
    main()
