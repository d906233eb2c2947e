// startup_empty_libtorch — the floor of benchmark 6 (start-up): an empty LibTorch program linked to
// LibTorch only. It creates one tensor and prints
//   BENCH_STARTUP {"rank": r, "main_s": ..., "step_s": ..., "checksum": ...}
// where main_s / step_s are the seconds since --t0_ns (the driver's wall clock just before it
// started the process) at main() entry and after the tensor exists. See bench_startup.cpp.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  auto since = [](long long t0) {
    auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::system_clock::now().time_since_epoch()).count();
    return static_cast<double>(now - t0) * 1e-9;
  };
  long long t0 = 0;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--t0_ns") t0 = std::stoll(argv[i + 1]);
  double t_main = since(t0);
  at::Tensor t = at::arange(10, at::kFloat);  // the one tensor: 0 + 1 + ... + 9 = 45
  double sum = t.sum().item<double>();
  double t_done = since(t0);
  const char* rank = std::getenv("RANK");
  std::cout << "BENCH_STARTUP {\"rank\": " << (rank ? rank : "0") << ", \"main_s\": " << t_main
            << ", \"step_s\": " << t_done << ", \"checksum\": " << sum << "}" << std::endl;
  return 0;
}
