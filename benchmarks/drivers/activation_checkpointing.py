"""activation_checkpointing -- the GPT example's peak RSS and step time with and without
`[booster] activation_checkpointing`, at a sequence length where activations dominate.

Runs build/bin/gpt as one process (torch_ddp, world size 1, float32, so the figures are the model's
and not the launcher's) with the tuned model's width (4 layers, n_embd 256, 4 heads) at n_ctx 1024,
8 windows per step, for a few optimizer steps, under /usr/bin/time: peak RSS (ru_maxrss) and the
example's "training tokens/s". The activation memory of a run is its peak RSS minus the peak RSS of
the same run at n_ctx 16 (weights, gradients, AdamW state, LibTorch's runtime: what does not scale
with the sequence). The limit is the issue's: activation memory down by at least 2x for about one
extra forward (step time up to ~1.33x: backward ~2 forwards, so one more forward is +1/3).
"""
import os
import re

import bench_util as bu

ID = "activation_checkpointing"


def run(ctx):
    corpus = os.path.join(ctx.build_dir, "data", "kjv.txt")
    steps = 2 if ctx.smoke else 6
    n_ctx = 64 if ctx.smoke else 1024
    width = ["train.n_layer=2", "train.n_embd=32", "train.n_head=2"] if ctx.smoke else \
        ["train.n_layer=4", "train.n_embd=256", "train.n_head=4"]

    def one(name, mode, ctx_len):
        sets = width + [f"train.n_ctx={ctx_len}", "train.batch_size=8", f"train.max_steps={steps}",
                        "train.eval_interval=100000", "train.final_eval_windows=8", "train.sample_length=0",
                        "train.save_model=false", "train.warmup_steps=1", "train.max_minutes=0",
                        "booster.mixed_precision=\"fp32\"", f"train.corpus=\"{corpus}\"",
                        f"booster.activation_checkpointing=\"{mode}\""]
        ctx.log(f"activation_checkpointing: {name}")
        out, rss = bu.run_gpt_example(ctx, f"ac_{name}", sets)
        tok = re.search(r"\(([0-9.]+) training tokens/s\)", out)
        if not tok:
            raise bu.BenchError(f"{name}: no training tokens/s in the output")
        return rss, float(tok.group(1))

    base_rss, _ = one("baseline_n_ctx16", "none", 16)
    runs = [("none", "none"), ("full (every block)", "full"), ("selective (every 2nd block)", "selective")]
    measured = [(label, *one(mode, mode, n_ctx)) for label, mode in runs]
    none_act = max(measured[0][1] - base_rss, 1e-9)
    none_tok = measured[0][2]
    rows = []
    for label, rss, tok in measured:
        act = rss - base_rss
        rows.append([label, f"{rss:,.0f}", f"{act:,.0f}", f"{none_act / max(act, 1e-9):.2f}x", f"{tok:,.0f}",
                     f"{none_tok / tok:.2f}x"])
    return {
        "id": ID,
        "title": "Activation checkpointing: GPT example memory and step time",
        "description": (
            f"build/bin/gpt as one process (torch_ddp, fp32), 4 layers, n_embd 256, n_ctx {n_ctx}, 8 windows per "
            f"step, {steps} optimizer steps. Activation memory = peak RSS - {base_rss:,.0f} MiB (the same run at "
            "n_ctx 16). Limit: activation memory down >= 2x for about one extra forward (time <= ~1.33x)."),
        "columns": ["activation_checkpointing", "peak RSS MiB", "activation MiB", "activation saved",
                    "training tokens/s", "time vs none"],
        "rows": rows,
        "notes": ["The checkpointed blocks keep their input; ln_f, the tied head, the logits and the loss (the "
                  "largest activation at vocabulary 256 x n_ctx) are outside the blocks and kept in every mode."],
        "command": "~/.cache/booster/venv/bin/python3 benchmarks/run_benchmarks.py --only activation_checkpointing",
    }
