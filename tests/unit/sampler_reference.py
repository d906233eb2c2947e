#!/usr/bin/env python3
# sampler_reference.py — reference indices from PyTorch's torch.utils.data.DistributedSampler, for
# data_test.cpp. Each argument is one case "n,num_replicas,rank,shuffle,seed,epoch,drop_last"
# (shuffle/drop_last 0 or 1); prints one line per case, "ref <case>:" then the rank's indices
# space-separated (the prefix lets the test skip anything else on the output, e.g. warnings).
import sys

import torch
from torch.utils.data.distributed import DistributedSampler


class _Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def main():
    for case in sys.argv[1:]:
        n, replicas, rank, shuffle, seed, epoch, drop_last = (int(v) for v in case.split(","))
        sampler = DistributedSampler(_Sized(n), num_replicas=replicas, rank=rank,
                                     shuffle=bool(shuffle), seed=seed, drop_last=bool(drop_last))
        sampler.set_epoch(epoch)
        print("ref %s:" % case + "".join(" %d" % i for i in sampler))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
