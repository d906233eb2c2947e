#!/usr/bin/env python3
"""gpu_peer_fashion_mnist.py — the PyTorch eager peer of the main job on one GPU (scripts/gpu_run.sh).

The same training as examples/fashion_mnist on one rank: the CNN of examples/fashion_mnist/net.h
(conv(1->32) BN ReLU pool, conv(32->64) BN ReLU pool, fc(3136->128) ReLU dropout 0.25 fc(128->10)),
examples/configs/ddp.toml's batch 64, AdamW (lr 1e-3, weight decay 0.01) and cosine schedule with 200
warmup steps stepped per optimizer step, the Fashion-MNIST IDX gz files read with gzip + numpy and
normalised as booster::data::load_fashion_mnist does ((x / 255 - 0.2860) / 0.3530). As the C++ loop:
the data set stays on the host, each shuffled batch (drop_last) is copied to the device, the loss is
read back (.item()) every step, and the epoch time covers the training steps only (not evaluation).

    python3 scripts/gpu_peer_fashion_mnist.py --data_dir /usr/share/datasets/fashion-mnist --epochs 1 --device cuda

Needs torch (2.11) and numpy. Prints one line per epoch in the example's form:
    epoch 1/1  train_loss 0.5347  test_accuracy 0.8868  samples/s 12345  time 4.9 s
"""
import argparse
import gzip
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from gpu_peer_profile import StepProfiler

MEAN, STD = 0.2860, 0.3530


class Net(nn.Module):
    """examples/fashion_mnist/net.h."""

    def __init__(self, dropout_p=0.25):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.dropout = nn.Dropout(dropout_p)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        h = F.max_pool2d(F.relu(self.bn2(self.conv2(h))), 2)
        h = self.dropout(F.relu(self.fc1(h.flatten(1))))
        return self.fc2(h)


def read_idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def load(data_dir, train):
    prefix = "train" if train else "t10k"
    images = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"), 16).reshape(-1, 1, 28, 28)
    labels = read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz"), 8)
    x = (torch.from_numpy(images.copy()).float() / 255.0 - MEAN) / STD
    return x.contiguous(), torch.from_numpy(labels.copy()).long()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight_decay", type=float, default=0.01)
    ap.add_argument("--warmup_steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max_steps", type=int, default=0, help="steps per epoch (0 = the whole epoch; smoke tests)")
    ap.add_argument("--test_subset", type=int, default=0, help="test samples evaluated (0 = all 10000)")
    a = ap.parse_args()

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_peer_fashion_mnist: --device %s but torch %s sees no CUDA device" % (a.device, torch.__version__),
              file=sys.stderr)
        return 2
    device = torch.device(a.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print("peer: torch %s on %s (%s), batch %d, AdamW lr %g wd %g, cosine warmup %d" %
          (torch.__version__, device, name, a.batch_size, a.lr, a.weight_decay, a.warmup_steps), flush=True)

    train_x, train_y = load(a.data_dir, True)
    test_x, test_y = load(a.data_dir, False)
    if a.test_subset > 0:
        test_x, test_y = test_x[:a.test_subset], test_y[:a.test_subset]
    torch.manual_seed(a.seed)
    net = Net().to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    steps_per_epoch = train_x.size(0) // a.batch_size  # drop_last
    if a.max_steps > 0:
        steps_per_epoch = min(steps_per_epoch, a.max_steps)
    total = a.epochs * steps_per_epoch

    def schedule(step):  # linear warmup, then cosine to 0 (ColossalAI's CosineAnnealingWarmupLR)
        if step < a.warmup_steps:
            return (step + 1) / a.warmup_steps
        return 0.5 * (1.0 + math.cos(math.pi * (step - a.warmup_steps) / max(1, total - a.warmup_steps)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    gen = torch.Generator().manual_seed(a.seed)
    profiler = StepProfiler()  # BOOSTER_EXAMPLE_PROFILE (gpu_peer_profile.py)
    for epoch in range(1, a.epochs + 1):
        net.train()
        perm = torch.randperm(train_x.size(0), generator=gen)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        loss_sum, samples = 0.0, 0
        for step in range(steps_per_epoch):
            profiler.begin_step((epoch - 1) * steps_per_epoch + step + 1)
            idx = perm[step * a.batch_size:(step + 1) * a.batch_size]
            xb, yb = train_x[idx].to(device), train_y[idx].to(device)
            loss = F.cross_entropy(net(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.item()
            profiler.end_step((epoch - 1) * steps_per_epoch + step + 1)
            samples += xb.size(0)
        seconds = time.perf_counter() - start
        net.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, test_x.size(0), 1000):
                logits = net(test_x[i:i + 1000].to(device))
                correct += logits.argmax(1).eq(test_y[i:i + 1000].to(device)).sum().item()
        print("epoch %d/%d  train_loss %.4f  test_accuracy %.4f  samples/s %.0f  time %.1f s" %
              (epoch, a.epochs, loss_sum / steps_per_epoch, correct / test_x.size(0), samples / seconds, seconds),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
