#!/usr/bin/env python3
"""ddp_peer.py — the PyTorch side of the DDP throughput benchmark (issue 6, benchmark 1).

One rank of torch.nn.parallel.DistributedDataParallel on Gloo with the same model, initial weights,
synthetic data, optimizer and steps as benchmarks/bench_ddp.cpp, printing the same JSON line from
rank 0. Run with the venv's torch 2.11 (~/.cache/booster/venv/bin/python3), one process per rank:

    ~/.cache/booster/venv/bin/python3 benchmarks/ddp_peer.py --model mlp --rank 0 --world_size 2 --port 29611 &
    ~/.cache/booster/venv/bin/python3 benchmarks/ddp_peer.py --model mlp --rank 1 --world_size 2 --port 29611

--compare FILE (rank 0): FILE holds bench_ddp's final parameters (--dump_params: raw float32 in
registration order); the JSON line then carries the largest absolute difference to ours.
samples_per_s is world_size * batch / the median step time on rank 0 (as bench_ddp.cpp).
"""
import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Cnn(nn.Module):
    """examples/fashion_mnist's net, dropout p = 0."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.dropout = nn.Dropout(0.0)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        h = F.max_pool2d(F.relu(self.bn2(self.conv2(h))), 2)
        h = self.dropout(F.relu(self.fc1(h.flatten(1))))
        return self.fc2(h)


class Mlp(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(784, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, 10)

    def forward(self, x):
        h = F.relu(self.fc1(x.flatten(1)))
        h = F.relu(self.fc2(h))
        return self.fc3(h)


def init_parameters(model, seed):
    """As bench_ddp.cpp: matrices ~ N(0, 2/fan_in) in registration order, 1-D weights 1, biases 0."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = p.numel() // p.size(0)
                p.copy_(torch.randn(p.shape) * math.sqrt(2.0 / fan_in))
            elif name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.zero_()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world_size", type=int, default=1)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=29500)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--nbatches", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--bucket_cap_mb", type=float, default=25.0)
    ap.add_argument("--compare", default="")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method="tcp://%s:%d" % (a.host, a.port),
                            rank=a.rank, world_size=a.world_size)
    rank, ws = dist.get_rank(), dist.get_world_size()

    net = Cnn() if a.model == "cnn" else Mlp(a.hidden)
    init_parameters(net, a.seed)
    torch.manual_seed(a.seed + 1)
    pool = a.nbatches * ws * a.batch
    x = torch.randn(pool, 1, 28, 28) if a.model == "cnn" else torch.randn(pool, 784)
    y = torch.randint(0, 10, (pool,), dtype=torch.int64)

    model = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=a.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)

    d_total, d_fwd, d_bwd, d_step = [], [], [], []
    t0 = 0.0
    last_loss = 0.0
    for s in range(a.warmup + a.steps):
        if s == a.warmup:
            dist.barrier()
            t0 = time.perf_counter()
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = ((s % a.nbatches) * ws + rank) * a.batch
        xb, yb = x[start:start + a.batch], y[start:start + a.batch]
        ta = time.perf_counter()
        loss = F.cross_entropy(model(xb), yb)
        tb = time.perf_counter()
        loss.backward()
        tc = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=False)
        td = time.perf_counter()
        last_loss = loss.item()
        if s >= a.warmup:
            d_total.append(time.perf_counter() - ta)
            d_fwd.append(tb - ta)
            d_bwd.append(tc - tb)
            d_step.append(td - tc)
    elapsed = time.perf_counter() - t0
    faults_per_step = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / a.steps

    params = [p.detach() for p in net.parameters()]
    with torch.no_grad():
        checksum = sum(p.double().sum().item() for p in params)
        abs_checksum = sum(p.double().abs().sum().item() for p in params)
    out = {"impl": "pytorch", "model": a.model, "mode": "ddp", "world_size": ws, "batch": a.batch,
           "steps": a.steps, "params": sum(p.numel() for p in params),
           "samples_per_s": a.batch * ws / statistics.median(d_total),
           "samples_per_s_mean": a.steps * a.batch * ws / elapsed, "elapsed_s": elapsed,
           "step_total_ms": 1000 * statistics.median(d_total),
           "final_loss": last_loss, "param_checksum": checksum, "param_abs_checksum": abs_checksum,
           "fwd_ms": 1000 * statistics.median(d_fwd), "bwd_ms": 1000 * statistics.median(d_bwd),
           "step_ms": 1000 * statistics.median(d_step),
           "minor_faults_per_step": faults_per_step, "threads": torch.get_num_threads()}
    if rank == 0 and a.compare:
        with open(a.compare, "rb") as f:
            theirs = torch.frombuffer(bytearray(f.read()), dtype=torch.float32)
        mine = torch.cat([p.reshape(-1) for p in params])
        if theirs.numel() != mine.numel():
            out["max_abs_diff"] = float("inf")
        else:
            out["max_abs_diff"] = (theirs - mine).abs().max().item()
            out["max_abs_param"] = mine.abs().max().item()
    dist.barrier()
    if rank == 0:
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
