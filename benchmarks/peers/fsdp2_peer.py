"""fsdp2_peer.py -- the PyTorch side of the FSDP-vs-FSDP2 benchmark (benchmarks/drivers/fsdp2_peer.py).

One rank of PyTorch's FSDP2 (torch.distributed.fsdp.fully_shard) on CPU with Gloo, training the
same MLP as benchmarks/bench_fsdp_peer.cpp from the same files with the same steps:

    python3 fsdp2_peer.py --rank R --world_size W --port P --dims 784,2048,2048,10 --init FILE --data FILE
                          [--host 127.0.0.1 --threads 1 --warmup 2 --steps 8 --lr 1e-3
                           --weight_decay 0.01 --save_dir DIR]

Model: nn.Sequential of nn.Linear(dims[i], dims[i+1]) with nn.ReLU between consecutive Linears
(parameter names "0.weight", "0.bias", "2.weight", ...), weights copied from --init (a torch.save
state dict), then fully_shard on each Linear (one shard unit each, reshard_after_forward=True: the
FULL_SHARD equivalent) and on the root, on a 1-D CPU device mesh of the W ranks. AdamW (PyTorch's
defaults but lr and weight_decay) with LibTorch's arithmetic (LibTorchAdamW below: the C++ side
steps torch::optim::AdamW, whose moment update is mul_ + add_ where torch.optim.AdamW's is lerp_;
the one-rounding difference grows to ~3e-4 in the loss by step 12 of this model, so the two sides
must do the same arithmetic to be compared element for element) over the sharded parameters, cross-entropy loss, gradients
averaged over the ranks by FSDP2's reduce-scatter. --data: torch.save of {"x": float32 [nbatches,
W * batch, dims[0]], "y": int64 [nbatches, W * batch]}; step s on rank r trains rows
[r * batch, (r + 1) * batch) of batch s % nbatches.

Prints one line per rank: FSDP_PEER {JSON} with the same fields as bench_fsdp_peer ("impl":
"fsdp2"; all_gathers / reduce_scatters / max_gathered_bytes are absent: FSDP2 keeps no such counts).
A step's time runs from the start of its forward to the end of zero_grad; the timed steps start
after a barrier that follows the warmup. --save_dir: after the steps, rank 0 writes the full
(gathered) model to DIR/pytorch_model.bin with torch.save.

`--prepare DIR --dims ... --world_size W --batch B --nbatches K --seed S` (no process group) writes
the inputs both sides read: DIR/init.bin (Linear weights and biases ~ U(-1/sqrt(fan_in),
1/sqrt(fan_in)), nn.Linear's own initialisation, from torch.manual_seed(S)) and DIR/data.bin (x ~ N(0, 1),
y uniform over the dims[-1] classes, from seed S + 1).
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class LibTorchAdamW(torch.optim.Optimizer):
    """AdamW with torch::optim::AdamW's operation order (LibTorch 2.11, amsgrad off): decoupled decay
    p *= 1 - lr * wd; m = m * beta1 + g * (1 - beta1); v = v * beta2 + g * g * (1 - beta2);
    p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps). Works on DTensor parameters
    (every op is elementwise)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                p.mul_(1 - lr * wd)
                state["exp_avg"].mul_(beta1).add_(p.grad, alpha=1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                bias_correction1 = 1 - beta1 ** state["step"]
                bias_correction2 = 1 - beta2 ** state["step"]
                denom = (state["exp_avg_sq"].sqrt() / math.sqrt(bias_correction2)).add_(eps)
                p.addcdiv_(state["exp_avg"], denom, value=-lr / bias_correction1)


def build(dims):
    layers = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def prepare(a, dims):
    """Writes init.bin and data.bin into a.prepare (see the module docstring)."""
    os.makedirs(a.prepare, exist_ok=True)
    torch.manual_seed(a.seed)
    model = build(dims)
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()},
               os.path.join(a.prepare, "init.bin"))
    torch.manual_seed(a.seed + 1)
    rows = a.world_size * a.batch
    x = torch.randn(a.nbatches, rows, dims[0])
    y = torch.randint(0, dims[-1], (a.nbatches, rows), dtype=torch.int64)
    torch.save({"x": x, "y": y}, os.path.join(a.prepare, "data.bin"))


def train(a, dims):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method="tcp://%s:%d" % (a.host, a.port),
                            rank=a.rank, world_size=a.world_size)
    rank, ws = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (ws,))

    model = build(dims)
    init = torch.load(a.init, map_location="cpu", weights_only=True)
    model.load_state_dict(init, strict=True)
    data = torch.load(a.data, map_location="cpu", weights_only=True)
    x, y = data["x"], data["y"]
    if x.size(1) % ws:
        raise SystemExit("fsdp2_peer: x.size(1) %d is not a multiple of the world size %d" % (x.size(1), ws))
    nbatches, batch = x.size(0), x.size(1) // ws
    numel = sum(p.numel() for p in model.parameters())

    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = LibTorchAdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)

    losses, d_step, d_fwd, d_bwd, d_opt = [], [], [], [], []
    faults0 = 0
    for s in range(a.warmup + a.steps):
        if s == a.warmup:
            dist.barrier()
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        b = s % nbatches
        xb, yb = x[b, rank * batch:(rank + 1) * batch], y[b, rank * batch:(rank + 1) * batch]
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(xb), yb)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad()
        t3 = time.perf_counter()
        losses.append(loss.item())
        if s >= a.warmup:
            d_step.append(1000 * (t3 - t0))
            d_fwd.append(1000 * (t1 - t0))
            d_bwd.append(1000 * (t2 - t1))
            d_opt.append(1000 * (t3 - t2))
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / max(a.steps, 1)

    if a.save_dir:
        # full_tensor() is a collective: every rank gathers, rank 0 writes.
        full = {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}
        if rank == 0:
            os.makedirs(a.save_dir, exist_ok=True)
            torch.save(full, os.path.join(a.save_dir, "pytorch_model.bin"))
    dist.barrier()
    out = {"impl": "fsdp2", "rank": rank, "world_size": ws, "batch": batch, "params": numel,
           "warmup": a.warmup, "steps": a.steps, "losses": losses, "step_ms": d_step, "fwd_ms": d_fwd,
           "bwd_ms": d_bwd, "opt_ms": d_opt, "minor_faults_per_step": faults,
           "threads": torch.get_num_threads(), "torch": torch.__version__}
    print("FSDP_PEER " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world_size", type=int, default=1)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=29500)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dims", default="784,2048,2048,10")
    ap.add_argument("--init", default="")
    ap.add_argument("--data", default="")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight_decay", type=float, default=0.01)
    ap.add_argument("--save_dir", default="")
    ap.add_argument("--prepare", default="")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--nbatches", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    dims = [int(d) for d in a.dims.split(",") if d]
    if len(dims) < 2:
        raise SystemExit("fsdp2_peer: --dims needs at least two sizes")
    if a.prepare:
        prepare(a, dims)
    else:
        if not a.init or not a.data:
            raise SystemExit("fsdp2_peer: --init and --data are required")
        train(a, dims)


if __name__ == "__main__":
    sys.exit(main())
