"""sequence_parallelism -- per-rank activation memory of the GPT example at a long sequence under
hybrid_parallel on 2 ranks: tensor parallelism alone (tp 2), Megatron-SP (tp 2, split_gather) and
Ulysses (sp 2, all_to_all).

Runs build/bin/gpt under `booster run --nproc_per_node 2` (float32, 8 windows per step, a few
optimizer steps; two model shapes, SHAPES) under /usr/bin/time, whose peak RSS is the largest rank's
(ru_maxrss of the launcher's children). The activation memory of a configuration is that peak minus
the peak of the same configuration at n_ctx 16 (weights, gradients, AdamW state, LibTorch's runtime:
what does not scale with the sequence). Expected (Korthikanti et al. 2022): split_gather holds the
LayerNorm / dropout / residual activations that tp alone keeps whole in T/2 shards, so less than tp
alone; all_to_all shards every activation outside attention over sp.
"""
import os
import re

import bench_util as bu

ID = "sequence_parallelism"

CONFIGS = [
    ("tp 2 (tensor parallelism alone)", ["plugin.tp_size=2"]),
    ("tp 2, split_gather (Megatron-SP)", ["plugin.tp_size=2", "plugin.enable_sequence_parallelism=true",
                                           "plugin.sequence_parallelism_mode=\"split_gather\""]),
    ("sp 2, all_to_all (Ulysses)", ["plugin.tp_size=1", "plugin.sp_size=2", "plugin.enable_sequence_parallelism=true",
                                    "plugin.sequence_parallelism_mode=\"all_to_all\""]),
]


# (label, model width settings, n_ctx, steps): attention scores [B, heads, T, T] dominate the first;
# the hidden-size activations (what split_gather shards beyond tp) the second.
SHAPES = [
    ("4 layers, n_embd 256, 4 heads, n_ctx 1024", ["train.n_layer=4", "train.n_embd=256", "train.n_head=4"], 1024, 4),
    ("2 layers, n_embd 768, 4 heads, n_ctx 256", ["train.n_layer=2", "train.n_embd=768", "train.n_head=4"], 256, 2),
]


def run(ctx):
    corpus = os.path.join(ctx.build_dir, "data", "kjv.txt")
    shapes = [("smoke", ["train.n_layer=2", "train.n_embd=32", "train.n_head=2"], 64, 2)] if ctx.smoke else SHAPES

    def one(name, width, plugin_sets, ctx_len, steps):
        sets = width + plugin_sets + [
            f"train.n_ctx={ctx_len}", "train.batch_size=8", f"train.max_steps={steps}", "train.eval_interval=100000",
            "train.final_eval_windows=2", "train.sample_length=0", "train.save_model=false", "train.warmup_steps=1",
            "train.max_minutes=0", "plugin.precision=\"fp32\"", f"train.corpus=\"{corpus}\""]
        ctx.log(f"sequence_parallelism: {name} at n_ctx {ctx_len}")
        cmd = ["/usr/bin/time", "-f", "MAXRSS_KB %M", bu.program(ctx, "booster"), "run", "--nproc_per_node", "2",
               "--master_port", str(bu.free_port()), bu.program(ctx, "gpt"), "--config",
               os.path.join(ctx.source_dir, "examples", "configs", "gpt_hybrid_tp2.toml"),
               "--output_dir", os.path.join(ctx.tmp_dir, f"sp_{len(name)}_{ctx_len}")]
        for s in sets:
            cmd += ["--set", s]
        p = bu.run(cmd, timeout=1800, cwd=ctx.source_dir)
        out = p.stdout + p.stderr
        rss = re.search(r"MAXRSS_KB (\d+)", out)
        if not rss:
            raise bu.BenchError(f"{name}: no peak RSS in the output")
        tok = re.search(r"\(([0-9.]+) training tokens/s\)", out)
        return int(rss.group(1)) / 1024.0, float(tok.group(1)) if tok else float("nan")

    rows = []
    for label, width, n_ctx, steps in shapes:
        measured = []
        for name, plugin_sets in CONFIGS:
            base, _ = one(name, width, plugin_sets, 16, steps)
            peak, tok = one(name, width, plugin_sets, n_ctx, steps)
            measured.append((name, base, peak, peak - base, tok))
        tp_act = max(measured[0][3], 1e-9)
        for name, base, peak, act, tok in measured:
            rows.append([label, name, f"{peak:,.0f}", f"{base:,.0f}", f"{act:,.0f}", f"{act / tp_act:.2f}x",
                         f"{tok:,.0f}"])
    return {
        "id": ID,
        "title": "Sequence parallelism: per-rank activation memory of the GPT example",
        "description": (
            "build/bin/gpt on 2 ranks (booster run, hybrid_parallel, fp32), 8 windows per step, a few optimizer "
            "steps, in two shapes. Peak RSS of the largest rank; activation memory = peak RSS - the same "
            "configuration's peak at n_ctx 16."),
        "columns": ["model", "configuration", "peak RSS MiB (largest rank)", "peak at n_ctx 16", "activation MiB",
                    "vs tp alone", "training tokens/s"],
        "rows": rows,
        "notes": ["Where the attention scores [B, heads, T, T] dominate (first shape), tensor parallelism and Ulysses "
                  "both split them by heads and Megatron-SP adds little; its saving is the LayerNorm, dropout and "
                  "residual activations that tp alone keeps whole, a larger share of the second shape. All-to-all keeps "
                  "the model whole on each rank (its n_ctx 16 peak is higher: replicated weights and AdamW state).",
                  "ln_f's output is gathered for the vocab-parallel head under split_gather (the logits "
                  "[B, T, 256 / tp] are whole sequences there); under all_to_all they are T / sp shards.",
                  "training tokens/s on this shared 2-core machine are indicative only."],
        "command": "~/.cache/booster/venv/bin/python3 benchmarks/run_benchmarks.py --only sequence_parallelism --out /tmp/x.md",
    }
