#!/usr/bin/env python3
"""gpu_peer_gpt.py — the PyTorch eager peer of the GPT example on one GPU (scripts/gpu_run.sh, step gpt_peer).

The same training as examples/gpt on one rank, in plain PyTorch eager (no DDP: at world size 1 our
torch_ddp plugin has no gradient reducer either):
  model   examples/gpt/model.cpp: wte + wpe, n_layer pre-LN blocks (ln_1, causal self-attention,
          ln_2, GELU MLP), ln_f, LM head tied to wte (no bias). Attention as model.cpp computes it (no
          scaled_dot_product_attention): c_attn's rows ordered [head, q|k|v, head_dim], scores =
          baddbmm(-inf upper-triangular mask, q, kᵀ, alpha = 1/sqrt(D)), softmax, cast to v's dtype,
          bmm with v. GELU exact or tanh as [train] gelu; dropout ops only when dropout > 0 (as ours).
          Init as model.cpp, in its RNG order from torch.manual_seed(seed): N(0, 0.02) for wte, c_attn,
          c_fc and wpe, N(0, 0.02 / sqrt(2 n_layer)) for both c_proj, biases 0, LayerNorm 1 / 0.
  loss    logits cast to float32 outside autocast, then cross entropy (our bf16 criterion wrapper +
          gpt::lm_loss at tp = 1).
  data    the raw `bible` text (--corpus), parsed as examples/gpt/data.cpp (reference stripped, one
          verse per line, --val_books held out); B random windows of n_ctx + 1 bytes of the training
          text per step, gathered on the host as an int64 [B, T + 1] tensor, x and y copied to the
          device separately with a blocking .to(device) (as main.cpp's sample_batch and train_step).
  optim   AdamW (eps 1e-8), weight decay on tensors of dim >= 2 (matrices and embeddings) only;
          lr, betas, weight_decay, warmup_steps and min_lr_ratio from the config; linear warmup then
          cosine to min_lr_ratio * lr over --max_steps (LambdaLR stepped every step); gradients
          clipped to [booster] max_norm (torch.nn.utils.clip_grad_norm_); mixed_precision = "bf16"
          is torch.autocast(device, bfloat16) around the forward with float32 weights.
  step    as main.cpp's loop: sample, read the group's lr, forward, loss, backward, loss.item(),
          clip, optimizer step, zero_grad, scheduler step; the step's time runs from before the
          sampling to after the scheduler step (no device synchronize beyond the .item() and the
          copies, as ours).
Where it differs, by design (each side's defaults): PyTorch's AdamW picks its foreach implementation
on CUDA (ours: LibTorch's per-parameter loop; --adamw_impl for-loop compares like with like),
clip_grad_norm_ does not read the norm back to the host (ours does, once), zero_grad sets gradients
to None (ours zeroes them), and nn.Embedding / cross_entropy do not check the ids on the host (ours
reads one flag back for each).

Measurement: the run is --warmup_steps + --steps steps; `training tokens/s` = (tokens of the measured
steps) / (sum of their step times), the steps after the first --warmup_steps ones; the example's eval
lines report that same quantity over their eval_interval window, so run.sh compares the peer's
window with the gpt step's last eval window (same step numbers). The rate over all steps (the
example's end-of-run "training tokens/s", warm-up included) is printed beside it.

    python3 scripts/gpu_peer_gpt.py --config examples/configs/gpt_ddp.toml --corpus build/data/kjv.txt \\
        --val_books Ruth --device cuda --warmup_steps 200 --steps 100

Needs torch (2.11); reads the config with tomllib (Python >= 3.11; without it the defaults below,
which are examples/configs/gpt_ddp.toml's). Last line:
    peer: gpt steps 201-300: 123456 training tokens/s (steps 1-300: 98765 tokens/s; ...)
"""
import argparse
import math
import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from gpu_peer_profile import StepProfiler

# examples/configs/gpt_ddp.toml (the [train] and [booster] values the peer uses).
DEFAULTS = {
    "n_layer": 4, "n_head": 4, "n_embd": 256, "n_ctx": 128, "dropout": 0.0, "gelu": "exact",
    "batch_size": 16, "lr": 0.003, "min_lr_ratio": 0.1, "warmup_steps": 100, "weight_decay": 0.1,
    "beta1": 0.9, "beta2": 0.95, "seed": 42, "val_books": "Ruth,Eccl,Dan,Mark,Rom",
    "mixed_precision": "bf16", "max_norm": 1.0,
}
VOCAB = 256
INIT_STD = 0.02


def read_config(path):
    cfg = dict(DEFAULTS)
    if not path:
        return cfg, "built-in defaults (gpt_ddp.toml's)"
    try:
        import tomllib
    except ImportError:
        return cfg, "built-in defaults (no tomllib to read %s)" % path
    with open(path, "rb") as f:
        toml = tomllib.load(f)
    train, booster = toml.get("train", {}), toml.get("booster", {})
    for k in cfg:
        if k in ("mixed_precision", "max_norm"):
            cfg[k] = booster.get(k, cfg[k])
        else:
            cfg[k] = train.get(k, cfg[k])
    if train.get("gradient_accumulation_steps", 1) != 1:
        print("gpu_peer_gpt: note: gradient_accumulation_steps = %s in %s; the peer steps once per batch"
              % (train["gradient_accumulation_steps"], path), file=sys.stderr)
    return cfg, path


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"])
        self.head_dim = c["n_embd"] // c["n_head"]
        self.dropout = c["dropout"]

    def forward(self, x):
        B, T = x.size(0), x.size(1)
        D = self.head_dim
        qkv = self.c_attn(x).view(B, T, -1, 3, D).permute(3, 0, 2, 1, 4)  # [3, B, H, T, D]
        q, k, v = qkv[0], qkv[1], qkv[2]
        H = q.size(1)
        mask = torch.full((T, T), float("-inf"), dtype=q.dtype, device=q.device).triu(1).expand(B * H, T, T)
        att = torch.baddbmm(mask, q.reshape(B * H, T, D), k.reshape(B * H, T, D).transpose(1, 2),
                            beta=1.0, alpha=1.0 / math.sqrt(D)).softmax(-1)
        if self.dropout > 0 and self.training:
            att = F.dropout(att, self.dropout, True)
        y = torch.bmm(att.to(v.dtype), v.reshape(B * H, T, D))
        y = y.view(B, H, T, D).transpose(1, 2).reshape(B, T, -1)
        y = self.c_proj(y)
        if self.dropout > 0 and self.training:
            y = F.dropout(y, self.dropout, True)
        return y


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"])
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"])
        self.dropout = c["dropout"]
        self.approximate = "tanh" if c["gelu"] == "tanh" else "none"

    def forward(self, x):
        y = self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate))
        if self.dropout > 0 and self.training:
            y = F.dropout(y, self.dropout, True)
        return y


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c["n_embd"], eps=1e-5)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c["n_embd"], eps=1e-5)
        self.mlp = MLP(c)

    def forward(self, x):
        h = x + self.attn(self.ln_1(x))
        return h + self.mlp(self.ln_2(h))


class GPT(nn.Module):
    """examples/gpt/model.cpp at tp = 1 (parameter names and order as ours)."""

    def __init__(self, c, seed):
        super().__init__()
        self.c = c
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, c["n_embd"]),
            wpe=nn.Embedding(c["n_ctx"], c["n_embd"]),
            h=nn.ModuleList([Block(c) for _ in range(c["n_layer"])]),
            ln_f=nn.LayerNorm(c["n_embd"], eps=1e-5),
        ))
        self.init_as_ours(seed)

    @torch.no_grad()
    def init_as_ours(self, seed):
        # model.cpp's draws, in its order: wte, then per block c_attn, c_proj, c_fc, c_proj (biases 0),
        # then torch::nn::Embedding's own N(0, 1) init of wpe, then wpe ~ N(0, 0.02).
        torch.manual_seed(seed)
        proj_std = INIT_STD / math.sqrt(2.0 * self.c["n_layer"])
        t = self.transformer
        t.wte.weight.normal_(0.0, INIT_STD)
        for b in t.h:
            for lin, std in ((b.attn.c_attn, INIT_STD), (b.attn.c_proj, proj_std), (b.mlp.c_fc, INIT_STD),
                             (b.mlp.c_proj, proj_std)):
                lin.weight.normal_(0.0, std)
                lin.bias.zero_()
            for ln in (b.ln_1, b.ln_2):
                ln.weight.fill_(1.0)
                ln.bias.zero_()
        t.wpe.weight.normal_(0.0, 1.0)
        t.ln_f.weight.fill_(1.0)
        t.ln_f.bias.zero_()
        t.wpe.weight.normal_(0.0, INIT_STD)

    def forward(self, idx):
        t = self.transformer
        T = idx.size(1)
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = t.wte(idx) + t.wpe(pos)
        if self.c["dropout"] > 0 and self.training:
            x = F.dropout(x, self.c["dropout"], True)
        for block in t.h:
            x = block(x)
        return F.linear(t.ln_f(x), t.wte.weight)  # tied head


def split_kjv(raw, val_books):
    """examples/gpt/data.cpp's split_kjv: (train bytes, val bytes, books)."""
    held = set(val_books)
    train, val, books = [], [], []
    for n, line in enumerate(raw.split(b"\n"), 1):
        if not line:
            continue
        i = 1 if line[:1].isdigit() else 0
        while i < len(line) and line[i:i + 1].isalpha():
            i += 1
        space = line.find(b" ")
        if i == 0 or i >= len(line) or not line[i:i + 1].isdigit() or space < 0 or line.find(b":", i) > space:
            raise ValueError("corpus line %d is not '<book><chapter>:<verse> <text>': %r" % (n, line[:60]))
        book = line[:i].decode()
        if not books or books[-1] != book:
            books.append(book)
        (val if book in held else train).append(line[space + 1:] + b"\n")
    unknown = [b for b in val_books if b not in books]
    if unknown:
        raise ValueError("unknown validation book(s) %s; the books are %s" % (",".join(unknown), ",".join(books)))
    return b"".join(train), b"".join(val), books


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="", help="the example's TOML config (model, optimizer, precision)")
    ap.add_argument("--corpus", required=True, help="raw `bible` output (examples/gpt/data.h)")
    ap.add_argument("--val_books", default=None, help="held-out books (default: the config's)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--warmup_steps", type=int, default=200, help="steps before the measured window")
    ap.add_argument("--steps", type=int, default=100, help="measured steps")
    ap.add_argument("--max_steps", type=int, default=0,
                    help="the LR schedule's horizon (the example's train.max_steps; 0 = warmup_steps + steps)")
    ap.add_argument("--adamw_impl", choices=["default", "for-loop", "foreach", "fused"], default="default",
                    help="torch.optim.AdamW implementation (default: PyTorch's choice, foreach on CUDA)")
    ap.add_argument("--log_interval", type=int, default=50)
    ap.add_argument("--fully_shard", action="store_true",
                    help="FSDP2 at world size 1: fully_shard on every block and the root (a one-rank process "
                         "group, nccl on cuda, gloo on cpu), bf16 parameters with fp32 reduction when the config's "
                         "precision is bf16 (the torch_fsdp peer: gpt_fsdp.toml's [plugin.mixed_precision])")
    a = ap.parse_args()
    if a.warmup_steps < 0 or a.steps < 1:
        ap.error("--warmup_steps must be >= 0 and --steps >= 1")

    c, source = read_config(a.config)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_peer_gpt: --device %s but torch %s sees no CUDA device" % (a.device, torch.__version__),
              file=sys.stderr)
        return 2
    device = torch.device(a.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    bf16 = c["mixed_precision"] == "bf16"
    if c["mixed_precision"] not in ("bf16", "fp32"):
        print("gpu_peer_gpt: mixed_precision %r is not modelled (bf16 or fp32)" % c["mixed_precision"], file=sys.stderr)
        return 2

    with open(a.corpus, "rb") as f:
        raw = f.read()
    val_books = [b for b in (a.val_books if a.val_books is not None else c["val_books"]).replace(" ", "").split(",") if b]
    train_bytes, val_bytes, _ = split_kjv(raw, val_books)
    data = torch.frombuffer(bytearray(train_bytes), dtype=torch.uint8)
    B, T = c["batch_size"], c["n_ctx"]
    total_steps = a.warmup_steps + a.steps
    max_steps = a.max_steps if a.max_steps > 0 else total_steps

    model = GPT(c, c["seed"]).to(device)
    model.train()
    if a.fully_shard:
        import torch.distributed as dist
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1, device_id=device if device.type == "cuda" else None)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 \
            else MixedPrecisionPolicy()
        for block in model.transformer.h:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    impl = {"default": {}, "for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": c["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=1e-8, **impl[a.adamw_impl])
    warm, min_ratio = c["warmup_steps"], c["min_lr_ratio"]
    step_box = [0]

    def schedule(step):  # main.cpp's schedule, progress = step / max_steps (no wall-clock budget)
        if step < warm:
            return (step + 1) / warm
        p = min(max(step_box[0] / max_steps, 0.0), 1.0)
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    rng = random.Random(c["seed"] * 1000003 + 1)  # main.cpp: mt19937_64(seed * 1000003 + rank + 1)
    offsets = torch.arange(T + 1, dtype=torch.long)
    hi = data.size(0) - T - 1

    def sample_batch():  # main.cpp's sample_batch: B windows of T + 1 bytes, int64, on the host
        starts = torch.tensor([rng.randint(0, hi) for _ in range(B)], dtype=torch.long).view(B, 1)
        windows = data[starts + offsets].to(torch.long)
        return windows.narrow(1, 0, T).contiguous(), windows.narrow(1, 1, T).contiguous()

    print("peer: torch %s on %s (%s), gpt %d parameters (%d layers, n_embd %d, %d heads, n_ctx %d, gelu %s), "
          "batch %d x %d = %d tokens per step, %s, AdamW %s lr %g betas (%g, %g) wd %g, max_norm %g; "
          "train %d bytes, validation %d bytes (%s); config: %s; %d warm-up + %d measured steps" %
          (torch.__version__, device, name, n_params, c["n_layer"], c["n_embd"], c["n_head"], T, c["gelu"], B, T,
           B * T, ("bf16 autocast" if bf16 else "fp32") + (", fully_shard" if a.fully_shard else ""), a.adamw_impl, c["lr"], c["beta1"], c["beta2"],
           c["weight_decay"], c["max_norm"], len(train_bytes), len(val_bytes), ",".join(val_books), source,
           a.warmup_steps, a.steps), flush=True)

    params = list(model.parameters())
    tokens_per_step = B * T
    all_s = window_s = 0.0
    loss_v = float("nan")
    profiler = StepProfiler()  # BOOSTER_EXAMPLE_PROFILE (gpu_peer_profile.py)
    for step in range(total_steps):
        step_box[0] = step
        profiler.begin_step(step + 1)
        t0 = time.perf_counter()
        x, y = sample_batch()
        lr = opt.param_groups[0]["lr"]
        x, y = x.to(device), y.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        loss_v = loss.item()
        if c["max_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(params, c["max_norm"])
        opt.step()
        opt.zero_grad()
        sched.step()
        dt = time.perf_counter() - t0
        profiler.end_step(step + 1)
        all_s += dt
        if step >= a.warmup_steps:
            window_s += dt
        n = step + 1
        if n == 1 or n % a.log_interval == 0:
            print("step %d  loss %.4f (%.3f bpb)  lr %.6f  %.0f tokens/s" %
                  (n, loss_v, loss_v / math.log(2.0), lr, tokens_per_step / dt), flush=True)
    win = a.steps * tokens_per_step / max(window_s, 1e-9)
    every = total_steps * tokens_per_step / max(all_s, 1e-9)
    print("peer: gpt steps %d-%d: %.0f training tokens/s (steps 1-%d: %.0f tokens/s; %d tokens per step; "
          "last loss %.4f; %s)" % (a.warmup_steps + 1, total_steps, win, total_steps, every, tokens_per_step, loss_v,
                                   name), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
