// device_kernels.cpp — the registry of device optimizer kernels, the per-device grouping of tensors
// and the multi-tensor Adam step over an optimizer's state (contract in booster/optim/device_kernels.h).
#include "booster/optim/device_kernels.h"

#include <ATen/ATen.h>

#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "booster/device.h"

namespace booster::optim {

// A named namespace, not an anonymous one: libbooster is a unity build, and this file shares a
// translation unit with others that have helpers of their own.
namespace device_kernels_detail {

struct Registry {
  std::mutex mutex;
  std::map<c10::DeviceType, std::shared_ptr<const DeviceOptimizerKernels>> entries;
  bool cuda_tried = false;  // find_device_optimizer_kernels tried load_cuda_support once
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: entries may be looked up during exit
  return *r;
}

std::shared_ptr<const DeviceOptimizerKernels> lookup(c10::DeviceType type) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.entries.find(type);
  return it == r.entries.end() ? nullptr : it->second;
}

std::string type_text(c10::DeviceType type) { return c10::DeviceTypeName(type, /*lower_case=*/true); }

std::string describe_tensor(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  return std::string(c10::toString(t.scalar_type())) + " on " + t.device().str() +
         (t.layout() != c10::kStrided ? ", not strided" : (t.is_contiguous() ? "" : ", not contiguous")) + " with " +
         std::to_string(t.numel()) + " elements";
}

bool kernel_dtype(const at::Tensor& t) { return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16; }

// A moment as the kernels take it: float32, contiguous, on param's device, param.numel() elements.
void prepare_moment(at::Tensor& m, const at::Tensor& param, const std::string& who, size_t index, const char* key) {
  if (!m.defined()) {
    m = at::zeros_like(param, at::MemoryFormat::Contiguous);
    return;
  }
  if (m.numel() != param.numel())
    throw std::invalid_argument("booster: " + who + ": parameter " + std::to_string(index) + ": state '" + key +
                                "' has " + std::to_string(m.numel()) + " elements but the parameter has " +
                                std::to_string(param.numel()));
  if (m.device() != param.device() || m.scalar_type() != at::kFloat || m.layout() != c10::kStrided ||
      !m.is_contiguous())
    m = m.to(param.options(), /*non_blocking=*/false, /*copy=*/true).contiguous();
}

}  // namespace device_kernels_detail

namespace dk = device_kernels_detail;

void register_device_optimizer_kernels(c10::DeviceType type, DeviceOptimizerKernels kernels) {
  if (!kernels.adam || !kernels.scale || !kernels.l2norm)
    throw std::invalid_argument("booster: register_device_optimizer_kernels(" + dk::type_text(type) + "): adam, scale "
                                "and l2norm must all be set (\"" + kernels.name + "\" leaves " +
                                (!kernels.adam ? "adam" : !kernels.scale ? "scale" : "l2norm") + " empty)");
  auto entry = std::make_shared<const DeviceOptimizerKernels>(std::move(kernels));
  dk::Registry& r = dk::registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.entries[type] = std::move(entry);
}

void unregister_device_optimizer_kernels(c10::DeviceType type) {
  dk::Registry& r = dk::registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.entries.erase(type);
}

std::shared_ptr<const DeviceOptimizerKernels> device_optimizer_kernels(c10::DeviceType type) {
  if (auto k = dk::lookup(type)) return k;
  if (type == c10::kCUDA) {
    try {
      load_cuda_support();
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("booster: no optimizer kernels for CUDA tensors: ") + e.what());
    }
    if (auto k = dk::lookup(type)) return k;
    throw std::runtime_error("booster: no optimizer kernels for CUDA tensors: CUDA support (libbooster_cuda.so) is "
                             "loaded but registered none (a libbooster_cuda.so older than this libbooster.so? "
                             "rebuild the target booster_cuda)");
  }
  if (type == c10::kCPU)
    throw std::runtime_error("booster: no device optimizer kernels are registered for CPU tensors (CPU parameters "
                             "step through the CPU Adam kernel: use booster::optim::HybridAdam or CPUAdam)");
  throw std::runtime_error("booster: no optimizer kernels are registered for " + dk::type_text(type) +
                           " tensors; a support library of that device must register them with "
                           "booster::optim::register_device_optimizer_kernels (booster/optim/device_kernels.h)");
}

std::shared_ptr<const DeviceOptimizerKernels> find_device_optimizer_kernels(c10::DeviceType type) {
  if (auto k = dk::lookup(type)) return k;
  if (type != c10::kCUDA) return nullptr;
  {
    dk::Registry& r = dk::registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    if (r.cuda_tried) return nullptr;
    r.cuda_tried = true;
  }
  try {
    load_cuda_support();
  } catch (const std::exception&) {
    return nullptr;
  }
  return dk::lookup(type);
}

std::vector<DeviceTensorGroup> group_by_device_kernels(const std::vector<at::Tensor>& tensors) {
  std::vector<DeviceTensorGroup> groups;
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) continue;
    DeviceTensorGroup* g = nullptr;
    for (auto& existing : groups)
      if (existing.device == t.device()) {
        g = &existing;
        break;
      }
    if (g == nullptr) {
      groups.emplace_back();
      g = &groups.back();
      g->device = t.device();
      g->kernels = find_device_optimizer_kernels(t.device().type());
    }
    const bool takes = g->kernels && t.layout() == c10::kStrided && t.is_contiguous() && dk::kernel_dtype(t);
    (takes ? g->kernel_tensors : g->other).push_back(t);
  }
  return groups;
}

void device_adam_step(const DeviceAdamConfig& config, const std::vector<DeviceAdamParam>& params,
                      const std::string& who) {
  // Check everything and prepare the moments first, so a refused parameter changes nothing.
  std::vector<at::Tensor> grads(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const DeviceAdamParam& d = params[i];
    const std::string at_i = "booster: " + who + ": parameter " + std::to_string(i);
    if (!d.step || !d.exp_avg || !d.exp_avg_sq)
      throw std::invalid_argument(at_i + ": the step / exp_avg / exp_avg_sq state pointers must be set");
    const at::Tensor& p = d.param;
    if (!p.defined() || p.device().is_cpu())
      throw std::invalid_argument(at_i + " is " + dk::describe_tensor(p) + ": " + who + " steps device (CUDA) "
                                  "parameters through the device kernels; CPU parameters step with "
                                  "booster::optim::HybridAdam or CPUAdam (the CPU Adam kernel)");
    if (p.scalar_type() != at::kFloat || p.layout() != c10::kStrided || !p.is_contiguous())
      throw std::invalid_argument(at_i + " is " + dk::describe_tensor(p) + ": the device Adam kernel steps contiguous "
                                  "float32 parameters (keep float32 master weights: the booster's mixed precision "
                                  "does), or use torch::optim::AdamW for others");
    const at::Tensor& g = d.grad;
    if (!g.defined() || g.layout() != c10::kStrided || g.device() != p.device() || !dk::kernel_dtype(g) ||
        g.numel() != p.numel())
      throw std::invalid_argument(at_i + ": the gradient must be a float32 or bfloat16 tensor of " +
                                  std::to_string(p.numel()) + " elements on " + p.device().str() + ", got " +
                                  dk::describe_tensor(g));
    grads[i] = g.is_contiguous() ? g : g.contiguous();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    dk::prepare_moment(*params[i].exp_avg, params[i].param, who, i, "exp_avg");
    dk::prepare_moment(*params[i].exp_avg_sq, params[i].param, who, i, "exp_avg_sq");
  }
  // Buckets by (device, step count), in order of first appearance.
  struct Bucket {
    c10::Device device;
    int64_t step;
    std::vector<size_t> members;
  };
  std::vector<Bucket> buckets;
  for (size_t i = 0; i < params.size(); ++i) {
    const c10::Device dev = params[i].param.device();
    const int64_t step = *params[i].step;
    Bucket* b = nullptr;
    for (auto& e : buckets)
      if (e.device == dev && e.step == step) {
        b = &e;
        break;
      }
    if (b == nullptr) {
      buckets.push_back(Bucket{dev, step, {}});
      b = &buckets.back();
    }
    b->members.push_back(i);
  }
  for (const Bucket& b : buckets) {
    auto kernels = device_optimizer_kernels(b.device.type());
    DeviceAdamConfig c = config;
    c.step = b.step + 1;
    DeviceAdamTensors t;
    for (size_t i : b.members) {
      t.params.push_back(params[i].param);
      t.grads.push_back(grads[i]);
      t.exp_avgs.push_back(*params[i].exp_avg);
      t.exp_avg_sqs.push_back(*params[i].exp_avg_sq);
    }
    kernels->adam(c, t, at::Tensor());
    for (size_t i : b.members) *params[i].step = c.step;
  }
}

}  // namespace booster::optim
