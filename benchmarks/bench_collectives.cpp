// bench_collectives — collective bandwidth of our ProcessGroup adapter (booster/dist/process_group.h)
// against raw c10d::ProcessGroupGloo created in the same process with the same Gloo options, and
// against a single-process memcpy (at::Tensor::copy_) of the same bytes.
//
// One rank of a job: the driver (benchmarks/drivers/collectives.py) starts world_size fresh
// processes on 127.0.0.1 with
//   --rank R --world_size W --port P (our store) --raw_port Q (the raw peer's store)
//   --sizes_bytes 1048576,16777216,134217728 --reps N [--sample_bytes 33554432] --out results.json
// Sizes are message sizes in bytes (float32): allreduce of an S-byte tensor; allgather into an
// S-byte output (each rank gives S/W bytes: ours all_gather_into_tensor, raw allgather into views of
// the flat output); reduce-scatter of an S-byte input (ours: the reduce_scatter_tensor = the
// adapter's pairwise exchange; raw: the in-place allreduce of the same buffer + the chunk copy);
// bf16 allreduce of an S-byte bf16 tensor (ours: the adapter's pairwise reduce-scatter + all-gather
// in bf16; raw: cast to float32, allreduce, cast back); AVG allreduce (ours: SUM then a division;
// raw: the same written by hand). The raw column is what LibTorch 1.13's Gloo allowed. The native
// column is LibTorch 2.11 Gloo's own op where it has one: _allgather_base into the flat output,
// _reduce_scatter_base, allreduce of the bf16 tensor, allreduce with ReduceOp::AVG.
// fp8 rows (dist/fp8.h): the float32 allreduce and allgather tensors with float8 e4m3 on the wire
// (ours: fp8_allreduce, fp8_all_gather_into_tensor; peer: the raw float32 op on the same tensor).
//
// Correctness: before timing, every op runs once on every side with known inputs; each rank checks
// ours == raw bit for bit and both == the analytic result, and native == the analytic result (bit
// for bit, except bf16: Gloo sums in bf16, so within one bf16 ulp of the float32 sum rounded once;
// and fp8: ours within fp8.h's error bound of the analytic result, raw equal to it),
// and exits non-zero on a mismatch.
// Timing: ours, raw, native and memcpy are interleaved (the order alternates per repetition); a
// sample is the mean of back-to-back ops worth --sample_bytes (32 MiB) after a barrier, inputs
// refilled outside the timed region; rank 0 writes every sample (seconds per op) to --out. One
// intra-op thread per rank.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <functional>
#include <iostream>

#include "bench_common.h"
#include "booster/dist/fp8.h"
#include "booster/dist/process_group.h"

using namespace booster::bench;
using booster::dist::ProcessGroup;

namespace {

// The raw peer: exactly what the adapter builds for a loopback world (see process_group.cpp).
c10::intrusive_ptr<c10d::ProcessGroupGloo> make_raw(int rank, int ws, int port, double timeout_s) {
  auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = rank == 0;
  so.numWorkers = ws;
  so.waitWorkers = true;
  so.timeout = timeout;
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  opts->threads = 2;
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("raw_world/", store);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, ws, opts);
}

// One collective, as ours and as raw, over buffers allocated once per size.
struct Case {
  std::string op;
  int64_t bytes = 0;
  at::Tensor input;   // this rank's input (never modified)
  at::Tensor work;    // in-place buffer (allreduce) / raw scratch (reduce-scatter)
  at::Tensor output;  // output buffer
  at::Tensor expected;
};

int run(const Args& a) {
  int rank = static_cast<int>(a.integer("rank", 0));
  int ws = static_cast<int>(a.integer("world_size", 2));
  int reps = static_cast<int>(a.integer("reps", 5));
  double timeout_s = a.real("timeout_s", 120);
  int64_t sample_bytes = a.integer("sample_bytes", int64_t(32) << 20);  // bytes per timed sample
  at::set_num_threads(static_cast<int>(a.integer("threads", 1)));

  booster::dist::RendezvousOptions ro;
  ro.port = static_cast<int>(a.integer("port", 29600));
  ro.rank = rank;
  ro.world_size = ws;
  ro.timeout_s = timeout_s;
  auto ours = ProcessGroup::rendezvous(ro);
  auto raw = make_raw(rank, ws, static_cast<int>(a.integer("raw_port", 29601)), timeout_s);
  auto barrier = [&] { raw->barrier()->wait(); };

  std::vector<std::string> results;
  for (int64_t bytes : a.integers("sizes_bytes", "1048576,16777216,134217728")) {
    int64_t n = bytes / 4 / ws * ws;  // float32 elements, divisible by the world size
    int64_t chunk = n / ws;
    // Exactly representable values, so sums are exact and order-independent.
    at::Tensor base = at::arange(n, at::kFloat).remainder_(1024).mul_(0.25);
    at::Tensor reduced = base * static_cast<float>(ws) + static_cast<float>(ws * (ws - 1) / 2);

    std::vector<Case> cases(3);
    cases[0] = {"allreduce", n * 4, base + rank, at::empty({n}), at::Tensor(), reduced};
    cases[1] = {"allgather", n * 4, base.narrow(0, rank * chunk, chunk) + 1000 * rank, at::Tensor(), at::empty({n}),
                at::Tensor()};
    {
      std::vector<at::Tensor> parts;
      for (int r = 0; r < ws; ++r) parts.push_back(base.narrow(0, r * chunk, chunk) + 1000 * r);
      cases[1].expected = at::cat(parts);
    }
    cases[2] = {"reduce_scatter", n * 4, base + rank, at::empty({n}), at::empty({chunk}),
                reduced.narrow(0, rank * chunk, chunk).clone()};
    // Powers of two divide exactly: the average of the exact sums is exact.
    cases.push_back({"allreduce_avg", n * 4, base + rank, at::empty({n}), at::Tensor(), reduced / ws});
    {
      // The same message size in bf16 (twice the elements); the expected value is the float32 sum
      // of the bf16 inputs, rounded once.
      at::Tensor in = (at::arange(2 * n, at::kFloat).remainder_(1024).mul_(0.25) + rank).to(at::kBFloat16);
      at::Tensor sum = at::zeros({2 * n});
      for (int r = 0; r < ws; ++r)
        sum.add_((at::arange(2 * n, at::kFloat).remainder_(1024).mul_(0.25) + r).to(at::kBFloat16).to(at::kFloat));
      cases.push_back({"allreduce_bf16", n * 4, in, at::empty({2 * n}, at::kBFloat16), at::Tensor(),
                       sum.to(at::kBFloat16)});
    }

    // Compressed communication (dist/fp8.h): the float32 tensor of the allreduce / allgather rows
    // with float8 e4m3 on the wire; the peer is the raw float32 op, so the rows compare the same
    // tensors. Checked against the analytic answer within the contract's bound (fp8_bound).
    cases.push_back({"allreduce_fp8", n * 4, base + rank, at::empty({n}), at::Tensor(), reduced});
    cases.push_back({"allgather_fp8", n * 4, cases[1].input, at::Tensor(), at::empty({n}), cases[1].expected});

    // Each side's op, including the untimed refill of in-place buffers.
    auto prepare = [&](Case& c) {
      if (c.work.defined()) c.work.copy_(c.input);
    };
    auto run_ours = [&](Case& c) {
      if (c.op == "allreduce_fp8") booster::dist::fp8_allreduce(*ours, c.work).wait();
      else if (c.op == "allgather_fp8") booster::dist::fp8_all_gather_into_tensor(*ours, c.output, c.input).wait();
      else if (c.op == "allreduce" || c.op == "allreduce_bf16") ours->allreduce(c.work).wait();
      else if (c.op == "allreduce_avg") ours->allreduce(c.work, booster::dist::ReduceOp::AVG).wait();
      else if (c.op == "allgather") ours->all_gather_into_tensor(c.output, c.input).wait();
      else ours->reduce_scatter_tensor(c.output, c.input).wait();
    };
    auto run_raw = [&](Case& c) {
      if (c.op == "allreduce" || c.op == "allreduce_fp8") {
        std::vector<at::Tensor> t{c.work};
        raw->allreduce(t)->wait();
      } else if (c.op == "allgather" || c.op == "allgather_fp8") {
        std::vector<std::vector<at::Tensor>> out(1);
        for (int r = 0; r < ws; ++r) out[0].push_back(c.output.narrow(0, r * chunk, chunk));
        std::vector<at::Tensor> in{c.input};
        raw->allgather(out, in)->wait();
      } else if (c.op == "allreduce_bf16") {
        std::vector<at::Tensor> t{c.work.to(at::kFloat)};
        raw->allreduce(t)->wait();
        c.work.copy_(t[0]);
      } else if (c.op == "allreduce_avg") {
        std::vector<at::Tensor> t{c.work};
        raw->allreduce(t)->wait();
        c.work.div_(ws);
      } else {
        std::vector<at::Tensor> t{c.work};
        raw->allreduce(t)->wait();
        c.output.copy_(c.work.narrow(0, rank * chunk, chunk));
      }
    };
    // LibTorch 2.11 Gloo's own op; false where it has none beyond the raw one (fp32 SUM allreduce).
    auto run_native = [&](Case& c) {
      if (c.op == "allgather") {
        raw->_allgather_base(c.output, c.input)->wait();
      } else if (c.op == "reduce_scatter") {
        raw->_reduce_scatter_base(c.output, c.work)->wait();
      } else if (c.op == "allreduce_bf16") {
        std::vector<at::Tensor> t{c.work};
        raw->allreduce(t)->wait();
      } else if (c.op == "allreduce_avg") {
        std::vector<at::Tensor> t{c.work};
        c10d::AllreduceOptions o;
        o.reduceOp = c10d::ReduceOp::AVG;
        raw->allreduce(t, o)->wait();
      } else {
        return false;
      }
      return true;
    };
    auto result = [&](Case& c) { return c.output.defined() && c.op != "allreduce_bf16" ? c.output : c.work; };

    // memcpy of the same bytes: the single-process limit of moving them once.
    at::Tensor src = at::rand({n}), dst = at::empty({n});

    for (auto& c : cases) {
      // Correctness first: both sides once, compared with each other and with the analytic answer.
      prepare(c);
      run_ours(c);
      at::Tensor got_ours = result(c).clone();
      prepare(c);
      if (c.output.defined()) c.output.zero_();
      run_raw(c);
      at::Tensor got_raw = result(c).clone();
      const bool fp8 = c.op == "allreduce_fp8" || c.op == "allgather_fp8";
      // fp8: every element within 2^-4 of its rank values' and its sum's magnitudes plus the
      // subnormal steps (fp8.h; the inputs here are non-negative, so sum |x_r| = |sum|).
      const bool ours_ok = fp8 ? ((got_ours - c.expected).abs() <=
                                  c.expected.abs() * (c.op == "allreduce_fp8" ? 0.125 : 0.0625) +
                                      c.expected.abs().max() * (1.0 / 1024) * (ws + 1)).all().item<bool>()
                               : at::equal(got_ours, got_raw);
      if (!ours_ok || !at::equal(got_raw, c.expected) || (!fp8 && !at::equal(got_ours, c.expected))) {
        std::cerr << "bench_collectives: rank " << rank << ": " << c.op << " of " << c.bytes
                  << " bytes: ours and raw c10d disagree (max |ours-raw| = "
                  << (got_ours - got_raw).abs().max().item<double>() << ", max |ours-expected| = "
                  << (got_ours - c.expected).abs().max().item<double>() << ")\n";
        return 3;
      }
      prepare(c);
      if (c.output.defined()) c.output.zero_();
      const bool has_native = run_native(c);
      if (has_native) {
        at::Tensor got = result(c).to(at::kFloat), want = c.expected.to(at::kFloat);
        const bool ok = c.op == "allreduce_bf16" ? ((got - want).abs() <= want.abs() * (1.0 / 128)).all().item<bool>()
                                                 : at::equal(got, want);
        if (!ok) {
          std::cerr << "bench_collectives: rank " << rank << ": native " << c.op << " of " << c.bytes
                    << " bytes differs from the analytic answer (max |diff| = " << (got - want).abs().max().item<double>()
                    << ")\n";
          return 3;
        }
      }

      // A sample is `iters` back-to-back ops (about sample_bytes, at least one op) divided by
      // iters, so small messages are not lost in scheduler jitter. Values may grow during a sample
      // (in-place sums); inputs are refilled before each sample, outside the timed region.
      int iters = static_cast<int>(std::max<int64_t>(1, sample_bytes / c.bytes));
      std::vector<double> t_ours, t_raw, t_native, t_copy;
      auto timed = [&](const std::function<void()>& fn, std::vector<double>& out) {
        barrier();
        double t0 = now_s();
        for (int i = 0; i < iters; ++i) fn();
        out.push_back((now_s() - t0) / iters);
      };
      // One untimed warm-up of each, then interleaved repetitions (order alternates).
      prepare(c); run_ours(c); prepare(c); run_raw(c); dst.copy_(src);
      if (has_native) { prepare(c); run_native(c); }
      for (int r = 0; r < reps; ++r) {
        auto do_ours = [&] { prepare(c); timed([&] { run_ours(c); }, t_ours); };
        auto do_raw = [&] { prepare(c); timed([&] { run_raw(c); }, t_raw); };
        auto do_native = [&] { if (has_native) { prepare(c); timed([&] { run_native(c); }, t_native); } };
        if (r % 2 == 0) { do_ours(); do_raw(); do_native(); } else { do_native(); do_raw(); do_ours(); }
        timed([&] { dst.copy_(src); }, t_copy);
      }
      results.push_back(json_obj({{"op", json_str(c.op)}, {"bytes", json_num(static_cast<double>(c.bytes))},
                                  {"ours_s", json_list(t_ours)}, {"raw_s", json_list(t_raw)},
                                  {"native_s", json_list(t_native)},
                                  {"memcpy_s", json_list(t_copy)}, {"check", json_str("ours == raw == expected")}}));
    }
  }
  barrier();
  if (rank == 0 && a.has("out"))
    write_file(a.str("out", ""), json_obj({{"world_size", json_num(ws)},
                                            {"threads", json_num(at::get_num_threads())},
                                            {"results", json_arr(results)}}));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return booster::bench::guarded_main("bench_collectives", [&] { return run(Args(argc, argv)); });
}
