"""gpt_throughput -- GPT example training throughput for every plugin on 4 ranks.

Runs build/bin/gpt (examples/gpt, the tuned model of examples/configs/gpt_ddp.toml: 4 layers,
n_embd 256, n_ctx 128, 16 windows per data-parallel rank, bf16) under `booster run --nproc_per_node 4`
with each plugin's config for a fixed number of steps, no evaluation and no sample, and reads the
example's "training tokens/s" (tokens of the optimizer steps over the wall time of the training
steps, all ranks). 4 ranks on this 2-core machine share the cores (one intra-op thread each), so the
numbers compare plugins under the same oversubscription, not absolute speed. The global batch differs
with the data-parallel size (tp and pp ranks share a batch), so tokens/s is the comparable figure.
"""
import os
import re

import bench_util as bu

ID = "gpt_throughput"
CONFIGS = [("torch_ddp", "gpt_ddp.toml", "dp 4"), ("low_level_zero (ZeRO-2)", "gpt_zero2.toml", "dp 4"),
           ("torch_fsdp (FULL_SHARD)", "gpt_fsdp.toml", "dp 4"),
           ("gemini (static, bf16 chunks)", "gpt_gemini.toml", "dp 4"),
           ("hybrid_parallel tp2", "gpt_hybrid_tp2.toml", "dp 2 x tp 2"),
           ("hybrid_parallel pp2 (1F1B, 4 micro-batches)", "gpt_hybrid_pp2.toml", "dp 2 x pp 2"),
           ("hybrid_parallel tp2 x pp2", "gpt_hybrid_tp2pp2.toml", "pp 2 x tp 2")]


def run(ctx):
    gpt = bu.program(ctx, "gpt")
    cli = bu.program(ctx, "booster")
    steps = 6 if ctx.smoke else 20
    corpus = os.path.join(ctx.build_dir, "data", "kjv.txt")
    rows = []
    smoke_configs = ("gpt_ddp.toml", "gpt_hybrid_tp2.toml")
    for name, config, mesh in ([c for c in CONFIGS if c[1] in smoke_configs] if ctx.smoke else CONFIGS):
        ctx.log(f"gpt_throughput: {name}")
        sets = [f"train.max_steps={steps}", "train.eval_interval=100000", "train.final_eval_windows=64",
                "train.sample_length=0", "train.save_model=false", "train.warmup_steps=5", "train.max_minutes=0",
                f"train.corpus=\"{corpus}\""]
        if ctx.smoke:
            sets += ["train.n_layer=2", "train.n_embd=32", "train.n_head=2", "train.n_ctx=32"]
        cmd = [cli, "run", "--nproc_per_node", "4", "--master_port", str(bu.free_port()), gpt,
               "--config", os.path.join(ctx.source_dir, "examples", "configs", config),
               "--output_dir", os.path.join(ctx.tmp_dir, "gpt_" + config)]
        for s in sets:
            cmd += ["--set", s]
        p = bu.run(cmd, timeout=1200, cwd=ctx.source_dir)
        m = re.search(r"training stopped after (\d+) steps at [0-9.]+ s \(([0-9.]+) training tokens/s\)",
                      p.stdout + p.stderr)
        if not m:
            raise bu.BenchError(f"{name}: no 'training tokens/s' line in the output")
        rows.append([name, mesh, m.group(1), f"{float(m.group(2)):,.0f}"])
    base = float(rows[0][3].replace(",", ""))
    for r in rows:
        r.append(f"{float(r[3].replace(',', '')) / base:.2f}x")
    return {
        "id": ID,
        "title": "GPT example throughput per plugin on 4 ranks",
        "description": (
            "examples/gpt with the tuned model (4 layers, n_embd 256, 4 heads, n_ctx 128, 3.3M parameters, bf16, "
            f"16 windows of 128 bytes per data-parallel rank per step), {steps} optimizer steps on 4 ranks of this "
            "2-core machine (oversubscribed: one intra-op thread per rank). Tokens/s = tokens of the steps / wall "
            "time of the training steps (from the example's log). Tensor- and pipeline-parallel ranks share a batch, "
            "so the global batch is smaller when dp < 4."),
        "columns": ["plugin", "mesh", "steps", "training tokens/s", "vs torch_ddp"],
        "rows": rows,
        "notes": ["A small model on CPU: tensor parallelism adds two allreduces per block per direction and pipeline "
                  "parallelism a bubble, which a model this size cannot amortise; they exist for models that do not "
                  "fit one rank.",
                  "Every plugin runs with its default `[booster] malloc = \"cache\"` (core/host_cache.h): freed tensor "
                  "blocks kept for reuse up to a bound, blocks of 2 MiB and more mapped with huge pages."],
        "command": "~/.cache/booster/venv/bin/python3 benchmarks/run_benchmarks.py --only gpt_throughput",
    }
