#!/usr/bin/env python3
"""chaos.py -- kill random ranks at random moments of a checkpointing training job and check that
it always finishes with the parameters of the uninterrupted run (issue: fault tolerance).

The job is the Fashion-MNIST example on 2 ranks (torch_ddp, a 1024-sample subset, 3 epochs,
a checkpoint every 4 optimizer steps, auto_resume) under an elastic launcher with --max_restarts 3:
`booster run`, `torchrun --no_python` (the venv's torch 2.11), or `booster run --hostfile` with two
hosts of one rank each (restarts across nodes; the nodes are reached through a stand-in for ssh that
runs the command line here, in a session of its own). Each trial starts the job, then
SIGKILLs one random rank 1-2 times once a checkpoint was committed (a kill before that only restarts
from scratch): at a random moment of training (a random delay of up to one checkpoint interval after
the checkpoint of a random step was committed; the step is drawn so that at least three checkpoints
remain, so the kill lands however fast or slow the machine runs), or (alternately) the moment a
checkpoint save is in progress (its .tmp- directory appears). After each kill, the newest committed
checkpoint must be complete (its safetensors files parse and their data fit the file). The
launcher restarts the ranks; they resume from that checkpoint. At the end the job must have exited
0 and its final checkpoint's model and optimizer files must equal the uninterrupted run's byte for
byte.

    ~/.cache/booster/venv/bin/python3 tests/chaos/chaos.py --build build --trials 20 [--launcher booster|torchrun|hostfile|both|all]
    ~/.cache/booster/venv/bin/python3 tests/chaos/chaos.py --build build --trials 0 --async_trials 20

--async_trials K adds K trials whose job saves asynchronously ([train] checkpoint_use_async = true,
booster/checkpoint/async_save.h): a kill then often lands while the background writer is writing
or waiting for the other rank's part; the previous committed set must stay the newest loadable one
and the final files must still equal the (blocking) reference run's byte for byte.

(both: booster and torchrun in turn; all: the three in turn.)

Prints one line per trial and a summary; exits 1 if any trial failed, 77 when the data set is not
installed (ctest skips).
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

DATA = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
CHECKPOINT_EVERY = 4  # optimizer steps between the job's checkpoints
PYTHON = sys.executable  # the Python with torch 2.11 that runs this script (torchrun)


def example_args(build, source, run_dir, use_async=False):
    sets = (["train.checkpoint_use_async=true"] if use_async else []) + ["train.epochs=3", "train.train_subset=1024", "train.test_subset=500", "train.batch_size=32",
            "train.lr_scheduler.warmup_steps=5", f"train.checkpoint_every_steps={CHECKPOINT_EVERY}", "train.keep_last_n=3",
            f'train.checkpoint_dir="{run_dir}/ckpt"',
            # One thread per rank under every launcher: with --hostfile each "node" runs one local
            # rank, which would get both cores, and another thread count sums in another order.
            "distributed.threads_per_rank=1"]
    args = [os.path.join(build, "bin", "fashion_mnist"), "--config",
            os.path.join(source, "examples", "configs", "ddp.toml"), "--output_dir", os.path.join(run_dir, "out")]
    for s in sets:
        args += ["--set", s]
    return args


def launcher_argv(kind, build, port, max_restarts, run_dir):
    if kind == "booster":
        return [os.path.join(build, "bin", "booster"), "run", "--nproc_per_node", "2", "--master_port", str(port),
                "--max_restarts", str(max_restarts)]
    if kind == "hostfile":
        hosts, ssh = os.path.join(run_dir, "hosts"), os.path.join(run_dir, "fake_ssh")
        with open(hosts, "w") as f:
            f.write("127.0.0.1\nlocalhost\n")
        with open(ssh, "w") as f:
            f.write('#!/bin/sh\n# HOST COMMAND_LINE: runs the command line here, in a session of its own\n'
                    'exec setsid -w /bin/sh -c "$2"\n')
        os.chmod(ssh, 0o755)
        return [os.path.join(build, "bin", "booster"), "run", "--hostfile", hosts, "--nproc_per_node", "1",
                "--master_port", str(port), "--max_restarts", str(max_restarts), "--ssh_command", ssh]
    # (torchrun is given --redirects explicitly.)
    return [PYTHON, "-m", "torch.distributed.run", "--no_python", "--nproc_per_node", "2", "--master_port", str(port),
            "--max_restarts", str(max_restarts), "--monitor_interval", "0.2", "--redirects", "1", "--tee", "1",
            "--log_dir", os.path.join(run_dir, "torchrun_logs")]


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_pids(run_dir):
    """PIDs of the example's rank processes of this trial (their command line names run_dir)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            exe = os.path.basename(os.readlink(f"/proc/{entry}/exe"))
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if exe == "fashion_mnist" and run_dir in cmd and state != "Z":
            pids.append(int(entry))
    return sorted(pids)


def check_safetensors(path):
    """'' when `path` is a complete safetensors file, else what is wrong."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n <= 0 or 8 + n > size:
                return f"{path}: header length {n} does not fit {size} bytes"
            header = json.loads(f.read(n))
        end = 0
        for name, info in header.items():
            if name == "__metadata__":
                continue
            end = max(end, info["data_offsets"][1])
        if 8 + n + end != size:
            return f"{path}: tensors end at {8 + n + end}, file has {size} bytes"
        return ""
    except (OSError, ValueError, KeyError) as e:
        return f"{path}: {e}"


def latest_checkpoint(root):
    try:
        with open(os.path.join(root, "latest")) as f:
            name = f.read().strip()
    except OSError:
        return ""
    return os.path.join(root, name)


def latest_step(root):
    """global_step of the newest committed checkpoint under `root`, -1 when there is none."""
    latest = latest_checkpoint(root)
    try:
        with open(os.path.join(latest, "trainer_state.json")) as f:
            return int(json.load(f)["global_step"])
    except (OSError, ValueError, KeyError):
        return -1


def check_latest_complete(root):
    """'' when there is no checkpoint yet or the newest one is complete."""
    latest = latest_checkpoint(root)
    if not latest:
        return ""
    if not os.path.isdir(latest):
        return f"latest names {latest}, which does not exist"
    problems = []
    for rel in ("model/model.safetensors", "optimizer/optimizer.safetensors"):
        p = os.path.join(latest, rel)
        if not os.path.exists(p):
            problems.append(f"{p} missing")
        else:
            problems.append(check_safetensors(p))
    for rel in ("trainer_state.json", "lr_scheduler.json", "rng_state_rank0.bin", "rng_state_rank1.bin"):
        if not os.path.exists(os.path.join(latest, rel)):
            problems.append(f"{latest}/{rel} missing")
    return "; ".join(p for p in problems if p)


def final_files(run_dir):
    latest = latest_checkpoint(os.path.join(run_dir, "ckpt"))
    out = {}
    for rel in ("model/model.safetensors", "optimizer/optimizer.safetensors"):
        with open(os.path.join(latest, rel), "rb") as f:
            out[rel] = f.read()
    with open(os.path.join(latest, "trainer_state.json")) as f:
        out["global_step"] = json.load(f)["global_step"]
    return out


def run_job(args, kind, run_dir, kills, rng, log, plan=None, use_async=False):
    """Runs one job, killing a random rank at each planned kill: 'save', or (u_step, u_delay) with
    u in [0, 1): once the newest committed checkpoint reaches a step drawn by u_step between the
    attempt's current step and the last step that leaves three checkpoints to come, wait u_delay of
    the reference run's checkpoint interval (plan['interval'] s), then kill. With kills == [] the
    commit times are recorded instead (returned in plan['commits']). Returns (exit code, problems,
    number of kills done, number of resumed runs in the log)."""
    os.makedirs(run_dir, exist_ok=True)
    argv = launcher_argv(kind, args.build, free_port(), 3 if kills else 0, run_dir) + example_args(args.build, args.source, run_dir, use_async)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with open(os.path.join(run_dir, "job.log"), "w") as out:
        job = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        problems, done, resumable = [], 0, 0
        start = time.time()
        ckpt = os.path.join(run_dir, "ckpt")
        try:
            if not kills and plan is not None:  # the reference: record when each checkpoint is committed
                plan["commits"], seen = [], -1
                while job.poll() is None and time.time() - start < args.timeout:
                    step = latest_step(ckpt)
                    if step > seen:
                        seen = step
                        plan["commits"].append(time.time())
                    time.sleep(0.02)
            for kill in kills:
                target, reached = None, None
                while job.poll() is None and time.time() - start < args.timeout:
                    pids = rank_pids(run_dir)
                    if kill == "save":  # a save in progress, after at least one was committed
                        ready = (bool(latest_checkpoint(ckpt)) and
                                 any(n.startswith(".tmp-") for n in os.listdir(ckpt)))
                    else:  # u_delay of an interval after the checkpoint of the drawn step was committed
                        step = latest_step(ckpt)
                        if target is None and step >= 0:
                            last = max(step, plan["final_step"] - 3 * plan["every"])
                            target = step + int(kill[0] * ((last - step) // plan["every"] + 1)) * plan["every"]
                        if reached is None and target is not None and step >= target:
                            reached = time.time()
                        ready = reached is not None and time.time() - reached >= kill[1] * plan["interval"]
                    if ready and len(pids) == 2:
                        victim = rng.choice(pids)
                        had_checkpoint = bool(latest_checkpoint(ckpt))
                        os.kill(victim, signal.SIGKILL)
                        done += 1
                        resumable += 1 if had_checkpoint else 0
                        log(f"    killed rank pid {victim} ({kill if kill == 'save' else 'step %d + %.2f s' % (target, kill[1] * plan['interval'])})")
                        # Let the launcher notice and stop the other rank; a committed checkpoint
                        # must be complete at any moment, so the check need not wait for more.
                        deadline = time.time() + 10
                        while job.poll() is None and time.time() < deadline and set(rank_pids(run_dir)) & set(pids):
                            time.sleep(0.02)
                        problem = check_latest_complete(ckpt)
                        if problem:
                            problems.append("after a kill: " + problem)
                        start = time.time()  # the next kill's clock starts at the restart
                        break
                    time.sleep(0.005 if kill == "save" else 0.05)
            code = job.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
            code = "timeout"
    # A restart after a kill that found a committed checkpoint must resume from one (a run restarted
    # from scratch would end with the same parameters, so this is checked separately). Counted from
    # the log, where a restarted attempt killed early, or torchrun's tee of a killed attempt, may
    # miss its line: at least one resume per trial with such kills.
    with open(os.path.join(run_dir, "job.log"), errors="replace") as f:
        resumed = sum(1 for line in f if "fashion_mnist: resumed from" in line and "[rank 0]" in line or
                      line.startswith("fashion_mnist: resumed from"))
    if code == 0 and done < len(kills):
        problems.append(f"only {done} of {len(kills)} planned kills happened before the job ended")
    if code == 0 and resumable and not resumed:
        problems.append(f"{resumable} kills after a checkpoint was committed but no resumed run in the log")
    leftover = rank_pids(run_dir)
    if leftover:
        problems.append(f"rank processes left behind: {leftover}")
        for p in leftover:
            os.kill(p, signal.SIGKILL)
    return code, problems, done, resumed


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(here, "..", "..", "build"))
    p.add_argument("--source", default=os.path.join(here, "..", ".."))
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--async_trials", type=int, default=0, help="more trials with asynchronous checkpoint saves")
    p.add_argument("--launcher", choices=["booster", "torchrun", "hostfile", "both", "all"], default="both")
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--timeout", type=float, default=300, help="seconds per job")
    p.add_argument("--keep", action="store_true", help="keep the trial directories")
    args = p.parse_args()
    args.build, args.source = os.path.abspath(args.build), os.path.abspath(args.source)
    if not os.path.exists(DATA):
        print("chaos: dataset-fashion-mnist not installed; skipped")
        return 77
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="booster_chaos_")
    log = lambda s: print(s, flush=True)
    log(f"chaos: seed {args.seed}, {args.trials} + {args.async_trials} async trials, launcher {args.launcher}, work {work}")
    try:
        t0 = time.time()
        plan = {}
        code, problems, _, _ = run_job(args, "booster", os.path.join(work, "reference"), [], rng, log, plan)
        ref_seconds = time.time() - t0
        if code != 0 or problems:
            log(f"chaos: the uninterrupted reference run failed (exit {code}): {problems}; see {work}/reference/job.log")
            return 1
        reference = final_files(os.path.join(work, "reference"))
        commits = plan["commits"]
        plan.update(final_step=reference["global_step"], every=CHECKPOINT_EVERY,
                    interval=(commits[-1] - commits[0]) / max(1, len(commits) - 1))
        if reference["global_step"] < 4 * CHECKPOINT_EVERY:
            log(f"chaos: the reference run has {reference['global_step']} steps; kills need at least {4 * CHECKPOINT_EVERY}")
            return 1
        log(f"chaos: reference run {ref_seconds:.1f} s, {reference['global_step']} optimizer steps, "
            f"{len(commits)} checkpoints {plan['interval']:.2f} s apart")
        failures = 0
        kills_total = 0
        resumes = {}
        total = args.trials + args.async_trials
        for trial in range(total):
            use_async = trial >= args.trials
            kinds = {"both": ("booster", "torchrun"), "all": ("booster", "torchrun", "hostfile")}.get(
                args.launcher, (args.launcher,))
            kind = kinds[trial % len(kinds)]
            n_kills = rng.choice([1, 2])
            kills = [("save" if (trial + k) % 2 else (rng.random(), rng.random())) for k in range(n_kills)]
            run_dir = os.path.join(work, f"trial{trial:02d}")
            t0 = time.time()
            code, problems, done, resumed = run_job(args, kind, run_dir, kills, rng, log, plan, use_async)
            kills_total += done
            resumes[kind] = resumes.get(kind, 0) + resumed
            if code != 0:
                problems.append(f"exit code {code} (see {run_dir}/job.log)")
            elif not problems:
                got = final_files(run_dir)
                for rel in ("model/model.safetensors", "optimizer/optimizer.safetensors"):
                    if got[rel] != reference[rel]:
                        problems.append(f"final {rel} differs from the uninterrupted run's")
                if got["global_step"] != reference["global_step"]:
                    problems.append(f"final global_step {got['global_step']} != {reference['global_step']}")
            ok = not problems
            failures += 0 if ok else 1
            log(f"trial {trial:2d} [{kind:8s}{' async' if use_async else ''}] kills {done}/{n_kills}: {'ok' if ok else 'FAILED: ' + '; '.join(problems)}"
                f" ({time.time() - t0:.1f} s)")
            if ok and not args.keep:
                shutil.rmtree(run_dir, ignore_errors=True)
        log(f"chaos: {total - failures}/{total} trials ({args.async_trials} with async saves) finished bitwise equal to the uninterrupted run "
            f"({kills_total} ranks killed, runs resumed from a checkpoint: {resumes}, seed {args.seed})")
        never = [k for k, n in resumes.items() if n == 0]
        if never:
            log(f"chaos: no run under {never} resumed from a checkpoint: the resume path was not exercised")
            return 1
        return 1 if failures else 0
    finally:
        if not args.keep and os.path.isdir(work):
            failed = [d for d in os.listdir(work) if d.startswith("trial")]
            if not failed:
                shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
