"""dtensor_tp_peer.py -- the PyTorch peer of the tensor-parallel benchmark (tp_peer): one rank of
the same GPT blocks as benchmarks/bench_tp_peer.cpp, made tensor-parallel with PyTorch's DTensor
(`parallelize_module` over a 1-D DeviceMesh("cpu", [0, ..., W-1]): ColwiseParallel on attn.c_attn
and mlp.c_fc, RowwiseParallel on attn.c_proj and mlp.c_proj), Gloo on 127.0.0.1, one intra-op thread.

    python3 dtensor_tp_peer.py --rank R --world_size W --port P --layers L --embd C --heads H
        --init DIR --data FILE --steps S --lr LR --weight_decay WD [--save DIR] [--first_out FILE]
        [--foreach 0|1] --warmup N --iters N --out PREFIX

The arguments and the files mean what they mean for bench_tp_peer (see its header): the full weights
come from DIR/model.safetensors (each rank loads them into the dense model before parallelize_module
shards them); after the S steps on x.<s>, y.<s> rank 0 writes the gathered weights (full_tensor())
to DIR/model.safetensors; PREFIX.rank<r>.json gets the losses and the per-iteration seconds.
torch.optim.AdamW (betas 0.9, 0.95; eps 1e-8): with --foreach 1 the multi-tensor implementation over
two parameter groups, the DTensors and the plain tensors (one foreach call cannot mix them: "got
mixed torch.Tensor and DTensor"); with --foreach 0 (default) PyTorch's default for CPU tensors, the
per-parameter loop.

Also a module: read_safetensors / write_safetensors (float32 and the common dtypes, the format the
SDK's checkpoints use) for the driver (benchmarks/drivers/tp_peer.py).
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch

_DTYPES = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16, "F16": torch.float16,
           "I64": torch.int64, "I32": torch.int32}


def write_safetensors(path, tensors):
    """tensors: dict name -> CPU tensor (written C-order, little-endian), header padded to 8 bytes."""
    names = {v: k for k, v in _DTYPES.items()}
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        blob = t.view(torch.uint8).reshape(-1).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def read_safetensors(path):
    """dict name -> tensor (owning, CPU), in the file's order."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        begin, end = e["data_offsets"]
        data = bytearray(raw[8 + n + begin:8 + n + end])
        t = torch.frombuffer(data, dtype=_DTYPES[e["dtype"]]) if data else torch.empty(0, dtype=_DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"])
    return out


class Attention(torch.nn.Module):
    """Causal self-attention with the ops of bench_tp_peer's (c_attn output ordered [head, q|k|v, D])."""

    def __init__(self, embd, heads):
        super().__init__()
        self.c_attn = torch.nn.Linear(embd, 3 * embd)
        self.c_proj = torch.nn.Linear(embd, embd)
        self.head_dim = embd // heads

    def forward(self, x):
        B, T, D = x.size(0), x.size(1), self.head_dim
        qkv = self.c_attn(x).view(B, T, -1, 3, D).permute(3, 0, 2, 1, 4)  # [3, B, H/tp, T, D]
        q, k, v = qkv[0], qkv[1], qkv[2]
        H = q.size(1)
        mask = torch.full((T, T), -math.inf, dtype=q.dtype).triu(1).expand(B * H, T, T)
        att = torch.baddbmm(mask, q.reshape(B * H, T, D), k.reshape(B * H, T, D).transpose(1, 2),
                            beta=1.0, alpha=1.0 / math.sqrt(D)).softmax(-1)
        y = torch.bmm(att, v.reshape(B * H, T, D))
        return self.c_proj(y.view(B, H, T, D).transpose(1, 2).reshape(B, T, -1))


class MLP(torch.nn.Module):
    def __init__(self, embd):
        super().__init__()
        self.c_fc = torch.nn.Linear(embd, 4 * embd)
        self.c_proj = torch.nn.Linear(4 * embd, embd)

    def forward(self, x):
        return self.c_proj(torch.nn.functional.gelu(self.c_fc(x)))


class Block(torch.nn.Module):
    def __init__(self, embd, heads):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(embd)
        self.attn = Attention(embd, heads)
        self.ln_2 = torch.nn.LayerNorm(embd)
        self.mlp = MLP(embd)

    def forward(self, x):
        h = x + self.attn(self.ln_1(x))
        return h + self.mlp(self.ln_2(h))


class Stack(torch.nn.Module):
    """Parameter names h.<i>.ln_1.weight, h.<i>.attn.c_attn.weight, ... (bench_tp_peer's)."""

    def __init__(self, layers, embd, heads):
        super().__init__()
        self.h = torch.nn.ModuleList([Block(embd, heads) for _ in range(layers)])

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return x


def tp_plan(layers):
    """Megatron's split: the first linear of each pair by output columns, the second by input rows."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    plan = {}
    for i in range(layers):
        plan[f"h.{i}.attn.c_attn"] = ColwiseParallel()
        plan[f"h.{i}.attn.c_proj"] = RowwiseParallel()
        plan[f"h.{i}.mlp.c_fc"] = ColwiseParallel()
        plan[f"h.{i}.mlp.c_proj"] = RowwiseParallel()
    return plan


def main():
    ap = argparse.ArgumentParser()
    for key, default in (("rank", 0), ("world_size", 2), ("port", 29500), ("layers", 2), ("embd", 64), ("heads", 4),
                         ("steps", 3), ("warmup", 1), ("iters", 5)):
        ap.add_argument("--" + key, type=int, default=default)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight_decay", type=float, default=0.01)
    ap.add_argument("--init", default="init")
    ap.add_argument("--data", default="data.safetensors")
    ap.add_argument("--save", default=None)
    ap.add_argument("--first_out", default=None)
    ap.add_argument("--foreach", type=int, default=0)
    ap.add_argument("--out", default="dtensor_tp_peer")
    a = ap.parse_args()

    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank, world_size=a.world_size)
    mesh = DeviceMesh("cpu", list(range(a.world_size)))
    torch.manual_seed(0)  # the initial values are replaced by --init below
    model = Stack(a.layers, a.embd, a.heads)
    model.load_state_dict(read_safetensors(os.path.join(a.init, "model.safetensors")), strict=True)
    parallelize_module(model, mesh, tp_plan(a.layers))
    hparams = dict(lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=a.weight_decay)
    if a.foreach:
        groups = [[p for p in model.parameters() if isinstance(p, DTensor)],
                  [p for p in model.parameters() if not isinstance(p, DTensor)]]
        opt = torch.optim.AdamW([{"params": g} for g in groups if g], foreach=True, **hparams)
    else:
        opt = torch.optim.AdamW(model.parameters(), **hparams)
    data = read_safetensors(a.data)

    losses, fwd, bwd, step, it = [], [], [], [], []
    for i in range(a.steps + a.warmup + a.iters):
        s = i if i < a.steps else 0
        x, y = data[f"x.{s}"], data[f"y.{s}"]
        t0 = time.perf_counter()
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad()
        t3 = time.perf_counter()
        if i == 0 and a.first_out and a.rank == 0:
            write_safetensors(a.first_out, {"out": out})
        if i < a.steps:
            losses.append(loss.item())
        if i + 1 == a.steps and a.save:
            full = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach() for n, p in model.named_parameters()}
            if a.rank == 0:
                os.makedirs(a.save, exist_ok=True)
                write_safetensors(os.path.join(a.save, "model.safetensors"), full)
        if i >= a.steps + a.warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            step.append(t3 - t2)
            it.append(t3 - t0)
    with open(f"{a.out}.rank{a.rank}.json", "w") as f:
        json.dump({"rank": a.rank, "threads": torch.get_num_threads(), "losses": losses, "forward_s": fwd,
                   "backward_s": bwd, "step_s": step, "iter_s": it,
                   "dtensor_params": sum(isinstance(p, DTensor) for p in model.parameters())}, f)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
