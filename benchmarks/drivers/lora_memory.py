"""lora_memory -- what LoRA fine-tuning saves: the GPT example's peak RSS and the Booster's
optimizer-state report, full fine-tuning against `[train] lora_r` (booster.enable_lora).

Runs build/bin/gpt as one process (torch_ddp, world size 1, float32, AdamW) on a wide model (8
layers, n_embd 512: about 25M parameters) at n_ctx 64, 8 windows per step, for a few optimizer
steps, under /usr/bin/time (peak RSS, ru_maxrss), three ways: full fine-tuning, LoRA r = 8 on
c_attn, c_proj and c_fc, and the same LoRA run as the floor reference. The limit is the issue's:
the optimizer state of a LoRA run is that of the adapters only, i.e. the Booster's report shows
2 x 4 bytes x (trainable parameters) for AdamW, and the peak RSS falls by about the full run's
gradients and AdamW state of the frozen parameters (3 x 4 bytes x frozen parameters: fp32
gradient, exp_avg, exp_avg_sq), which the LoRA run never allocates.
"""
import os
import re

import bench_util as bu

ID = "lora_memory"


def run(ctx):
    corpus = os.path.join(ctx.build_dir, "data", "kjv.txt")
    steps = 2 if ctx.smoke else 4
    width = ["train.n_layer=2", "train.n_embd=64", "train.n_head=2"] if ctx.smoke else \
        ["train.n_layer=8", "train.n_embd=512", "train.n_head=8"]

    def one(name, extra):
        sets = width + ["train.n_ctx=64", "train.batch_size=8", f"train.max_steps={steps}",
                        "train.eval_interval=100000", "train.final_eval_windows=8", "train.sample_length=0",
                        "train.save_model=false", "train.warmup_steps=1", "train.max_minutes=0",
                        "booster.mixed_precision=\"fp32\"", f"train.corpus=\"{corpus}\""] + extra
        ctx.log(f"lora_memory: {name}")
        out, rss = bu.run_gpt_example(ctx, f"lora_{name}", sets)
        report = re.search(r"memory per rank in steady state \(torch_ddp\): params ([0-9.]+) MiB, grads ([0-9.]+) MiB, "
                           r"master weights ([0-9.]+) MiB, optimizer states ([0-9.]+) MiB", out)
        params = re.search(r"gpt: (\d+) parameters", out)
        lora = re.search(r"trainable parameters (\d+) of (\d+)", out)
        if not report or not params:
            raise bu.BenchError(f"{name}: no memory report or parameter count in the output")
        total = int(params.group(1))
        trainable = int(lora.group(1)) if lora else total
        return {"rss": rss, "grads": float(report.group(2)),
                "states": float(report.group(4)), "trainable": trainable, "total": total}

    full = one("full", [])
    lora = one("lora_r8", ["train.lora_r=8", "train.lora_target_modules=\"c_attn,c_proj,c_fc\""])
    mib = 1.0 / (1 << 20)
    states_limit = 2 * 4 * lora["trainable"] * mib
    frozen = lora["total"] - lora["trainable"]
    saved_limit = 3 * 4 * frozen * mib
    rows = [
        ["full fine-tuning", f"{full['trainable']:,}", f"{full['grads']:.1f}", f"{full['states']:.1f}",
         f"{2 * 4 * full['trainable'] * mib:.1f}", f"{full['rss']:,.0f}", ""],
        ["LoRA r 8 (c_attn, c_proj, c_fc)", f"{lora['trainable']:,}", f"{lora['grads']:.1f}", f"{lora['states']:.1f}",
         f"{states_limit:.1f}", f"{lora['rss']:,.0f}",
         f"{full['rss'] - lora['rss']:,.0f} (limit {saved_limit:,.0f})"],
    ]
    return {
        "id": ID,
        "title": "LoRA: optimizer state and peak RSS of the GPT example",
        "description": (
            f"build/bin/gpt as one process (torch_ddp, fp32, AdamW), {width[0].split('=')[1]} layers, n_embd "
            f"{width[1].split('=')[1]}, n_ctx 64, 8 windows per step, {steps} optimizer steps. 'states' and 'grads' "
            "are the Booster's steady-state memory report; the limit for the states is AdamW's 2 x 4 bytes per "
            "trainable parameter; the RSS saving's limit is 3 x 4 bytes (gradient, exp_avg, exp_avg_sq) per frozen "
            "parameter."),
        "columns": ["run", "trainable parameters", "grads MiB", "optimizer states MiB", "limit: 2 x 4 B x trainable",
                    "peak RSS MiB", "RSS saved MiB"],
        "rows": rows,
        "notes": ["boost() leaves the frozen parameters out of the optimizer (logged), so neither gradients nor "
                  "AdamW state exist for them; the adapters' own activations (x A) are the extra a LoRA step keeps."],
        "command": "~/.cache/booster/venv/bin/python3 benchmarks/run_benchmarks.py --only lora_memory",
    }
