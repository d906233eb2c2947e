#!/usr/bin/env python3
# lr_scheduler_reference.py — reference lr sequences from Python torch 2.11's torch.optim.lr_scheduler
# (and ColossalAI's LinearWarmupLR / CosineAnnealingWarmupLR, re-implemented below because ColossalAI
# is not installed), for lr_scheduler_test.cpp.
#
# Every case builds a fresh SGD with two param groups (lr 0.1 and 0.01), constructs the scheduler,
# records get_last_lr(), then 150 times: optimizer.step(); scheduler.step(); record. Prints one line
# "REF_JSON {"<case>": [[lr_group0, lr_group1], ...151 entries], ...}" (the prefix lets the test skip
# anything else on the output). json.dumps writes floats with repr, which round-trips exactly.
import json
import math
import sys
import warnings

import torch
from torch.optim import lr_scheduler as sch

STEPS = 150
BASE_LRS = (0.1, 0.01)


class LinearWarmupLR(sch._LRScheduler):
    """colossalai.nn.lr_scheduler.LinearWarmupLR (colossalai/nn/lr_scheduler/linear.py):
    (e + 1) / (W + 1) * base_lr while e < W, then (T - e) / (T - W) * base_lr."""

    def __init__(self, optimizer, total_steps, warmup_steps=0, last_epoch=-1):
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        super().__init__(optimizer, last_epoch=last_epoch)

    def get_lr(self):
        if self.last_epoch < self.warmup_steps:
            return [(self.last_epoch + 1) / (self.warmup_steps + 1) * lr for lr in self.base_lrs]
        return [(self.total_steps - self.last_epoch) / (self.total_steps - self.warmup_steps) * lr
                for lr in self.base_lrs]


class WarmupScheduler(sch._LRScheduler):
    """colossalai.nn.lr_scheduler.delayed.WarmupScheduler: (e + 1) / W * base_lr while e < W; at e = W
    it hands over to after_scheduler (sharing base_lrs) and from then on only steps that one."""

    def __init__(self, optimizer, warmup_epochs, after_scheduler, last_epoch=-1):
        self.warmup_epochs = int(warmup_epochs)
        self.after_scheduler = after_scheduler
        self.finished = False
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch >= self.warmup_epochs:
            if not self.finished:
                self.after_scheduler.base_lrs = self.base_lrs
                self.finished = True
            return self.after_scheduler.get_lr()
        return [(self.last_epoch + 1) / self.warmup_epochs * lr for lr in self.base_lrs]

    def step(self, epoch=None):
        if self.finished:
            self.after_scheduler.step(None)
            self._last_lr = self.after_scheduler.get_last_lr()
        else:
            return super().step(epoch)


def cosine_annealing_warmup_lr(optimizer, total_steps, warmup_steps=0, eta_min=0.0):
    """colossalai.nn.lr_scheduler.CosineAnnealingWarmupLR (colossalai/nn/lr_scheduler/cosine.py):
    WarmupScheduler around torch's CosineAnnealingLR(T_max = total_steps - warmup_steps)."""
    base = sch.CosineAnnealingLR(optimizer, total_steps - warmup_steps, eta_min=eta_min)
    return WarmupScheduler(optimizer, warmup_steps, base)


CASES = {
    "step_30": lambda o: sch.StepLR(o, step_size=30),
    "step_7_g0.5": lambda o: sch.StepLR(o, step_size=7, gamma=0.5),
    "multistep_30_80": lambda o: sch.MultiStepLR(o, milestones=[30, 80]),
    "multistep_dups": lambda o: sch.MultiStepLR(o, milestones=[0, 50, 50, 120], gamma=0.5),
    "exponential_0.97": lambda o: sch.ExponentialLR(o, gamma=0.97),
    "exponential_1.01": lambda o: sch.ExponentialLR(o, gamma=1.01),
    "cosine_50_etamin": lambda o: sch.CosineAnnealingLR(o, T_max=50, eta_min=0.001),
    "cosine_150": lambda o: sch.CosineAnnealingLR(o, T_max=150),
    "cosine_7": lambda o: sch.CosineAnnealingLR(o, T_max=7, eta_min=1e-4),
    "linear_warmup_150_20": lambda o: LinearWarmupLR(o, total_steps=150, warmup_steps=20),
    "linear_warmup_150_0": lambda o: LinearWarmupLR(o, total_steps=150),
    "cosine_warmup_100_10": lambda o: cosine_annealing_warmup_lr(o, 100, warmup_steps=10, eta_min=1e-4),
    "cosine_warmup_150_0": lambda o: cosine_annealing_warmup_lr(o, 150),
    "cosine_warmup_150_1": lambda o: cosine_annealing_warmup_lr(o, 150, warmup_steps=1),
    "polynomial_default": lambda o: sch.PolynomialLR(o),
    "polynomial_100_2": lambda o: sch.PolynomialLR(o, total_iters=100, power=2.0),
    "polynomial_120_0.5": lambda o: sch.PolynomialLR(o, total_iters=120, power=0.5),
    "onecycle_default": lambda o: sch.OneCycleLR(o, max_lr=0.5, total_steps=150, cycle_momentum=False),
    "onecycle_linear_3phase": lambda o: sch.OneCycleLR(
        o, max_lr=[1.0, 0.1], total_steps=150, pct_start=0.25, anneal_strategy="linear", div_factor=10.0,
        final_div_factor=100.0, three_phase=True, cycle_momentum=False),
    "onecycle_cos_3phase_200": lambda o: sch.OneCycleLR(
        o, max_lr=0.3, total_steps=200, three_phase=True, cycle_momentum=False),
    "lambda_pow": lambda o: sch.LambdaLR(o, lr_lambda=lambda e: 0.95 ** e),
    "lambda_per_group": lambda o: sch.LambdaLR(o, lr_lambda=[lambda e: 1.0 / (1 + e), lambda e: 0.95 ** e]),
}


def run(make):
    params = [torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)]
    opt = torch.optim.SGD([{"params": [params[0]], "lr": BASE_LRS[0]},
                           {"params": [params[1]], "lr": BASE_LRS[1]}], lr=BASE_LRS[0])
    sched = make(opt)
    seq = [list(sched.get_last_lr())]
    for _ in range(STEPS):
        opt.step()
        sched.step()
        seq.append([g["lr"] for g in opt.param_groups])
    return seq


def main():
    warnings.simplefilter("ignore")
    names = sys.argv[1:] or list(CASES)
    out = {name: run(CASES[name]) for name in names}
    print("REF_JSON " + json.dumps(out))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
