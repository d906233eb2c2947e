#!/usr/bin/env python3
"""run_benchmarks.py -- runs the benchmark suite and writes docs/benchmarks.md.

    ~/.cache/booster/venv/bin/python3 benchmarks/run_benchmarks.py [--build-dir build] [--only id1,id2] [--reps 5]
                                                  [--smoke] [--out docs/benchmarks.md]

(`bash scripts/run_benchmarks.sh` builds first, then runs this.) Each benchmark is a driver
benchmarks/drivers/<id>.py (Python 3, stdlib + torch) with `run(ctx) -> dict`; ctx has build_dir,
source_dir, smoke, reps, tmp_dir, python and log(msg). The dict gives id, title, description,
columns, rows, notes and command (optionally `tables`: further tables of the section, each a dict
with caption, columns and rows, shown after the main one); the driver raises when the two sides of a comparison disagree, and
the section then says that it failed and why instead of giving numbers. Drivers run in a fixed order
(ddp_throughput, collectives, checkpoint, memory, optimizer_step, startup, then any others by name);
a planned benchmark without a driver gets a "not yet" row, never a number.

--smoke runs every driver with tiny sizes and one repetition (seconds; the ctest test
benchmarks_smoke), writes to a temporary file unless --out is given, never to docs/benchmarks.md,
and exits non-zero if any driver failed. A full run also exits non-zero when a driver failed (after
writing the file, which shows the failure).
"""
import argparse
import datetime
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_DIR = os.path.join(SOURCE_DIR, "benchmarks")
DRIVER_DIR = os.path.join(BENCH_DIR, "drivers")
DOCS_OUT = os.path.join(SOURCE_DIR, "docs", "benchmarks.md")
ORDER = ["ddp_throughput", "collectives", "checkpoint", "memory", "optimizer_step", "startup"]
# Planned benchmarks whose driver may not exist yet (issue 6): a "not yet" section instead.
PLANNED = {
    "ddp_throughput": "DDP training throughput (benchmark 1)",
    "memory": "Memory (benchmark 4)",
}
REPRODUCE = "bash scripts/run_benchmarks.sh"


class Context:
    """What a driver gets (see the module docstring)."""

    def __init__(self, build_dir, smoke, reps, tmp_dir):
        self.build_dir = build_dir
        self.source_dir = SOURCE_DIR
        self.smoke = smoke
        self.reps = reps
        self.tmp_dir = tmp_dir
        self.python = sys.executable  # the venv's python3 with torch 2.11 (scripts/run_benchmarks.sh)

    def log(self, msg):
        print(f"[{datetime.datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The machine

def _output(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _load():
    """The 1-minute load average now, as text ("n/a" where the OS has none)."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "n/a"


def machine_info():
    cpu, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not cpu:
                    cpu = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
                if cpu and flags:
                    break
    except OSError:
        pass
    # The widest vector ISA: bf16 matrix products are fast in LibTorch only with AVX-512, and the CPU
    # Adam kernel picks its path from it, so figures from machines of different ISAs do not compare.
    isa = ("AVX-512" + (" (with AVX512_BF16)" if "avx512_bf16" in flags else "") if "avx512f" in flags
           else "AVX2" if "avx2" in flags else "no AVX2")
    if flags:
        cpu += f", {isa}"
    # LibTorch's BLAS is its own (the wheel links MKL into libtorch_cpu), not the system's libblas.
    blas = _output([sys.executable, "-c", "import re, torch; c = torch.__config__.show(); "
                    "b = re.findall(r'BLAS_INFO=(\\w+)', c); print(b[0] if b else '')"])
    blas = f"{blas.upper()} (inside LibTorch)" if blas else ""
    # LibTorch: the torch of the Python peer (the venv install_deps.sh makes), which the build links.
    libtorch = _output([sys.executable, "-c", "import torch, os; print(torch.__version__, os.path.dirname(torch.__file__))"])
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = f"{kb / (1 << 20):.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {
        "cores": _output(["nproc"]) or str(os.cpu_count()),
        "cpu": cpu or platform.processor() or "unknown",
        "blas": blas or "unknown",
        "libtorch": libtorch or "unknown",
        "memory": mem or "unknown",
        "os": _output(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]) or platform.platform(),
        "kernel": platform.release(),
        "compiler": (_output(["c++", "--version"]).splitlines() or ["unknown"])[0],
    }


# ---------------------------------------------------------------------------------------------
# Drivers

def discover(only):
    found = {os.path.splitext(f)[0] for f in os.listdir(DRIVER_DIR)
             if f.endswith(".py") and not f.startswith("_")} if os.path.isdir(DRIVER_DIR) else set()
    ids = [i for i in ORDER if i in found or i in PLANNED] + sorted(found - set(ORDER))
    if only:
        unknown = [i for i in only if i not in ids]
        if unknown:
            raise SystemExit(f"run_benchmarks: unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(ids)}")
        ids = [i for i in ids if i in only]
    return [(i, os.path.join(DRIVER_DIR, i + ".py") if i in found else None) for i in ids]


def load_driver(bench_id, path):
    spec = importlib.util.spec_from_file_location(f"bench_driver_{bench_id}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "run", None)):
        raise RuntimeError(f"{path} has no run(ctx) function")
    return module


def run_one(ctx, bench_id, path):
    """Returns (section dict, error text or None, seconds)."""
    t0 = time.monotonic()
    if path is None:
        return ({"id": bench_id, "title": PLANNED.get(bench_id, bench_id), "status": "not yet",
                 "description": "", "columns": ["status"],
                 "rows": [[f"not yet: benchmarks/drivers/{bench_id}.py does not exist, so there is no figure"]],
                 "notes": [], "command": ""}, None, 0.0)
    module = None
    try:
        module = load_driver(bench_id, path)
        result = module.run(ctx)
        check_result(bench_id, result)
        result.setdefault("notes", [])
        return result, None, time.monotonic() - t0
    except Exception as e:  # noqa: BLE001 -- any failure becomes a row, the other benchmarks still run
        ctx.log(f"{bench_id}: FAILED\n{traceback.format_exc()}")
        reason = f"{type(e).__name__}: {e}".strip()
        return ({"id": bench_id, "title": PLANNED.get(bench_id, bench_id), "status": "failed",
                 "description": (getattr(module, "__doc__", "") or "").strip(),
                 "columns": ["status", "reason"], "rows": [["failed: no figure", reason]], "notes": [],
                 "command": f"~/.cache/booster/venv/bin/python3 benchmarks/run_benchmarks.py --only {bench_id}"},
                reason, time.monotonic() - t0)


def check_result(bench_id, r):
    for key in ("id", "title", "description", "columns", "rows", "command"):
        if key not in r:
            raise ValueError(f"driver {bench_id} returned no '{key}'")
    for t in [r] + list(r.get("tables", [])):
        for key in ("columns", "rows"):
            if key not in t:
                raise ValueError(f"driver {bench_id}: a table has no '{key}'")
        for row in t["rows"]:
            if len(row) != len(t["columns"]):
                raise ValueError(f"driver {bench_id}: a row has {len(row)} cells for {len(t['columns'])} columns: {row}")


# ---------------------------------------------------------------------------------------------
# Markdown

def cell(value):
    return str(value).replace("|", "\\|").replace("\n", "<br>")


def table(columns, rows):
    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def render(sections, machine, date, args, total_s):
    mode = "--smoke: tiny sizes, one repetition; this checks the harness, its figures mean nothing" \
        if args.smoke else f"{args.reps} repetitions per figure"
    machine_line = f"{machine['cores']} cores, {machine['cpu']}, BLAS: {machine['blas']}"
    out = [
        "# Benchmarks",
        "",
        f"Generated by `{REPRODUCE}` ({mode}) on {date}, in {total_s / 60:.1f} min. Do not edit by hand: "
        "rerun the command. Every figure is a median of repetitions in which our side and its peer or limit "
        "were interleaved, and is shown next to that peer or limit measured in the same run with the ratio of the two "
        "(absolute times on this shared machine vary from run to run; the ratios are the result). Each benchmark "
        "checks that both sides computed the same thing before its times count; a benchmark that fails that "
        "check, or is not written yet, shows so instead of a number.",
        "",
        "## Machine",
        "",
        table(["", ""], [["cores (nproc)", machine["cores"]], ["CPU", machine["cpu"]], ["BLAS", machine["blas"]],
                         ["memory", machine["memory"]], ["LibTorch", machine["libtorch"]], ["OS", machine["os"]],
                         ["kernel", machine["kernel"]], ["compiler", machine["compiler"]],
                         ["build", f"{os.path.relpath(args.build_dir, SOURCE_DIR)} (Release)"],
                         ["load average (1 min)", machine.get("load", "unknown")]]),
        "",
        "## How to reproduce",
        "",
        f"    {REPRODUCE}                 # builds, runs every benchmark, rewrites docs/benchmarks.md",
        f"    {REPRODUCE} --only startup  # one benchmark (ids below); --reps N; --smoke for a quick check",
        "",
        "Benchmarks: " + ", ".join(f"`{s['id']}`" for s in sections) + ".",
    ]
    for s in sections:
        out += ["", f"## {s['title']} (`{s['id']}`)", ""]
        if s.get("description"):
            out += [s["description"].strip(), ""]
        out += [f"Machine: {machine_line}. Date: {date}.", ""]
        out += [table(s["columns"], s["rows"]), ""]
        for t in s.get("tables", []):
            if t.get("caption"):
                out += [t["caption"].strip(), ""]
            out += [table(t["columns"], t["rows"]), ""]
        for note in s.get("notes", []):
            out.append(f"- {note}")
        if s.get("notes"):
            out.append("")
        if s.get("command"):
            out += [f"Reproduce: `{s['command']}` (after building; or `{REPRODUCE} --only {s['id']}`)."]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(SOURCE_DIR, "build"),
                    help="CMake build directory with the bench programs in bin/ (default: build)")
    ap.add_argument("--only", default="", help="comma-separated benchmark ids")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition; never rewrites docs")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per figure (default 5)")
    ap.add_argument("--out", default=None, help="markdown output (default docs/benchmarks.md; smoke: a temp file)")
    args = ap.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    if args.smoke:
        args.reps = 1
        if args.out is None:
            args.out = os.path.join(tempfile.gettempdir(), "booster_benchmarks_smoke.md")
        if os.path.abspath(args.out) == DOCS_OUT:
            ap.error("--smoke never rewrites docs/benchmarks.md; pass another --out")
    elif args.out is None:
        args.out = DOCS_OUT
    if not os.path.isdir(os.path.join(args.build_dir, "bin")):
        ap.error(f"{args.build_dir}/bin does not exist: build first (bash scripts/build.sh)")

    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    sys.path.insert(0, BENCH_DIR)  # drivers import bench_util
    only = [i for i in args.only.split(",") if i]
    plan = discover(only)
    # Scratch space on the build's disk (not a tmpfs), removed afterwards.
    tmp_dir = tempfile.mkdtemp(prefix="bench-tmp-", dir=args.build_dir)
    ctx = Context(args.build_dir, args.smoke, args.reps, tmp_dir)
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    machine = machine_info()
    ctx.log(f"benchmarks: {', '.join(i for i, _ in plan)} ({'smoke' if args.smoke else f'{args.reps} reps'})")

    t_start = time.monotonic()
    load_start = _load()
    sections, failures = [], []
    try:
        for bench_id, path in plan:
            ctx.log(f"{bench_id}: {'running' if path else 'not yet (no driver)'}")
            section, error, seconds = run_one(ctx, bench_id, path)
            if error is None and path is not None:
                section.setdefault("notes", []).append(f"This benchmark took {seconds:.0f} s.")
                ctx.log(f"{bench_id}: done in {seconds:.1f} s")
            if error is not None:
                failures.append(f"{bench_id}: {error}")
            sections.append(section)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    total = time.monotonic() - t_start
    machine["load"] = (f"{load_start} before the run / {_load()} after it (a shared machine: load before the run "
                       f"is other processes competing for the {machine['cores']} cores, which slows absolute times "
                       "more than the interleaved ratios)")

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(render(sections, machine, date, args, total))
    ctx.log(f"wrote {args.out} ({total:.0f} s)")
    if failures:
        print("run_benchmarks: failed:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
