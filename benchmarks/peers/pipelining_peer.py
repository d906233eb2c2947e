"""pipelining_peer.py -- the Python peer of the pipelining_peer benchmark: torch.distributed.pipelining
(PipelineStage from manually split stage modules, ScheduleGPipe / Schedule1F1B /
ScheduleInterleaved1F1B / ScheduleZBVZeroBubble) training the model of bench_pipeline, run with the venv's python3 (torch 2.11).

    python3 pipelining_peer.py init --out F --layers L --dim D --batch B [--seed S]
    python3 pipelining_peer.py rank --rank R --world_size P --port PORT --cases STYLE:V:M[,...]
        --layers L --dim D --batch B --init_file F --iters N --warmup W --out PREFIX[,...] [--dump]
        [--check_against OURS_PREFIX[,...] --check_out FILE] [--atol A --rtol R]
    python3 pipelining_peer.py compare --ours PREFIX --peer PREFIX --world_size P [--atol A --rtol R]

init: writes the shared start point, raw little-endian float32: every parameter of the stack in
registration order (h.0.fc.weight, h.0.fc.bias, h.0.proj.weight, h.0.proj.bias, h.1...), then the
inputs and then the targets ([batch, dim] each). bench_pipeline --init_file reads the same file.

rank: one rank of a P-rank job (Gloo on 127.0.0.1, one intra-op thread) that runs the cases one
after the other, each from the init file (STYLE 1f1b, gpipe, interleaved or zbv; V model chunks per
rank, used by interleaved and zbv (2) only; M micro-batches; one --out prefix per case). The L blocks
are split into P * V contiguous stages exactly as the hybrid_parallel plugin's uniform partition does
(sizes differ by at most one, the larger first); rank r holds virtual stages r, r + P, ..., under zbv
the V: r and 2 P - 1 - r (torch's "v" stage-to-rank mapping, the plugin's). Each iteration is
schedule.step on the whole batch (MSE loss, mean over each micro-batch; gradients scaled by 1/M, so
they are those of the mean of the micro-batch losses, as ours), then SGD (lr 1e-3) step and
zero_grad. Writes PREFIX.rank<r>.json in bench_pipeline's format: call_s (wall time of each timed
schedule.step), compute_s (the time inside it spent in the stages' forward_one_chunk,
backward_one_chunk and backward_weight_one_chunk calls), losses (each iteration's mean micro-batch loss, on the rank holding the last stage),
dump_names, torch (its version); with --dump also PREFIX.rank<r>.bin: the first iteration's
gradients (before the optimizer step) of the parameters this rank holds, raw float32 in registration
order. With --check_against (ours' prefixes, one per case, dumped before this job), rank 0 finally
writes to --check_out a JSON list with compare's object for each case.

compare: reads both sides' JSON and dumps of every rank and prints one JSON object: per rank the
parameter names must be the same on both sides; max_abs_diff / max_abs_ref over every gradient
element, worst = max |ours - peer| / (atol + rtol |peer|) (<= 1 passes), and the same for the losses
of the iterations both sides recorded; ok, and problems (why not ok). The peer is the reference.
Exit code 0 even when it fails: the caller decides (the driver raises).
"""
import argparse
import ctypes
import json
import os
import sys
import time


def partition(n, stages):
    """[begin, end) of each of `stages` contiguous runs of n layers (uniform: larger runs first)."""
    base, extra = divmod(n, stages)
    out, at = [], 0
    for s in range(stages):
        size = base + (1 if s < extra else 0)
        out.append((at, at + size))
        at += size
    return out


def build_model(torch, layers, dim):
    """bench_pipeline's stack: `layers` blocks x + proj(gelu(fc(x))) with fc = Linear(dim, 4 dim) and
    proj = Linear(4 dim, dim), registered as h.<i>.fc and h.<i>.proj (ours' names and order)."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(dim, 4 * dim)
            self.proj = nn.Linear(4 * dim, dim)

        def forward(self, x):
            return x + self.proj(torch.nn.functional.gelu(self.fc(x)))

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.h = nn.ModuleList([Block() for _ in range(layers)])

    return Stack()


def to_bytes(t):
    """t's elements as native float32 bytes."""
    t = t.detach().float().contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel() * 4)


def read_floats(torch, path):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    return torch.frombuffer(data, dtype=torch.float32) if data else torch.empty(0)


def cmd_init(a):
    import torch
    torch.manual_seed(a.seed)
    model = build_model(torch, a.layers, a.dim)
    x, y = torch.randn(a.batch, a.dim), torch.randn(a.batch, a.dim)
    with open(a.out, "wb") as f:
        for p in model.parameters():
            f.write(to_bytes(p))
        f.write(to_bytes(x))
        f.write(to_bytes(y))


def load_init(torch, path, model, batch, dim):
    flat = read_floats(torch, path)
    want = sum(p.numel() for p in model.parameters()) + 2 * batch * dim
    if flat.numel() != want:
        sys.exit(f"pipelining_peer: {path}: {flat.numel()} floats, expected {want}")
    at = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(flat[at:at + p.numel()].view_as(p))
            at += p.numel()
    x = flat[at:at + batch * dim].view(batch, dim).clone()
    y = flat[at + batch * dim:at + 2 * batch * dim].view(batch, dim).clone()
    return x, y


def run_case(torch, dist, a, style, chunks, m, out, dump):
    """One case (schedule style, chunks per rank, micro-batches) from the init file; writes out.rank<r>.json."""
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                              ScheduleZBVZeroBubble)

    pp = a.world_size
    chunks = chunks if style in ("interleaved", "zbv") else 1
    model = build_model(torch, a.layers, a.dim)
    x, y = load_init(torch, a.init_file, model, a.batch, a.dim)
    num_stages = pp * chunks
    ranges = partition(a.layers, num_stages)

    class StageModule(torch.nn.Module):
        """Blocks [begin, end) of the stack (the same module objects: parameters shared)."""

        def __init__(self, begin, end):
            super().__init__()
            self.blocks = torch.nn.ModuleList([model.h[i] for i in range(begin, end)])

        def forward(self, t):
            for b in self.blocks:
                t = b(t)
            return t

    local = [a.rank, 2 * pp - 1 - a.rank] if style == "zbv" else [c * pp + a.rank for c in range(chunks)]
    modules = [StageModule(*ranges[v]) for v in local]
    stages = [PipelineStage(mod, v, num_stages, torch.device("cpu")) for mod, v in zip(modules, local)]
    loss_fn = torch.nn.functional.mse_loss
    if style == "1f1b":
        schedule = Schedule1F1B(stages[0], m, loss_fn=loss_fn)
    elif style == "gpipe":
        schedule = ScheduleGPipe(stages[0], m, loss_fn=loss_fn)
    elif style == "interleaved":
        schedule = ScheduleInterleaved1F1B(stages, m, loss_fn=loss_fn)
    elif style == "zbv":
        schedule = ScheduleZBVZeroBubble(stages, m, loss_fn=loss_fn)
        # torch 2.11's first batched P2P (connecting the neighbours) includes a send and a receive to
        # this rank itself for the V's two stages on rank P - 1, which Gloo cannot do ("Pair is not
        # connected"); the schedule itself hands those tensors over in memory. Drop the self pair.
        for st in stages:
            def neighbours(orig=st._get_init_p2p_neighbors_ops):
                return [op for op in orig() if op.group_peer != a.rank]
            st._get_init_p2p_neighbors_ops = neighbours
    else:
        sys.exit(f"pipelining_peer: unknown style {style}")
    # Compute time inside step: the stages' forward_one_chunk / backward_one_chunk calls (each with
    # its own bookkeeping), what the schedules call for every micro-batch.
    compute = [0.0]

    def timed(fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                compute[0] += time.perf_counter() - t0
        return wrapper

    for st in stages:
        st.forward_one_chunk = timed(st.forward_one_chunk)
        st.backward_one_chunk = timed(st.backward_one_chunk)
        st.backward_weight_one_chunk = timed(st.backward_weight_one_chunk)
    held = {id(p) for mod in modules for p in mod.parameters()}
    opt = torch.optim.SGD([p for mod in modules for p in mod.parameters()], lr=1e-3)
    has_first, has_last = 0 in local, num_stages - 1 in local
    call, computes, losses, dump_names = [], [], [], []
    for i in range(a.warmup + a.iters):
        mb_losses = []
        compute[0] = 0.0
        args = (x,) if has_first else ()
        target = y if has_last else None
        t0 = time.perf_counter()
        schedule.step(*args, target=target, losses=mb_losses, return_outputs=False)
        t1 = time.perf_counter()
        if has_last:
            losses.append(float(torch.stack([l.detach() for l in mb_losses]).float().mean()))
        if i == 0 and dump:
            with open(f"{out}.rank{a.rank}.bin", "wb") as f:
                for name, p in model.named_parameters():
                    if id(p) not in held:
                        continue
                    if p.grad is None:
                        sys.exit(f"pipelining_peer: no gradient for {name}")
                    f.write(to_bytes(p.grad))
                    dump_names.append(name)
        opt.step()
        opt.zero_grad()
        if i >= a.warmup:
            call.append(t1 - t0)
            computes.append(compute[0])
    with open(f"{out}.rank{a.rank}.json", "w") as f:
        json.dump({"rank": a.rank, "pp": pp, "microbatches": m, "chunks": chunks, "style": style,
                   "call_s": call, "compute_s": computes, "losses": losses, "dump_names": dump_names,
                   "torch": torch.__version__}, f)
    dist.barrier()  # the next case's messages must not meet this one's


def cmd_rank(a):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    cases = [c.split(":") for c in a.cases.split(",")]
    outs = a.out.split(",")
    if len(outs) != len(cases) or any(len(c) != 3 for c in cases):
        sys.exit("pipelining_peer: --cases style:chunks:m,... and --out need one entry per case")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank, world_size=a.world_size)
    for (style, chunks, m), out in zip(cases, outs):
        run_case(torch, dist, a, style, int(chunks), int(m), out, a.dump)
    if a.check_against and a.rank == 0:
        ours = a.check_against.split(",")
        if len(ours) != len(outs):
            sys.exit("pipelining_peer: --check_against needs one prefix per case")
        with open(a.check_out, "w") as f:
            json.dump([compare(torch, o, p, a.world_size, a.atol, a.rtol) for o, p in zip(ours, outs)], f)
    dist.barrier()
    dist.destroy_process_group()


def compare(torch, ours_prefix, peer_prefix, world_size, atol, rtol):
    """Ours' JSON and dumps against the peer's (the reference), every rank: see the module docstring."""
    result = {"max_abs_diff": 0.0, "max_abs_ref": 0.0, "worst": 0.0, "elements": 0, "tensors": 0,
              "loss_max_abs_diff": 0.0, "loss_worst": 0.0, "losses_compared": 0, "ok": True, "problems": []}
    tol = lambda ref: atol + rtol * ref.abs()  # noqa: E731

    for r in range(world_size):
        with open(f"{ours_prefix}.rank{r}.json") as f:
            ours = json.load(f)
        with open(f"{peer_prefix}.rank{r}.json") as f:
            peer = json.load(f)
        if ours["dump_names"] != peer["dump_names"]:
            result["problems"].append(f"rank {r}: parameter names differ: {ours['dump_names'][:3]} vs "
                                      f"{peer['dump_names'][:3]}")
            continue
        if not ours["dump_names"]:
            result["problems"].append(f"rank {r}: no gradients dumped")
            continue
        go = read_floats(torch, f"{ours_prefix}.rank{r}.bin")
        gp = read_floats(torch, f"{peer_prefix}.rank{r}.bin")
        if go.numel() != gp.numel():
            result["problems"].append(f"rank {r}: {go.numel()} gradient elements vs {gp.numel()}")
            continue
        diff = (go - gp).abs()
        result["max_abs_diff"] = max(result["max_abs_diff"], float(diff.max()))
        result["max_abs_ref"] = max(result["max_abs_ref"], float(gp.abs().max()))
        result["worst"] = max(result["worst"], float((diff / tol(gp)).max()))
        result["elements"] += gp.numel()
        result["tensors"] += len(peer["dump_names"])
        lo = torch.tensor(ours["losses"], dtype=torch.float64)
        lp = torch.tensor(peer["losses"], dtype=torch.float64)
        if lo.numel() != lp.numel():
            result["problems"].append(f"rank {r}: {lo.numel()} losses vs {lp.numel()}")
        elif lp.numel():
            d = (lo - lp).abs()
            result["loss_max_abs_diff"] = max(result["loss_max_abs_diff"], float(d.max()))
            result["loss_worst"] = max(result["loss_worst"], float((d / tol(lp)).max()))
            result["losses_compared"] += lp.numel()
    if result["losses_compared"] < 2:
        result["problems"].append(f"only {result['losses_compared']} iteration losses to compare (need 2)")
    if result["worst"] > 1 or result["loss_worst"] > 1:
        result["problems"].append("outside the tolerance")
    result["ok"] = not result["problems"]
    return result


def cmd_compare(a):
    import torch
    print(json.dumps(compare(torch, a.ours, a.peer, a.world_size, a.atol, a.rtol)))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("init")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=1)
    for name in ("layers", "dim", "batch"):
        p.add_argument(f"--{name}", type=int, required=True)
    p = sub.add_parser("rank")
    for name in ("rank", "world_size", "port", "layers", "dim", "batch", "iters", "warmup"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--cases", required=True, help="style:chunks:microbatches,...")
    p.add_argument("--init_file", required=True)
    p.add_argument("--out", required=True, help="one prefix per case, comma-separated")
    p.add_argument("--dump", action="store_true")
    p.add_argument("--check_against", default="", help="ours' prefixes, one per case")
    p.add_argument("--check_out", default="")
    p = sub.add_parser("compare")
    p.add_argument("--ours", required=True)
    p.add_argument("--peer", required=True)
    p.add_argument("--world_size", type=int, required=True)
    for q in (sub.choices["rank"], p):
        q.add_argument("--atol", type=float, default=1e-5)
        q.add_argument("--rtol", type=float, default=1e-4)
    a = ap.parse_args()
    {"init": cmd_init, "rank": cmd_rank, "compare": cmd_compare}[a.cmd](a)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
