"""The memory benchmark's table of Plugin::estimate_memory against the measured RSS (used by
drivers/memory.py): the estimate row of each configuration, its total with the runtime the estimate
mode measures, and the peak RSS of the last step."""
import bench_util as bu

MIB = 1 << 20


def _mib(b):
    return f"{b / MIB:.0f} MiB"


ESTIMATE_TOL = 0.10  # the estimate's target: within 10% of the measured steady-state peak


def _estimate_row(rec, name):
    """The plugin's estimate row (bench_memory's estimate_rows) for this configuration."""
    want = []
    if rec["plugin"] == "low_level_zero":
        want = [f"stage={rec['stage']}"]
    elif rec["plugin"] == "torch_fsdp":
        want = [f'sharding_strategy="{rec["strategy"]}"']
    rows = [r for r in rec["estimate_rows"]
            if all(w in r["options"] for w in want)
            and (rec["plugin"] != "torch_ddp" or not r["options"])]  # DDP: the default row
    if not rows:
        raise bu.BenchError(f"{name}: the plugin's estimate has no row for this configuration "
                            f"({[r['configuration'] for r in rec['estimate_rows']]})")
    return rows[0]


def estimate_section(results):
    """Estimate (runtime = the rank's RSS after launch, + the plugin's total) against the measured peak
    of the last step (the steady state: every buffer and optimizer state exists), max over ranks."""
    rows, ratios = [], []
    for name, _, _, world, recs in results:
        est_peak, meas_peak, est_rec = 0, 0, None
        for rec in recs.values():
            row = _estimate_row(rec, name)
            est = rec["estimate_runtime_bytes"] + row["total"]
            last = max(rec["forward_hwm_bytes"][-1], rec["backward_hwm_bytes"][-1], rec["step_hwm_bytes"][-1])
            if last > meas_peak:
                meas_peak, est_peak, est_rec = last, est, (row, rec)
        row, rec = est_rec
        ratio = est_peak / meas_peak
        ratios.append((name, world, ratio))
        rows.append([name, str(world), row["configuration"], _mib(rec["estimate_runtime_bytes"]),
                     _mib(row["model_states"]), _mib(row["transient"]), _mib(est_peak), _mib(meas_peak),
                     f"{ratio:.2f}x" + ("" if abs(ratio - 1) <= ESTIMATE_TOL else " **outside 10%**")])
    table = {
        "caption": (
            "**Estimate against measurement** (`Plugin::estimate_memory`, core/memory_estimate.h, for the same "
            "model, optimizer, N and precision, asked before boost(); the total adds the runtime as the estimate "
            "mode measures it, the rank's RSS right before boost() minus the model's bytes (LibTorch, Gloo, the "
            "plugin library, the data); measured: the peak RSS of the last step (VmHWM, reset per phase), the rank with the "
            "highest; activations are not counted: 8 rows, under 1 MiB)."),
        "columns": ["configuration", "N", "estimate row", "runtime (RSS before boost - model)", "estimate: model states",
                    "estimate: transient", "estimate: total", "measured: peak of the last step",
                    "estimate / measured"],
        "rows": rows,
    }
    inside = sum(1 for *_, r in ratios if abs(r - 1) <= ESTIMATE_TOL)
    worst = max(ratios, key=lambda t: abs(t[2] - 1))
    notes = [f"**Estimate**: {inside} of {len(ratios)} configurations within {ESTIMATE_TOL:.0%} of the measured "
             f"peak of the last step; the farthest: {worst[0]} on {worst[1]} ranks, {worst[2]:.2f}x."]
    return table, notes


