// fp8.cpp — float8 e4m3 quantization and the compressed collectives (see booster/dist/fp8.h).
#include "booster/dist/fp8.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Float8_e4m3fn.h>

#include <array>
#include <cfloat>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "process_group_impl.h"

namespace booster::dist {

namespace fp8_detail {

void check_floating(const at::Tensor& t, const char* op) {
  if (!t.defined() || !at::isFloatingType(t.scalar_type()))
    throw DistError(std::string("booster: ") + op + " needs a floating tensor (float32, bfloat16 or float16), got " +
                    (t.defined() ? std::string(c10::toString(t.scalar_type())) : std::string("an undefined tensor")));
  if (!t.is_contiguous()) throw DistError(std::string("booster: ") + op + ": tensor must be contiguous");
}

// A Work that waits for `inner`, then runs `finish`; is_completed() is `ready()`.
Work chained(Work inner, std::function<void(Work&)> finish, std::function<bool(const Work&)> ready) {
  auto impl = std::make_shared<Work::Impl>();
  auto held = std::make_shared<Work>(std::move(inner));
  impl->ready = [held, ready = std::move(ready)]() { return ready(*held); };
  impl->finish = [held, finish = std::move(finish)]() { finish(*held); };
  return Work(impl);
}

// Per-rank byte counts of pieces of `counts` elements on the wire (0 for an empty piece).
std::vector<int64_t> wire_counts(const std::vector<int64_t>& counts) {
  std::vector<int64_t> w(counts.size());
  for (size_t r = 0; r < counts.size(); ++r) w[r] = counts[r] > 0 ? fp8_wire_bytes(counts[r]) : 0;
  return w;
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> o(counts.size() + 1, 0);
  for (size_t r = 0; r < counts.size(); ++r) o[r + 1] = o[r] + counts[r];
  return o;
}

// CPU path: single passes over the data with c10's own e4m3fn
// conversions (the same bits as Tensor::to), instead of a chain of ATen ops with temporaries.
constexpr int64_t kGrain = 1 << 15;

float amax_finite(const float* x, int64_t n) {
  return at::parallel_reduce(0, n, kGrain, 0.0f, [x](int64_t b, int64_t e, float m) {
    for (int64_t i = b; i < e; ++i) {
      const float v = std::fabs(x[i]);
      m = (v <= FLT_MAX && v > m) ? v : m;  // NaN and inf fail the first test
    }
    return m;
  }, [](float a, float b) { return std::max(a, b); });
}

void quantize_cpu(const float* x, uint8_t* q, int64_t n, float scale) {
  at::parallel_for(0, n, kGrain, [=](int64_t b, int64_t e) {
    const float lim = static_cast<float>(kFp8E4M3Max);
    for (int64_t i = b; i < e; ++i) {
      const float v = x[i];
      q[i] = std::isfinite(v) ? c10::detail::fp8e4m3fn_from_fp32_value(std::min(std::max(v / scale, -lim), lim))
                              : c10::detail::fp8e4m3fn_from_fp32_value(std::numeric_limits<float>::quiet_NaN());
    }
  });
}

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[static_cast<size_t>(b)] = c10::detail::fp8e4m3fn_to_fp32_value(static_cast<uint8_t>(b));
    return t;
  }();
  return table;
}

void dequantize_cpu(const uint8_t* q, float* out, int64_t n, float scale) {
  const std::array<float, 256>& t = e4m3_table();
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = t[q[i]] * scale;
  });
}

}  // namespace fp8_detail

at::Tensor fp8_scale(const at::Tensor& x) {
  const at::TensorOptions opts = x.options().dtype(at::kFloat);
  if (x.numel() == 0) return at::ones({1}, opts);
  if (x.device().is_cpu()) {
    const at::Tensor xf = x.to(at::kFloat).contiguous();
    const float amax = fp8_detail::amax_finite(xf.data_ptr<float>(), xf.numel());
    return at::full({1}, amax > 0 ? amax / static_cast<float>(kFp8E4M3Max) : 1.0f, opts);
  }
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor amax = at::where(at::isfinite(xf), xf.abs(), at::zeros({}, opts)).amax().reshape({1});
  return at::where(amax > 0, amax / kFp8E4M3Max, at::ones({1}, opts));
}

at::Tensor quantize_fp8(const at::Tensor& x, const at::Tensor& scale) {
  if (!x.defined() || !at::isFloatingType(x.scalar_type()))
    throw std::invalid_argument("booster: quantize_fp8 needs a floating tensor");
  if (x.device().is_cpu() && scale.device().is_cpu()) {
    const at::Tensor xf = x.to(at::kFloat).contiguous();
    at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
    fp8_detail::quantize_cpu(xf.data_ptr<float>(), static_cast<uint8_t*>(q.data_ptr()), x.numel(),
                             scale.to(at::kFloat).item<float>());
    return q;
  }
  const at::Tensor xf = x.to(at::kFloat);
  at::Tensor y = (xf / scale.to(at::kFloat)).clamp(-kFp8E4M3Max, kFp8E4M3Max);
  y = at::where(at::isfinite(xf), y, at::full({}, std::numeric_limits<float>::quiet_NaN(), xf.options()));
  return y.to(at::kFloat8_e4m3fn);
}

at::Tensor dequantize_fp8(const at::Tensor& q, const at::Tensor& scale, at::ScalarType dtype) {
  if (q.device().is_cpu() && q.is_contiguous() && scale.device().is_cpu()) {
    at::Tensor out = at::empty(q.sizes(), q.options().dtype(at::kFloat));
    fp8_detail::dequantize_cpu(static_cast<const uint8_t*>(q.data_ptr()), out.data_ptr<float>(), q.numel(),
                               scale.to(at::kFloat).item<float>());
    return dtype == at::kFloat ? out : out.to(dtype);
  }
  at::Tensor y = q.to(at::kFloat) * scale.to(at::kFloat);
  return dtype == at::kFloat ? y : y.to(dtype);
}

void pack_fp8(const at::Tensor& x, at::Tensor wire) {
  const int64_t n = x.numel();
  if (wire.scalar_type() != at::kByte || !wire.is_contiguous() || wire.numel() != fp8_wire_bytes(n))
    throw std::invalid_argument("booster: pack_fp8 needs a contiguous uint8 wire buffer of " +
                                std::to_string(fp8_wire_bytes(n)) + " bytes, got " + std::to_string(wire.numel()));
  const at::Tensor flat = x.reshape({-1});
  const at::Tensor scale = fp8_scale(flat);
  wire.narrow(0, 0, n).copy_(quantize_fp8(flat, scale).view(at::kByte));
  wire.narrow(0, n, 4).copy_(scale.view(at::kByte));
}

at::Tensor unpack_fp8(const at::Tensor& wire, at::ScalarType dtype) {
  if (wire.scalar_type() != at::kByte || wire.dim() != 1 || wire.numel() < 4)
    throw std::invalid_argument("booster: unpack_fp8 needs a 1-D uint8 piece of at least 4 bytes");
  const int64_t n = wire.numel() - 4;
  const at::Tensor scale = wire.narrow(0, n, 4).clone().view(at::kFloat);
  return dequantize_fp8(wire.narrow(0, 0, n).view(at::kFloat8_e4m3fn), scale, dtype);
}

Work fp8_reduce_scatter_in_place(ProcessGroup& group, at::Tensor& buffer, const std::vector<int64_t>& counts) {
  using namespace fp8_detail;
  check_floating(buffer, "fp8_reduce_scatter_in_place");
  const int size = group.size(), rank = group.rank();
  if (static_cast<int>(counts.size()) != size)
    throw DistError("booster: fp8_reduce_scatter_in_place needs one count per rank (" + std::to_string(size) + "), got " +
                    std::to_string(counts.size()));
  const std::vector<int64_t> offsets = offsets_of(counts);
  for (int64_t c : counts)
    if (c < 0) throw DistError("booster: fp8_reduce_scatter_in_place: negative count " + std::to_string(c));
  if (offsets.back() != buffer.numel())
    throw DistError("booster: fp8_reduce_scatter_in_place: the counts add up to " + std::to_string(offsets.back()) +
                    " elements but the buffer has " + std::to_string(buffer.numel()));
  const size_t me = static_cast<size_t>(rank);
  at::Tensor flat = buffer.view({-1});
  at::NoGradGuard no_grad;
  // Rank p receives range p (and this rank's scale) from every other rank; nothing to itself.
  std::vector<int64_t> send(static_cast<size_t>(size), 0), recv(static_cast<size_t>(size), 0);
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    send[static_cast<size_t>(p)] = counts[static_cast<size_t>(p)] > 0 ? fp8_wire_bytes(counts[static_cast<size_t>(p)]) : 0;
    recv[static_cast<size_t>(p)] = counts[me] > 0 ? fp8_wire_bytes(counts[me]) : 0;
  }
  const std::vector<int64_t> send_off = offsets_of(send), recv_off = offsets_of(recv);
  const at::TensorOptions bytes = flat.options().dtype(at::kByte);
  at::Tensor wire_in = at::empty({send_off.back()}, bytes);
  if (send_off.back() > 0) {
    const at::Tensor scale = fp8_scale(flat);
    const at::Tensor q = quantize_fp8(flat, scale).view(at::kByte);
    const at::Tensor scale_bytes = scale.view(at::kByte);
    for (int p = 0; p < size; ++p) {
      const size_t k = static_cast<size_t>(p);
      if (send[k] == 0) continue;
      wire_in.narrow(0, send_off[k], counts[k]).copy_(q.narrow(0, offsets[k], counts[k]));
      wire_in.narrow(0, send_off[k] + counts[k], 4).copy_(scale_bytes);
    }
  }
  at::Tensor wire_out = at::empty({recv_off.back()}, bytes);
  Work inner = size > 1 ? group.all_to_all_single(wire_out, wire_in, recv, send) : Work();
  at::Tensor mine = flat.narrow(0, offsets[me], counts[me]);
  return chained(std::move(inner), [wire_in, wire_out, recv, recv_off, mine, rank, size](Work& w) mutable {
    w.wait();
    if (mine.numel() == 0) return;
    at::NoGradGuard no_grad;
    at::Tensor acc;
    for (int r = 0; r < size; ++r) {
      const size_t k = static_cast<size_t>(r);
      at::Tensor piece = r == rank ? mine.to(at::kFloat) : unpack_fp8(wire_out.narrow(0, recv_off[k], recv[k]), at::kFloat);
      if (!acc.defined()) acc = r == rank ? piece.clone() : piece;
      else acc.add_(piece);
    }
    mine.copy_(acc);
  }, [](const Work& w) { return w.is_completed(); });
}

Work fp8_allreduce(ProcessGroup& group, at::Tensor& tensor) {
  using namespace fp8_detail;
  check_floating(tensor, "fp8_allreduce");
  if (group.size() == 1) return Work();
  const std::vector<int64_t> counts = ProcessGroup::even_counts(tensor.numel(), group.size());
  Work scatter = fp8_reduce_scatter_in_place(group, tensor, counts);
  at::Tensor flat = tensor.view({-1});
  ProcessGroup* g = &group;
  return chained(std::move(scatter), [g, flat, counts](Work& w) mutable {
    w.wait();
    at::NoGradGuard no_grad;
    const std::vector<int64_t> offsets = offsets_of(counts), wire = wire_counts(counts), wire_off = offsets_of(wire);
    const size_t me = static_cast<size_t>(g->rank());
    at::Tensor buf = at::empty({wire_off.back()}, flat.options().dtype(at::kByte));
    if (counts[me] > 0) pack_fp8(flat.narrow(0, offsets[me], counts[me]), buf.narrow(0, wire_off[me], wire[me]));
    g->all_gather_in_place(buf, wire).wait();
    for (size_t r = 0; r < counts.size(); ++r)
      if (counts[r] > 0)
        flat.narrow(0, offsets[r], counts[r]).copy_(unpack_fp8(buf.narrow(0, wire_off[r], wire[r]), flat.scalar_type()));
  }, [](const Work&) { return false; });
}

Work fp8_all_gather_into_tensor(ProcessGroup& group, at::Tensor& output, const at::Tensor& input) {
  using namespace fp8_detail;
  check_floating(output, "fp8_all_gather_into_tensor");
  if (!input.defined() || !at::isFloatingType(input.scalar_type()))
    throw DistError("booster: fp8_all_gather_into_tensor needs a floating input");
  const int size = group.size();
  const int64_t n = input.numel();
  if (output.numel() != n * size)
    throw DistError("booster: fp8_all_gather_into_tensor needs an output of numel " + std::to_string(n * size) +
                    ", got " + std::to_string(output.numel()));
  at::NoGradGuard no_grad;
  const at::TensorOptions bytes = output.options().dtype(at::kByte);
  at::Tensor wire_in = at::empty({fp8_wire_bytes(n)}, bytes);
  pack_fp8(input, wire_in);  // before the collective: input may be a chunk of output
  at::Tensor wire_out = at::empty({fp8_wire_bytes(n) * size}, bytes);
  Work inner = group.all_gather_into_tensor(wire_out, wire_in);
  at::Tensor flat = output.view({-1});
  return chained(std::move(inner), [wire_in, wire_out, flat, n, size](Work& w) mutable {
    w.wait();
    at::NoGradGuard no_grad;
    for (int r = 0; r < size; ++r)
      flat.narrow(0, r * n, n).copy_(unpack_fp8(wire_out.narrow(0, r * fp8_wire_bytes(n), fp8_wire_bytes(n)), flat.scalar_type()));
  }, [](const Work& w) { return w.is_completed(); });
}

}  // namespace booster::dist
