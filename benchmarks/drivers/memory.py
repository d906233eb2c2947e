"""memory -- benchmark 4: per-rank memory of DDP vs ZeRO-1 vs ZeRO-2 with AdamW, against the ZeRO formulas.

Runs build/bin/bench_memory as N ranks under `build/bin/booster run --nproc_per_node N` for N in
(2, 4) (smoke: 2) and five configurations: DDP (torch_ddp) fp32, ZeRO-1 / ZeRO-2 (low_level_zero)
fp32 and bf16 with fp32 master slices. The model is an MLP of 4 Linear(3584, 3584) layers
(Ψ = 51.4M parameters; smoke: 4 Linear(512, 512), 1.05M) trained for 2 AdamW steps on a fixed
global batch of 8 rows split across the ranks. Each rank reports its peak RSS (VmHWM), its RSS
right after launch (baseline, before the model exists), the peaks of each phase and the booster's
MemoryReport; the table sets them against the ZeRO paper's model-state formulas for the same Ψ and N.

Correctness before any figure counts: every rank of a job must hold the same parameters after the
steps (checksums equal); ZeRO is mathematically equivalent to DDP in fp32, and the global batch is
the same for every N, so all fp32 jobs (every configuration, N = 2 and 4) must agree on the loss after
the steps and on the parameter checksums within 1e-4 relative, and the steps must have moved the
loss by more than that tolerance; the bf16 jobs must give a finite loss within 5% of the fp32 one.
"""
import json
import math
import os

import bench_util as bu

ID = "memory"
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "GROUP_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
MIB = 1 << 20
FP32_TOL = 1e-4   # relative: loss and parameter checksums of the fp32 configurations
BF16_TOL = 0.05   # relative: bf16 loss against the fp32 one

# name, bench_memory flags, model-state formula (bytes per rank) of Ψ and N, the formula as text.
CONFIGS = [
    ("DDP fp32", ["--plugin", "torch_ddp"], lambda p, n: 16 * p, "16Ψ"),
    ("ZeRO-1 fp32", ["--plugin", "low_level_zero", "--stage", "1", "--precision", "fp32"],
     lambda p, n: 8 * p + 8 * p / n, "8Ψ + 8Ψ/N"),
    ("ZeRO-2 fp32", ["--plugin", "low_level_zero", "--stage", "2", "--precision", "fp32"],
     lambda p, n: 4 * p + 12 * p / n, "4Ψ + 12Ψ/N"),
    ("ZeRO-1 bf16", ["--plugin", "low_level_zero", "--stage", "1", "--precision", "bf16"],
     lambda p, n: 4 * p + 12 * p / n, "2Ψ + 2Ψ + 12Ψ/N"),
    ("ZeRO-2 bf16", ["--plugin", "low_level_zero", "--stage", "2", "--precision", "bf16"],
     lambda p, n: 2 * p + 14 * p / n, "2Ψ + 14Ψ/N"),
]


def _mib(b):
    return f"{b / MIB:.0f} MiB"


def _rel(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


# Diagnostic (full mode, largest N): ZeRO-2 bf16 again with glibc's mmap threshold fixed at 1 MiB
# (setting it disables glibc's dynamic threshold, which otherwise rises to 32 MiB after the first
# large free, so that later tensors below 32 MiB come from the heap, where freed memory can stay
# resident).
MMAP_NAME = "ZeRO-2 bf16, MALLOC_MMAP_THRESHOLD_=1 MiB"
MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}


def _job(ctx, launcher, exe, world, flags, model_flags, env):
    cmd = [launcher, "run", "--nproc_per_node", str(world), "--master_port", str(bu.free_port()), exe,
           *flags, *model_flags]
    p = bu.run(cmd, timeout=600, env=env)
    recs = {}
    for line in p.stdout.splitlines():
        if "BENCH_MEMORY " in line:
            rec = json.loads(line.split("BENCH_MEMORY ", 1)[1])
            recs[rec["rank"]] = rec
    what = f"{' '.join(flags)} on {world} ranks"
    if sorted(recs) != list(range(world)):
        raise bu.BenchError(f"{what}: expected reports from ranks 0..{world - 1}, got {sorted(recs)}")
    r0 = recs[0]
    for rank, rec in recs.items():
        for key in ("checksum", "checksum_sq"):
            if _rel(rec[key], r0[key]) > 1e-9:
                raise bu.BenchError(f"{what}: rank {rank}'s parameters after the steps ({key} {rec[key]}) differ "
                                    f"from rank 0's ({r0[key]}): the replicas diverged")
        if not all(math.isfinite(rec[k]) for k in ("loss", "eval_loss", "checksum", "checksum_sq")):
            raise bu.BenchError(f"{what}: rank {rank} reports a non-finite loss or checksum: {rec}")
        if rec["numel"] != r0["numel"]:
            raise bu.BenchError(f"{what}: ranks disagree on the parameter count")
    return recs


def _phase(rec):
    """Where the rank's peak was reached: setup (build + boost), backward, or step."""
    peaks = {"setup (build + boost)": rec["setup_hwm_bytes"],
             "forward + backward": max(rec["backward_hwm_bytes"] or [0]),
             "optimizer step": max(rec["step_hwm_bytes"] or [0])}
    return max(peaks, key=peaks.get)


def run(ctx):
    exe = bu.program(ctx, "bench_memory")
    launcher = bu.program(ctx, "booster")
    for plugin in ("booster_plugin_torch_ddp.so", "booster_plugin_low_level_zero.so"):
        if not os.path.exists(os.path.join(ctx.build_dir, "bin", "plugins", plugin)):
            raise bu.BenchError(f"{ctx.build_dir}/bin/plugins/{plugin} not found: build it first")
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env["OMP_NUM_THREADS"] = "1"
    hidden, layers = (512, 4) if ctx.smoke else (3584, 4)
    worlds = (2,) if ctx.smoke else (2, 4)
    model_flags = ["--hidden", str(hidden), "--layers", str(layers), "--steps", "2", "--global_batch", "8"]
    ctx.log(f"memory: MLP {layers} x Linear({hidden}, {hidden}), AdamW, 2 steps; {len(CONFIGS)} configurations "
            f"on {', '.join(map(str, worlds))} ranks, one run each")

    results = []  # (name, formula fn, formula text, N, records)
    for world in worlds:
        for name, flags, formula, text in CONFIGS:
            ctx.log(f"memory: {name}, N = {world}")
            results.append((name, formula, text, world, _job(ctx, launcher, exe, world, flags, model_flags, env)))
    if not ctx.smoke:
        name, flags, formula, text = CONFIGS[4]
        ctx.log(f"memory: {MMAP_NAME}, N = {worlds[-1]}")
        results.append((MMAP_NAME, formula, text, worlds[-1],
                        _job(ctx, launcher, exe, worlds[-1], flags, model_flags, {**env, **MMAP_ENV})))

    # Correctness: the fp32 jobs against the first (DDP, N = 2); bf16 loosely.
    ref_name, _, _, ref_world, ref = results[0]
    ref0 = ref[0]
    moved = _rel(ref0["eval_loss"], ref0["initial_eval_loss"])
    if moved <= 10 * FP32_TOL:
        raise bu.BenchError(f"the 2 steps moved the evaluation loss by only {moved:.2e} relative "
                            f"({ref0['initial_eval_loss']} -> {ref0['eval_loss']}): the loss comparison would not "
                            "test the training")
    worst = {"eval_loss": 0.0, "checksum": 0.0, "checksum_sq": 0.0}
    worst_bf16 = 0.0
    for name, _, _, world, recs in results:
        r = recs[0]
        if "fp32" in name:
            for key in worst:
                d = _rel(r[key], ref0[key])
                worst[key] = max(worst[key], d)
                if d > FP32_TOL:
                    raise bu.BenchError(f"{name} on {world} ranks: {key} {r[key]} differs from {ref_name} on "
                                        f"{ref_world} ranks ({ref0[key]}) by {d:.2e} relative (> {FP32_TOL:g}); "
                                        "fp32 ZeRO must train exactly as DDP")
        else:
            d = _rel(r["eval_loss"], ref0["eval_loss"])
            worst_bf16 = max(worst_bf16, d)
            if d > BF16_TOL:
                raise bu.BenchError(f"{name} on {world} ranks: loss {r['eval_loss']} is {d:.1%} from the fp32 loss "
                                    f"{ref0['eval_loss']} (> {BF16_TOL:.0%})")

    rows = []
    rank_spread = 0
    numel = ref0["numel"]
    for name, formula, text, world, recs in results:
        f = formula(numel, world)
        rep = recs[0]  # the report is the same on every rank up to padding; show rank 0's
        peak_rec = max(recs.values(), key=lambda x: x["vm_hwm_bytes"])
        peak = peak_rec["vm_hwm_bytes"]
        over_base = max(x["vm_hwm_bytes"] - x["baseline_rss_bytes"] for x in recs.values())
        steady = max(x["final_rss_bytes"] - x["baseline_rss_bytes"] for x in recs.values())
        rank_spread = max(rank_spread, max(x["vm_hwm_bytes"] for x in recs.values())
                          - min(x["vm_hwm_bytes"] for x in recs.values()))
        comm = rep["communication_buffers"]
        rows.append([
            name, str(world), f"{numel / 1e6:.1f}M",
            f"{text} = {_mib(f)}",
            f"{_mib(rep['model_states'])}" + (f" (+ {_mib(comm)} buckets)" if comm else ""),
            f"{rep['model_states'] / f:.2f}x",
            f"{_mib(peak)} (baseline {_mib(peak_rec['baseline_rss_bytes'])})",
            f"{_mib(over_base)}, in the {_phase(peak_rec)}",
            f"{over_base / f:.2f}x",
            f"{_mib(steady)} ({steady / f:.2f}x)",
        ])

    # Figures for the notes, measured in this run (N = the largest world, fp32 and bf16 ZeRO).
    by = {(name, world): recs for name, _, _, world, recs in results}
    nmax = max(worlds)

    def step_transient(name):
        recs = by[(name, nmax)]
        return max(max(x["step_hwm_bytes"]) - x["final_rss_bytes"] for x in recs.values())

    def steady_of(name):
        recs = by[(name, nmax)]
        return max(x["final_rss_bytes"] - x["baseline_rss_bytes"] for x in recs.values())

    baselines = [x["baseline_rss_bytes"] for *_, recs in results for x in recs.values()]
    psi4 = 4 * numel
    fp32_peaks = [max(x["vm_hwm_bytes"] - x["baseline_rss_bytes"] for x in by[(n, nmax)].values())
                  for n in ("DDP fp32", "ZeRO-1 fp32", "ZeRO-2 fp32")]
    z1, z2 = steady_of("ZeRO-1 fp32"), steady_of("ZeRO-2 fp32")
    saved = z1 - z2
    expected = psi4 - psi4 / nmax  # stage 1 keeps 4Ψ of gradients, stage 2 4Ψ/N
    if z2 >= z1:
        z2_vs_z1 = (f"**not below stage 1's** ({_mib(z2)} vs {_mib(z1)} above baseline at N = {nmax}): we lose "
                    "the point of stage 2 here")
    else:
        z2_vs_z1 = (f"{_mib(z2)} vs {_mib(z1)} above baseline at N = {nmax}, {_mib(saved)} less "
                    f"({saved / expected:.0%} of the 4Ψ - 4Ψ/N = {_mib(expected)} the formulas predict)")
    setup_peak = max(x["setup_hwm_bytes"] for *_, recs in results for x in recs.values())
    train_peak = max(x["train_hwm_bytes"] for *_, recs in results for x in recs.values())
    notes = [
        f"One run per configuration; the ranks of a job differ by at most {_mib(rank_spread)} in peak RSS "
        f"(all ranks of a job do the same work, so this is the noise). Ψ = {numel:,} parameters; 1 MiB = 2^20 bytes. All ranks of a job ran "
        "on the same 2-core machine, one intra-op thread each.",
        f"Correctness: every rank's parameters agree after the steps (checksums equal); all fp32 jobs "
        f"(N = {' and '.join(map(str, worlds))}) agree with DDP on {ref_world} ranks within {FP32_TOL:g} relative "
        f"(worst: loss {worst['eval_loss']:.1e}, sum of parameters {worst['checksum']:.1e}, sum of squares "
        f"{worst['checksum_sq']:.1e}); the 2 steps moved the loss by {moved:.1e} relative "
        f"({ref0['initial_eval_loss']:.6f} -> {ref0['eval_loss']:.6f}); the bf16 losses are within {worst_bf16:.1e} "
        f"of the fp32 one (limit {BF16_TOL:.0%}).",
        "*Formula*: model states per rank with Adam (ZeRO paper, section 3.1, and core/memory.h): fp32 DDP "
        "4Ψ parameters + 4Ψ gradients + 8Ψ Adam moments = 16Ψ; ZeRO-1 shards the moments (8Ψ/N), ZeRO-2 also the "
        "gradients (4Ψ/N); bf16 keeps 2Ψ parameters and fp32 master slices (4Ψ/N). Communication buffers are not "
        "in the formula. *Booster report*: `Booster::memory_report()` after the steps (parameters incl. padding, "
        "gradients, master weights, optimizer states; buckets that are not the gradients shown separately).",
        f"*RSS* is VmHWM / VmRSS from /proc/self/status. The baseline (RSS after launch, before the model exists: "
        f"LibTorch loaded, Gloo rendezvous done, plugin not yet loaded) was {_mib(min(baselines))} to {_mib(max(baselines))}. RSS above it also holds "
        "autograd's transient gradients and activations (tiny here: 8 rows), optimizer temporaries, collective "
        "buffers and whatever glibc keeps. The peak is the whole run's (`clear_refs` resets it between phases to "
        "find where it was reached); the last column is RSS after the steps, the steady state.",
    ]
    if ctx.smoke:
        notes.append("Smoke sizes: tensors this small come from glibc's heap (below its mmap threshold), which keeps "
                     "freed memory, so the RSS figures say little; run without --smoke for the real ones.")
    else:
        notes += [
            "Tensors of 32 MiB and more (a 3584 x 3584 fp32 layer is 49 MiB) are always mmap'ed by glibc and "
            "returned to the system when freed, so for fp32 RSS follows the live tensors closely.",
            f"DDP's report is 16Ψ plus {_mib(psi4)} of buckets: `torch_ddp` defaults to gradient_as_bucket_view = "
            "false (as PyTorch), so the buckets are a second full gradient copy (20Ψ in all); the ZeRO-1 buckets "
            "are the gradients.",
            f"**ZeRO-2 against ZeRO-1**: stage 2's gradient buckets are transient (core/grad_reducer.cpp: allocated "
            "when their first gradient arrives, released once reduced to their owners, at most two in flight), so "
            "between steps it holds only its 4Ψ/N gradient shard; the report's bucket figure is the most it can hold "
            f"during backward. Steady RSS: {z2_vs_z1}.",
            f"**Where the peaks are**: at N = {nmax} the optimizer step of ZeRO-1 fp32 rises "
            f"{_mib(step_transient('ZeRO-1 fp32'))} and ZeRO-2 fp32 {_mib(step_transient('ZeRO-2 fp32'))} above the "
            "RSS after the steps: stage 1's 4Ψ/N gradient-slice copy and AdamW's temporaries on the slice. The "
            "parameter all-gather writes straight into the flat parameter buffer (one broadcast per rank: "
            "`ProcessGroup::all_gather_into_tensor`), so it adds no full-size buffer (Gloo's own allgather would "
            "stage one). ZeRO-2's peak is in backward, where the transient buckets and autograd's gradients "
            f"overlap. The fp32 peaks above baseline of DDP, ZeRO-1 and ZeRO-2 at N = {nmax} are "
            f"{', '.join(_mib(v) for v in fp32_peaks)}; the model states differ by up to "
            f"{CONFIGS[0][2](numel, nmax) / CONFIGS[2][2](numel, nmax):.1f}x.",
            "**bf16 peaks above their formula**: Gloo in LibTorch 1.13 has no bf16, so the process group sends bf16 "
            "as fp32 (a converted copy of each chunk or bucket part, twice the bytes; ZeRO-1 bf16 step at "
            f"N = {nmax}: +{_mib(step_transient('ZeRO-1 bf16'))}, ZeRO-2 bf16: +{_mib(step_transient('ZeRO-2 bf16'))} "
            "above the RSS after the steps).",
            f"**bf16 steady RSS above formula + buckets: glibc keeps freed heap memory.** At N = {nmax} the bf16 "
            f"tensors are below 32 MiB (a parameter shard 2Ψ/N is {_mib(2 * numel / nmax)}); once glibc's dynamic "
            "mmap threshold has risen (after the first large free) they come from the heap, where freed memory "
            "can stay resident. The last row reruns ZeRO-2 bf16 with MALLOC_MMAP_THRESHOLD_ fixed at 1 MiB: RSS "
            f"after the steps {_mib(steady_of(MMAP_NAME))} above baseline (formula + buckets: "
            f"{_mib(CONFIGS[4][2](numel, nmax) + by[(MMAP_NAME, nmax)][0]['communication_buffers'])}) instead of "
            f"{_mib(steady_of('ZeRO-2 bf16'))}, peak {_mib(max(x['vm_hwm_bytes'] - x['baseline_rss_bytes'] for x in by[(MMAP_NAME, nmax)].values()))} "
            f"instead of {_mib(max(x['vm_hwm_bytes'] - x['baseline_rss_bytes'] for x in by[('ZeRO-2 bf16', nmax)].values()))}.",
            f"Set-up: ZeRO copies the parameters into one flat buffer (bf16 casts the model first), so boost() "
            f"briefly holds the model twice; the highest set-up peak of all ranks ({_mib(setup_peak)}) is "
            f"{'below' if setup_peak < train_peak else 'not below'} the highest training peak ({_mib(train_peak)}).",
        ]
    return {
        "id": ID,
        "title": "Memory: per-rank peak RSS and model states, DDP vs ZeRO-1 vs ZeRO-2",
        "description": (
            f"`bench_memory` on N ranks (`booster run --nproc_per_node N`): an MLP of {layers} Linear({hidden}, "
            f"{hidden}) layers (Ψ = {numel / 1e6:.1f}M parameters) with AdamW (lr 1e-4, weight decay 0.01), boosted "
            "with `torch_ddp` (DDP) or `low_level_zero` (stage 1 / 2; precision fp32, or bf16 with fp32 master "
            "slices), 2 steps on a fixed global batch of 8 rows split across the ranks. Per configuration: the ZeRO "
            "paper's model-state formula for this Ψ and N (*the limit*), the booster's own MemoryReport against it, "
            "and the measured RSS: the peak (max over ranks), the peak above the rank's RSS right after launch, and "
            "the RSS after the steps. The figures count only after the configurations agreed (see the notes)."),
        "columns": ["configuration", "N", "Ψ", "formula: model states per rank", "booster report: model states",
                    "report / formula", "peak RSS per rank (max over ranks)", "peak RSS - baseline",
                    "(peak - baseline) / formula", "RSS after the steps - baseline (/ formula)"],
        "rows": rows,
        "notes": notes,
        "command": "/usr/bin/python3 benchmarks/run_benchmarks.py --only memory",
    }
