// bf16_speed.h — whether bf16 compute pays on this CPU. LibTorch 1.13 computes bfloat16 matrix
// products fast only where oneDNN has bf16 kernels (AVX-512); elsewhere (e.g. an AVX2-only CPU) they
// go through a reference path, measured 14x slower than float32 for a [2048, 256] x [256, 1024]
// product on an AVX2 AMD EPYC, so a bf16 run there trains many times slower than in float32.
// Internal to libbooster: boost() warns when the model it configured computes in bf16 on such a CPU.
#pragma once

namespace booster::mixed_precision {

// Time of a bfloat16 [256, 256] x [256, 256] CPU matrix product over that of the float32 one (best of
// 3 timings each, this thread's intra-op threads), e.g. 1.0-2.0 with AVX-512, 10+ without. Takes
// about 1 ms with AVX-512 and 20 ms without. Never throws; returns 0 if a timing was 0.
double bf16_matmul_slowdown();

// Logs a warning naming `slowdown`, the cause and the fix (precision "fp32") when slowdown exceeds
// `threshold`, at most once per process. Returns whether it warned (now or before).
bool warn_if_bf16_is_slow(double slowdown, double threshold = 4.0);

}  // namespace booster::mixed_precision
