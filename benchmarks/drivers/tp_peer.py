"""tp_peer -- tensor parallelism: the hybrid_parallel plugin (tp = 2) against PyTorch's DTensor.

Both sides train the same stack of GPT-2 blocks (pre-LayerNorm; causal self-attention, c_attn
C -> 3C and c_proj C -> C; MLP c_fc C -> 4C, exact GELU, c_proj 4C -> C; no embedding or head,
loss = mean squared error against a random target) split Megatron's way over 2 ranks: c_attn and
c_fc by output columns, both c_proj by input rows, so each rank holds half the heads and half the
MLP, and each block does one allreduce of its activations after each c_proj in forward and one of
the input gradient at each c_attn / c_fc input in backward.
  ours: benchmarks/bench_tp_peer.cpp -- booster::nn::ColumnParallelLinear / RowParallelLinear under
        hybrid_parallel (tp_size 2, dp = pp = 1, fp32), torch::optim::AdamW;
  peer: benchmarks/peers/dtensor_tp_peer.py -- torch 2.11's parallelize_module with ColwiseParallel /
        RowwiseParallel over DeviceMesh("cpu", [0, 1]), torch.optim.AdamW in its faster multi-tensor
        form (foreach over two parameter groups, DTensors and plain tensors); outside smoke mode also
        with AdamW's CPU default, the per-parameter loop, as a second peer ("peer_loop").
2 ranks on 127.0.0.1, Gloo, one intra-op thread each, float32, AdamW (lr 1e-3, betas 0.9/0.95,
weight decay 0.01), the same attention ops on both sides (baddbmm with the causal mask, softmax, bmm).

Equivalence, before any time counts: the driver writes the full initial weights (model.safetensors)
and the batches (x.<s>, y.<s>); ours loads them with booster.load_model (which keeps each rank's
slice), the peer into the dense model before parallelize_module shards it. In the first repetition
the first forward's output, the loss of each of STEPS steps and the gathered weights after them
(ours: booster.save_model; peer: DTensor.full_tensor()) must agree within |ours - peer| <= ATOL +
RTOL |peer| (for each peer); in every repetition the losses must. A disagreement raises
bu.BenchError.

Timing: after the equivalence steps each side runs warm-up and timed iterations (forward + loss,
backward, AdamW step + zero_grad) on one batch; rank 0's median iteration time gives tokens/s
(B x T tokens per iteration: the tp ranks share the batch). Ours and the peers alternate within each
repetition (the order reverses between repetitions); the ratio is the median of the per-repetition
ratios.
"""
import os

import bench_util as bu

ID = "tp_peer"
WORLD = 2
STEPS = 3  # equivalence steps
ATOL, RTOL = 1e-5, 1e-4
LOSS_RTOL = 1e-5
LR, WEIGHT_DECAY = 1e-3, 0.01
# (label, layers, n_embd, heads, batch, seq): the GPT example's tuned model and per-rank batch
# (examples/configs/gpt_hybrid_tp2.toml), and a wider one where the matrix products weigh more.
CASES = [("GPT example size", 4, 256, 4, 16, 128), ("wider", 2, 512, 8, 8, 128)]
SMOKE_CASES = [("smoke", 2, 64, 4, 2, 16)]
PEER_OPT = {"peer": "foreach, 2 groups", "peer_loop": "CPU default (per-parameter loop)"}
SIDE_NAME = {"ours": "ours (hybrid_parallel tp 2)", "peer": "DTensor, AdamW foreach",
             "peer_loop": "DTensor, AdamW per-parameter loop"}


def _make_inputs(peer, case_dir, layers, embd, heads, batch, seq):
    """Writes case_dir/init/model.safetensors (full weights) and case_dir/data.safetensors."""
    import torch
    g = torch.Generator().manual_seed(1234)
    model = peer.Stack(layers, embd, heads)
    state = {}
    for name, p in model.state_dict().items():
        if ".ln_" in name:
            t = (1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(p.shape, generator=g)
        elif name.endswith("c_proj.weight"):
            t = torch.randn(p.shape, generator=g) * (0.02 / (2 * layers) ** 0.5)
        else:
            t = torch.randn(p.shape, generator=g) * 0.02
        state[name] = t.float()
    os.makedirs(os.path.join(case_dir, "init"), exist_ok=True)
    peer.write_safetensors(os.path.join(case_dir, "init", "model.safetensors"), state)
    data = {}
    for s in range(STEPS):
        data[f"x.{s}"] = torch.randn(batch, seq, embd, generator=g)
        data[f"y.{s}"] = torch.randn(batch, seq, embd, generator=g)
    peer.write_safetensors(os.path.join(case_dir, "data.safetensors"), data)


def _compare(peer, what, ours_path, peer_path):
    """(max |diff|, worst |diff| / (ATOL + RTOL |ref|), max |ref|) over the common tensors; raises on a mismatch."""
    a, b = peer.read_safetensors(ours_path), peer.read_safetensors(peer_path)
    if sorted(a) != sorted(b):
        raise bu.BenchError(f"{what}: tensor names differ: ours {sorted(a)[:4]}..., peer {sorted(b)[:4]}...")
    max_diff, worst, max_ref, worst_name = 0.0, 0.0, 0.0, ""
    for name in a:
        x, y = a[name].double(), b[name].double()
        if x.shape != y.shape:
            raise bu.BenchError(f"{what}: {name} has shape {list(x.shape)} (ours) vs {list(y.shape)} (peer)")
        d = (x - y).abs()
        frac = float((d / (ATOL + RTOL * y.abs())).max())
        if frac > worst:
            worst, worst_name = frac, name
        max_diff, max_ref = max(max_diff, float(d.max())), max(max_ref, float(y.abs().max()))
    if worst > 1:
        raise bu.BenchError(f"{what}: ours and DTensor differ beyond |diff| <= {ATOL:g} + {RTOL:g} |ref| "
                            f"({worst:.2f}x the tolerance at {worst_name}; max |diff| {max_diff:.3g})")
    return max_diff, worst, max_ref


def _check_losses(what, ours, peer):
    if len(ours) != len(peer) or len(ours) != STEPS:
        raise bu.BenchError(f"{what}: {len(ours)} losses from ours, {len(peer)} from DTensor, expected {STEPS}")
    worst = 0.0
    for s, (o, p) in enumerate(zip(ours, peer)):
        rel = abs(o - p) / abs(p)
        if rel > LOSS_RTOL:
            raise bu.BenchError(f"{what}: loss of step {s} differs: ours {o!r}, DTensor {p!r} (rel {rel:.2g} > {LOSS_RTOL:g})")
        worst = max(worst, rel)
    return worst


def run(ctx):
    import torch  # noqa: F401 -- the drivers' Python has it; needed to make the inputs

    exe = bu.program(ctx, "bench_tp_peer")
    peer_path, peer = bu.peer_module(ctx, "dtensor_tp_peer")
    cases = SMOKE_CASES if ctx.smoke else CASES
    warmup, iters = (1, 2) if ctx.smoke else (2, 8)
    reps = ctx.reps
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rows, phase_rows, notes_eq = [], [], []

    for label, layers, embd, heads, batch, seq in cases:
        case_dir = os.path.join(ctx.tmp_dir, f"tp_{layers}_{embd}_{batch}_{seq}")
        _make_inputs(peer, case_dir, layers, embd, heads, batch, seq)
        common = ["--world_size", str(WORLD), "--layers", str(layers), "--embd", str(embd), "--heads", str(heads),
                  "--init", os.path.join(case_dir, "init"), "--data", os.path.join(case_dir, "data.safetensors"),
                  "--steps", str(STEPS), "--lr", str(LR), "--weight_decay", str(WEIGHT_DECAY),
                  "--warmup", str(warmup), "--iters", str(iters)]

        def job(side, rep):
            port = bu.free_port()
            prefix = os.path.join(case_dir, f"{side}_{rep}")
            extra = []
            if rep == 0:
                extra = ["--save", prefix + "_model", "--first_out", prefix + "_first_out.safetensors"]
            base = ([exe] if side == "ours" else
                    [ctx.python, peer_path, "--foreach", "1" if side == "peer" else "0"])
            cmds = [base + common + extra + ["--rank", str(r), "--port", str(port), "--out", prefix]
                    for r in range(WORLD)]
            try:
                bu.run_parallel(cmds, timeout=600, env=env)
            except bu.BenchError as e:
                # PyTorch's own process has aborted now and then ("terminate called without an active
                # exception", SIGABRT) in a smoke run; the reference is rerun once, and the log says so.
                if side == "ours" or "exit code -6" not in str(e):
                    raise
                ctx.log(f"tp_peer: the {side} job aborted (SIGABRT), running it again: {str(e).splitlines()[-1]}")
                bu.run_parallel(cmds, timeout=600, env=env)
            return [bu.read_json(f"{prefix}.rank{r}.json") for r in range(WORLD)]

        sides = ("ours", "peer") if ctx.smoke else ("ours", "peer", "peer_loop")
        samples = {side: [] for side in sides}
        ratios, loss_worst = {side: [] for side in sides[1:]}, 0.0
        eq = {}
        for rep in range(reps):
            order = sides if rep % 2 == 0 else tuple(reversed(sides))
            got = {}
            for side in order:
                ctx.log(f"tp_peer: {label}, repetition {rep + 1}/{reps}, {side}")
                got[side] = job(side, rep)
            for side in sides:
                if got[side][0]["threads"] != 1:
                    raise bu.BenchError(f"{side} ran with {got[side][0]['threads']} intra-op threads, not 1")
                for r in range(1, WORLD):  # both tp ranks see the same (replicated) loss
                    _check_losses(f"{label}, {side}, rank {r} vs rank 0", got[side][r]["losses"], got[side][0]["losses"])
            for side in sides[1:]:
                loss_worst = max(loss_worst, _check_losses(f"{label}, ours vs {side}", got["ours"][0]["losses"],
                                                           got[side][0]["losses"]))
                if rep == 0:
                    eq[side] = (
                        _compare(peer, f"{label}: first forward output, ours vs {side}",
                                 os.path.join(case_dir, "ours_0_first_out.safetensors"),
                                 os.path.join(case_dir, f"{side}_0_first_out.safetensors")),
                        _compare(peer, f"{label}: weights after {STEPS} AdamW steps, ours vs {side}",
                                 os.path.join(case_dir, "ours_0_model", "model.safetensors"),
                                 os.path.join(case_dir, f"{side}_0_model", "model.safetensors")))
            iter_s = {side: bu.median(got[side][0]["iter_s"]) for side in got}
            for side in got:
                samples[side].append({k: bu.median(got[side][0][k]) for k in ("forward_s", "backward_s", "step_s", "iter_s")})
            for side in sides[1:]:
                ratios[side].append(iter_s[side] / iter_s["ours"])  # tokens/s ours / tokens/s peer
        tokens = batch * seq
        med = {side: {k: bu.median([s[k] for s in samples[side]]) for k in samples[side][0]} for side in samples}
        params = 12 * embd * embd * layers + 13 * embd * layers
        for side in sides[1:]:
            ratio = bu.median(ratios[side])
            verdict = ("ours faster" if ratio > 1.05 else "**ours slower**" if ratio < 0.95 else "on par (within 5%)")
            rows.append([f"{label}: {layers} blocks, C {embd}, {heads} heads, {params / 1e6:.2f}M params",
                         f"{batch} x {seq}", PEER_OPT[side], f"{tokens / med['ours']['iter_s']:,.0f}",
                         f"{tokens / med[side]['iter_s']:,.0f}",
                         f"{ratio:.3f} ({min(ratios[side]):.3f}-{max(ratios[side]):.3f})", verdict])
        for side in sides:
            m = med[side]
            phase_rows.append([label, SIDE_NAME[side], f"{m['forward_s'] * 1e3:.1f}", f"{m['backward_s'] * 1e3:.1f}",
                               f"{m['step_s'] * 1e3:.1f}", f"{m['iter_s'] * 1e3:.1f}"])
        out, par = eq["peer"]
        worst_out = max(e[0][1] for e in eq.values())
        worst_par = max(e[1][1] for e in eq.values())
        notes_eq.append(f"{label}: first forward output max |diff| {out[0]:.2g} (max |out| {out[2]:.3g}); weights "
                        f"after {STEPS} AdamW steps max |diff| {par[0]:.2g} (max |param| {par[2]:.3g}); worst element "
                        f"{worst_out:.2f} (output) and {worst_par:.2f} (weights) of the tolerance over "
                        f"{' and '.join(SIDE_NAME[s] for s in sides[1:])}; losses of the {STEPS} steps within rel "
                        f"{loss_worst:.1g} in every repetition")

    return {
        "id": ID,
        "title": "Tensor parallelism: hybrid_parallel tp 2 vs PyTorch DTensor parallelize_module",
        "description": (
            "Tokens/s (from rank 0's median iteration: forward + MSE loss, backward, AdamW step + zero_grad) of a "
            "stack of GPT-2 blocks split Megatron's way over tp = 2 ranks (c_attn and c_fc by output columns, both "
            "c_proj by input rows), 2 ranks on 127.0.0.1, Gloo, one intra-op thread each, float32. *Ours*: "
            "booster::nn::ColumnParallelLinear / RowParallelLinear under the hybrid_parallel plugin "
            "(tp_size 2), torch::optim::AdamW (benchmarks/bench_tp_peer.cpp). *Peer*: torch 2.11's "
            "`parallelize_module` with `ColwiseParallel` / `RowwiseParallel` over `DeviceMesh(\"cpu\", [0, 1])`, "
            "torch.optim.AdamW (benchmarks/peers/dtensor_tp_peer.py), in its multi-tensor form (foreach=True over two "
            "parameter groups, the DTensors and the plain tensors, since one foreach call cannot mix them) and, in "
            "separate runs, in its CPU default, a loop over the parameters. Same weights (one "
            "safetensors file both load), same batches, same attention ops. Ratio = ours / DTensor tokens/s, the "
            "median of the per-repetition ratios (min-max in brackets)."),
        "columns": ["model", "batch x seq (tokens / iteration)", "DTensor side's AdamW", "ours tokens/s",
                    "DTensor tokens/s", "ours / DTensor", "verdict"],
        "rows": rows,
        "tables": [{"caption": "Per iteration on rank 0 (median ms):",
                    "columns": ["model", "side", "forward + loss", "backward", "AdamW step + zero_grad", "iteration"],
                    "rows": phase_rows}],
        "notes": [f"Equivalence (checked before the times count; tolerance |ours - DTensor| <= {ATOL:g} + {RTOL:g} "
                  f"|DTensor| per element, losses rel {LOSS_RTOL:g}): " + "; ".join(notes_eq) + ".",
                  f"{reps} repetition(s), each a fresh 2-process job per side, ours and the DTensor runs in turn "
                  f"(the order reverses between repetitions); per job {STEPS} equivalence steps, {warmup} warm-up "
                  f"and {iters} timed iterations on one batch."],
        "command": "~/.cache/booster/venv/bin/python3 benchmarks/run_benchmarks.py --only tp_peer",
    }
