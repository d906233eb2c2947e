// lr_scheduler.cpp — PyTorch 1.13's torch.optim.lr_scheduler (and ColossalAI's warmup schedulers)
// in C++. Every formula keeps Python's order of floating-point operations, so the sequences match
// torch.optim to the last bit or so (tests/unit/lr_scheduler_test.cpp compares them to 1e-12).
#include "booster/lr_scheduler.h"

#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "booster/config.h"

namespace booster {

namespace {

// Python's math.pi (3.141592653589793 is its repr, which round-trips).
constexpr double kPi = 3.141592653589793;

std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  // Prefer the shortest form that round-trips.
  for (int p = 1; p <= 17; ++p) {
    char shorter[40];
    std::snprintf(shorter, sizeof shorter, "%.*g", p, v);
    if (std::strtod(shorter, nullptr) == v) return shorter;
  }
  return buf;
}

[[noreturn]] void invalid(const std::string& msg) { throw std::invalid_argument(msg); }

// Python's a % m for m > 0 (non-negative result).
int64_t py_mod(int64_t a, int64_t m) {
  const int64_t r = a % m;
  return r < 0 ? r + m : r;
}

double extra_double(const std::map<std::string, double>& extra, const std::string& type, const std::string& key) {
  auto it = extra.find(key);
  if (it == extra.end()) invalid(type + "::load_state_dict: the state has no '" + key + "' entry");
  if (!std::isfinite(it->second)) {
    invalid(type + "::load_state_dict: '" + key + "' = " + num(it->second) + " is not a finite number");
  }
  return it->second;
}

int64_t extra_int(const std::map<std::string, double>& extra, const std::string& type, const std::string& key) {
  const double v = extra_double(extra, type, key);
  if (std::trunc(v) != v || std::fabs(v) > 9.0e15) {
    invalid(type + "::load_state_dict: '" + key + "' = " + num(v) + " is not an integer");
  }
  return static_cast<int64_t>(v);
}

// torch.optim.lr_scheduler.CosineAnnealingLR.get_lr (1.13), for epoch >= 0. The branch
// `_step_count == 1 and last_epoch > 0` only applies to a scheduler constructed with
// last_epoch > -1, which this API does not offer.
std::vector<double> cosine_annealing(int64_t epoch, int64_t T_max, double eta_min, const std::vector<double>& base,
                                     const std::vector<double>& current) {
  if (epoch == 0) return current;
  std::vector<double> out(current.size());
  const double T = static_cast<double>(T_max);
  if (py_mod(epoch - 1 - T_max, 2 * T_max) == 0) {
    for (size_t i = 0; i < current.size(); ++i) {
      out[i] = current[i] + (base[i] - eta_min) * (1 - std::cos(kPi / T)) / 2;
    }
    return out;
  }
  const double e = static_cast<double>(epoch);
  const double factor = (1 + std::cos(kPi * e / T)) / (1 + std::cos(kPi * static_cast<double>(epoch - 1) / T));
  for (size_t i = 0; i < current.size(); ++i) out[i] = factor * (current[i] - eta_min) + eta_min;
  return out;
}

void check_gamma(const std::string& type, double gamma) {
  if (!(gamma > 0) || !std::isfinite(gamma)) invalid(type + ": gamma must be > 0, got " + num(gamma));
}

void check_eta_min(const std::string& type, double eta_min) {
  if (!(eta_min >= 0) || !std::isfinite(eta_min)) invalid(type + ": eta_min must be >= 0, got " + num(eta_min));
}

void check_warmup(const std::string& type, int64_t total_steps, int64_t warmup_steps) {
  if (total_steps <= 0) invalid(type + ": total_steps must be > 0, got " + std::to_string(total_steps));
  if (warmup_steps < 0) invalid(type + ": warmup_steps must be >= 0, got " + std::to_string(warmup_steps));
  if (warmup_steps > total_steps) {
    invalid(type + ": warmup_steps (" + std::to_string(warmup_steps) + ") must not exceed total_steps (" +
            std::to_string(total_steps) + ")");
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// LRScheduler

LRScheduler::LRScheduler(torch::optim::Optimizer& optimizer) : optimizer_(&optimizer) { base_lrs_ = group_lrs(); }

LRScheduler::LRScheduler(torch::optim::Optimizer& optimizer, std::vector<double> base_lrs)
    : optimizer_(&optimizer), base_lrs_(std::move(base_lrs)) {
  if (base_lrs_.size() != num_groups()) {
    throw std::logic_error("LRScheduler: " + std::to_string(base_lrs_.size()) + " base lrs for an optimizer with " +
                           std::to_string(num_groups()) + " param groups");
  }
}

LRScheduler::~LRScheduler() = default;

size_t LRScheduler::num_groups() const { return optimizer_->param_groups().size(); }

std::vector<double> LRScheduler::group_lrs() const {
  std::vector<double> lrs;
  lrs.reserve(num_groups());
  for (const auto& group : optimizer_->param_groups()) lrs.push_back(group.options().get_lr());
  return lrs;
}

void LRScheduler::initial_step() {
  last_epoch_ = -1;
  step();
}

void LRScheduler::step() {
  const int64_t epoch = last_epoch_ + 1;
  const std::vector<double> lrs = compute_lr(epoch);
  auto& groups = optimizer_->param_groups();
  if (lrs.size() != groups.size()) {
    throw std::logic_error(type() + "::compute_lr returned " + std::to_string(lrs.size()) + " lrs for " +
                           std::to_string(groups.size()) + " param groups");
  }
  for (size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(lrs[i]);
  last_epoch_ = epoch;
  last_lrs_ = group_lrs();
}

std::vector<double> LRScheduler::get_last_lr() const { return last_lrs_; }
int64_t LRScheduler::last_epoch() const { return last_epoch_; }
const std::vector<double>& LRScheduler::base_lrs() const { return base_lrs_; }
torch::optim::Optimizer& LRScheduler::optimizer() const { return *optimizer_; }

void LRScheduler::rebind(torch::optim::Optimizer& optimizer) {
  const size_t groups = optimizer.param_groups().size();
  if (groups != num_groups()) {
    invalid(type() + "::rebind: the new optimizer has " + std::to_string(groups) +
            " param groups, the scheduler was built for " + std::to_string(num_groups()));
  }
  optimizer_ = &optimizer;
  auto& pg = optimizer_->param_groups();
  for (size_t i = 0; i < pg.size(); ++i) pg[i].options().set_lr(last_lrs_[i]);
}

void LRScheduler::save_extra(std::map<std::string, double>&) const {}
void LRScheduler::load_extra(const std::map<std::string, double>&) {}

SchedulerState LRScheduler::state_dict() const {
  SchedulerState s;
  s.type = type();
  s.last_epoch = last_epoch_;
  s.base_lrs = base_lrs_;
  s.last_lrs = last_lrs_;
  save_extra(s.extra);
  return s;
}

void LRScheduler::load_state_dict(const SchedulerState& state) {
  const std::string mine = type();
  if (state.type != mine) {
    invalid(mine + "::load_state_dict: the state is of a " + (state.type.empty() ? "<no type>" : state.type) +
            ", this scheduler is a " + mine);
  }
  const size_t groups = num_groups();
  if (state.base_lrs.size() != groups || state.last_lrs.size() != groups) {
    invalid(mine + "::load_state_dict: the state has " + std::to_string(state.base_lrs.size()) + " base_lrs and " +
            std::to_string(state.last_lrs.size()) + " last_lrs, the optimizer has " + std::to_string(groups) +
            " param groups");
  }
  if (state.last_epoch < 0) {
    invalid(mine + "::load_state_dict: last_epoch must be >= 0, got " + std::to_string(state.last_epoch));
  }
  for (double v : state.base_lrs) {
    if (!std::isfinite(v)) invalid(mine + "::load_state_dict: base_lrs holds " + num(v));
  }
  for (double v : state.last_lrs) {
    if (!std::isfinite(v)) invalid(mine + "::load_state_dict: last_lrs holds " + num(v));
  }
  load_extra(state.extra);  // validates before it changes anything
  last_epoch_ = state.last_epoch;
  base_lrs_ = state.base_lrs;
  last_lrs_ = state.last_lrs;
  auto& pg = optimizer_->param_groups();
  for (size_t i = 0; i < pg.size(); ++i) pg[i].options().set_lr(last_lrs_[i]);
}

std::string LRScheduler::to_json() const {
  const SchedulerState s = state_dict();
  nlohmann::json j;
  j["type"] = s.type;
  j["last_epoch"] = s.last_epoch;
  j["base_lrs"] = s.base_lrs;
  j["last_lrs"] = s.last_lrs;
  j["extra"] = nlohmann::json::object();
  for (const auto& [k, v] : s.extra) j["extra"][k] = v;
  return j.dump();
}

SchedulerState LRScheduler::from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    invalid(std::string("LRScheduler::from_json: not valid JSON: ") + e.what());
  }
  auto need = [&](const char* key) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key)) {
      invalid(std::string("LRScheduler::from_json: missing \"") + key + "\" (expected the format of to_json())");
    }
    return j.at(key);
  };
  auto numbers = [&](const char* key) {
    const auto& a = need(key);
    if (!a.is_array()) invalid(std::string("LRScheduler::from_json: \"") + key + "\" must be an array of numbers");
    std::vector<double> out;
    for (const auto& v : a) {
      if (!v.is_number()) invalid(std::string("LRScheduler::from_json: \"") + key + "\" must be an array of numbers");
      out.push_back(v.get<double>());
    }
    return out;
  };
  SchedulerState s;
  const auto& type = need("type");
  if (!type.is_string()) invalid("LRScheduler::from_json: \"type\" must be a string");
  s.type = type.get<std::string>();
  const auto& epoch = need("last_epoch");
  if (!epoch.is_number_integer()) invalid("LRScheduler::from_json: \"last_epoch\" must be an integer");
  s.last_epoch = epoch.get<int64_t>();
  s.base_lrs = numbers("base_lrs");
  s.last_lrs = numbers("last_lrs");
  const auto& extra = need("extra");
  if (!extra.is_object()) invalid("LRScheduler::from_json: \"extra\" must be an object of numbers");
  for (const auto& [k, v] : extra.items()) {
    if (!v.is_number()) invalid("LRScheduler::from_json: extra \"" + k + "\" must be a number");
    s.extra[k] = v.get<double>();
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// StepLR

StepLR::StepLR(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  if (step_size <= 0) invalid("StepLR: step_size must be > 0, got " + std::to_string(step_size));
  check_gamma("StepLR", gamma);
  initial_step();
}

std::vector<double> StepLR::compute_lr(int64_t epoch) const {
  std::vector<double> lrs = group_lrs();
  if (epoch == 0 || epoch % step_size_ != 0) return lrs;
  for (double& lr : lrs) lr = lr * gamma_;
  return lrs;
}

void StepLR::save_extra(std::map<std::string, double>& extra) const {
  extra["step_size"] = static_cast<double>(step_size_);
  extra["gamma"] = gamma_;
}

void StepLR::load_extra(const std::map<std::string, double>& extra) {
  const int64_t step_size = extra_int(extra, type(), "step_size");
  const double gamma = extra_double(extra, type(), "gamma");
  if (step_size <= 0) invalid("StepLR::load_state_dict: step_size must be > 0, got " + std::to_string(step_size));
  check_gamma("StepLR::load_state_dict", gamma);
  step_size_ = step_size;
  gamma_ = gamma;
}

// ---------------------------------------------------------------------------------------------
// MultiStepLR

MultiStepLR::MultiStepLR(torch::optim::Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer), gamma_(gamma) {
  check_gamma("MultiStepLR", gamma);
  for (int64_t m : milestones) {
    if (m < 0) invalid("MultiStepLR: milestones must be >= 0, got " + std::to_string(m));
    ++milestones_[m];
  }
  initial_step();
}

std::vector<double> MultiStepLR::compute_lr(int64_t epoch) const {
  std::vector<double> lrs = group_lrs();
  auto it = milestones_.find(epoch);
  if (it == milestones_.end()) return lrs;
  const double factor = std::pow(gamma_, static_cast<double>(it->second));
  for (double& lr : lrs) lr = lr * factor;
  return lrs;
}

void MultiStepLR::save_extra(std::map<std::string, double>& extra) const {
  extra["gamma"] = gamma_;
  for (const auto& [epoch, count] : milestones_) {
    extra["milestone." + std::to_string(epoch)] = static_cast<double>(count);
  }
}

void MultiStepLR::load_extra(const std::map<std::string, double>& extra) {
  const double gamma = extra_double(extra, type(), "gamma");
  check_gamma("MultiStepLR::load_state_dict", gamma);
  std::map<int64_t, int64_t> milestones;
  const std::string prefix = "milestone.";
  for (const auto& [key, value] : extra) {
    if (key.rfind(prefix, 0) != 0) continue;
    const std::string digits = key.substr(prefix.size());
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 15) {
      invalid("MultiStepLR::load_state_dict: bad milestone key '" + key + "'");
    }
    const int64_t count = extra_int(extra, type(), key);
    if (count <= 0) invalid("MultiStepLR::load_state_dict: '" + key + "' must be a count > 0");
    milestones[std::stoll(digits)] = count;
  }
  gamma_ = gamma;
  milestones_ = std::move(milestones);
}

// ---------------------------------------------------------------------------------------------
// ExponentialLR

ExponentialLR::ExponentialLR(torch::optim::Optimizer& optimizer, double gamma) : LRScheduler(optimizer), gamma_(gamma) {
  check_gamma("ExponentialLR", gamma);
  initial_step();
}

std::vector<double> ExponentialLR::compute_lr(int64_t epoch) const {
  std::vector<double> lrs = group_lrs();
  if (epoch == 0) return lrs;
  for (double& lr : lrs) lr = lr * gamma_;
  return lrs;
}

void ExponentialLR::save_extra(std::map<std::string, double>& extra) const { extra["gamma"] = gamma_; }

void ExponentialLR::load_extra(const std::map<std::string, double>& extra) {
  const double gamma = extra_double(extra, type(), "gamma");
  check_gamma("ExponentialLR::load_state_dict", gamma);
  gamma_ = gamma;
}

// ---------------------------------------------------------------------------------------------
// CosineAnnealingLR

CosineAnnealingLR::CosineAnnealingLR(torch::optim::Optimizer& optimizer, int64_t T_max, double eta_min)
    : LRScheduler(optimizer), T_max_(T_max), eta_min_(eta_min) {
  if (T_max <= 0) invalid("CosineAnnealingLR: T_max must be > 0, got " + std::to_string(T_max));
  check_eta_min("CosineAnnealingLR", eta_min);
  initial_step();
}

std::vector<double> CosineAnnealingLR::compute_lr(int64_t epoch) const {
  return cosine_annealing(epoch, T_max_, eta_min_, base_lrs(), group_lrs());
}

void CosineAnnealingLR::save_extra(std::map<std::string, double>& extra) const {
  extra["T_max"] = static_cast<double>(T_max_);
  extra["eta_min"] = eta_min_;
}

void CosineAnnealingLR::load_extra(const std::map<std::string, double>& extra) {
  const int64_t T_max = extra_int(extra, type(), "T_max");
  const double eta_min = extra_double(extra, type(), "eta_min");
  if (T_max <= 0) invalid("CosineAnnealingLR::load_state_dict: T_max must be > 0, got " + std::to_string(T_max));
  check_eta_min("CosineAnnealingLR::load_state_dict", eta_min);
  T_max_ = T_max;
  eta_min_ = eta_min;
}

// ---------------------------------------------------------------------------------------------
// LinearWarmupLR (ColossalAI)

LinearWarmupLR::LinearWarmupLR(torch::optim::Optimizer& optimizer, int64_t total_steps, int64_t warmup_steps)
    : LRScheduler(optimizer), total_steps_(total_steps), warmup_steps_(warmup_steps) {
  check_warmup("LinearWarmupLR", total_steps, warmup_steps);
  initial_step();
}

std::vector<double> LinearWarmupLR::compute_lr(int64_t epoch) const {
  std::vector<double> lrs = base_lrs();
  if (epoch >= total_steps_) {  // ColossalAI's formula would go negative past total_steps
    std::fill(lrs.begin(), lrs.end(), 0.0);
    return lrs;
  }
  const double factor =
      epoch < warmup_steps_
          ? static_cast<double>(epoch + 1) / static_cast<double>(warmup_steps_ + 1)
          : static_cast<double>(total_steps_ - epoch) / static_cast<double>(total_steps_ - warmup_steps_);
  for (double& lr : lrs) lr = factor * lr;
  return lrs;
}

void LinearWarmupLR::save_extra(std::map<std::string, double>& extra) const {
  extra["total_steps"] = static_cast<double>(total_steps_);
  extra["warmup_steps"] = static_cast<double>(warmup_steps_);
}

void LinearWarmupLR::load_extra(const std::map<std::string, double>& extra) {
  const int64_t total = extra_int(extra, type(), "total_steps");
  const int64_t warmup = extra_int(extra, type(), "warmup_steps");
  check_warmup("LinearWarmupLR::load_state_dict", total, warmup);
  total_steps_ = total;
  warmup_steps_ = warmup;
}

// ---------------------------------------------------------------------------------------------
// CosineAnnealingWarmupLR (ColossalAI)

namespace {
void check_cosine_warmup(const std::string& type, int64_t total_steps, int64_t warmup_steps, double eta_min) {
  check_warmup(type, total_steps, warmup_steps);
  if (warmup_steps == total_steps) {
    invalid(type + ": warmup_steps (" + std::to_string(warmup_steps) + ") must be < total_steps (" +
            std::to_string(total_steps) + "): the cosine part has T_max = total_steps - warmup_steps = 0");
  }
  check_eta_min(type, eta_min);
}
}  // namespace

CosineAnnealingWarmupLR::CosineAnnealingWarmupLR(torch::optim::Optimizer& optimizer, int64_t total_steps,
                                                 int64_t warmup_steps, double eta_min)
    : LRScheduler(optimizer), total_steps_(total_steps), warmup_steps_(warmup_steps), eta_min_(eta_min) {
  check_cosine_warmup("CosineAnnealingWarmupLR", total_steps, warmup_steps, eta_min);
  initial_step();
}

std::vector<double> CosineAnnealingWarmupLR::compute_lr(int64_t epoch) const {
  if (epoch >= warmup_steps_) {
    return cosine_annealing(epoch - warmup_steps_, total_steps_ - warmup_steps_, eta_min_, base_lrs(), group_lrs());
  }
  std::vector<double> lrs = base_lrs();
  const double factor = static_cast<double>(epoch + 1) / static_cast<double>(warmup_steps_);
  for (double& lr : lrs) lr = factor * lr;
  return lrs;
}

void CosineAnnealingWarmupLR::save_extra(std::map<std::string, double>& extra) const {
  extra["total_steps"] = static_cast<double>(total_steps_);
  extra["warmup_steps"] = static_cast<double>(warmup_steps_);
  extra["eta_min"] = eta_min_;
}

void CosineAnnealingWarmupLR::load_extra(const std::map<std::string, double>& extra) {
  const int64_t total = extra_int(extra, type(), "total_steps");
  const int64_t warmup = extra_int(extra, type(), "warmup_steps");
  const double eta_min = extra_double(extra, type(), "eta_min");
  check_cosine_warmup("CosineAnnealingWarmupLR::load_state_dict", total, warmup, eta_min);
  total_steps_ = total;
  warmup_steps_ = warmup;
  eta_min_ = eta_min;
}

// ---------------------------------------------------------------------------------------------
// PolynomialLR

namespace {
void check_polynomial(const std::string& type, int64_t total_iters, double power) {
  if (total_iters <= 0) invalid(type + ": total_iters must be > 0, got " + std::to_string(total_iters));
  if (!(power >= 0) || !std::isfinite(power)) invalid(type + ": power must be >= 0, got " + num(power));
}
}  // namespace

PolynomialLR::PolynomialLR(torch::optim::Optimizer& optimizer, int64_t total_iters, double power)
    : LRScheduler(optimizer), total_iters_(total_iters), power_(power) {
  check_polynomial("PolynomialLR", total_iters, power);
  initial_step();
}

std::vector<double> PolynomialLR::compute_lr(int64_t epoch) const {
  std::vector<double> lrs = group_lrs();
  if (epoch == 0 || epoch > total_iters_) return lrs;
  const double T = static_cast<double>(total_iters_);
  const double decay = std::pow((1.0 - static_cast<double>(epoch) / T) / (1.0 - static_cast<double>(epoch - 1) / T),
                                power_);
  for (double& lr : lrs) lr = lr * decay;
  return lrs;
}

void PolynomialLR::save_extra(std::map<std::string, double>& extra) const {
  extra["total_iters"] = static_cast<double>(total_iters_);
  extra["power"] = power_;
}

void PolynomialLR::load_extra(const std::map<std::string, double>& extra) {
  const int64_t total_iters = extra_int(extra, type(), "total_iters");
  const double power = extra_double(extra, type(), "power");
  check_polynomial("PolynomialLR::load_state_dict", total_iters, power);
  total_iters_ = total_iters;
  power_ = power;
}

// ---------------------------------------------------------------------------------------------
// OneCycleLR

namespace {

void check_onecycle(const std::string& type, int64_t total_steps, double pct_start, double div_factor,
                    double final_div_factor) {
  if (total_steps <= 0) invalid(type + ": total_steps must be > 0, got " + std::to_string(total_steps));
  if (!(pct_start >= 0 && pct_start <= 1)) {
    invalid(type + ": pct_start must be a number in [0, 1], got " + num(pct_start));
  }
  if (!(div_factor > 0) || !std::isfinite(div_factor)) {
    invalid(type + ": div_factor must be > 0, got " + num(div_factor));
  }
  if (!(final_div_factor > 0) || !std::isfinite(final_div_factor)) {
    invalid(type + ": final_div_factor must be > 0, got " + num(final_div_factor));
  }
}

bool parse_anneal(const std::string& strategy) {
  if (strategy == "cos") return false;
  if (strategy == "linear") return true;
  invalid("OneCycleLR: anneal_strategy must be \"cos\" or \"linear\", got \"" + strategy + "\"");
}

std::vector<double> initial_lrs(std::vector<double> max_lrs, size_t groups, double div_factor) {
  if (max_lrs.size() != groups) {
    invalid("OneCycleLR: expected " + std::to_string(groups) + " values for max_lr (one per param group), got " +
            std::to_string(max_lrs.size()));
  }
  if (!(div_factor > 0)) invalid("OneCycleLR: div_factor must be > 0, got " + num(div_factor));
  for (double& v : max_lrs) {
    if (!(v > 0) || !std::isfinite(v)) invalid("OneCycleLR: max_lr must be > 0, got " + num(v));
    v = v / div_factor;
  }
  return max_lrs;
}

}  // namespace

std::vector<OneCycleLR::Phase> OneCycleLR::make_phases(int64_t total_steps, double pct_start, bool three_phase) {
  const double T = static_cast<double>(total_steps);
  std::vector<Phase> phases;
  if (three_phase) {
    phases = {{pct_start * T - 1, 0, 1}, {2 * pct_start * T - 2, 1, 0}, {T - 1, 0, 2}};
  } else {
    phases = {{pct_start * T - 1, 0, 1}, {T - 1, 1, 2}};
  }
  double start = 0;
  for (size_t i = 0; i < phases.size(); ++i) {
    if (phases[i].end_step == start) {
      invalid("OneCycleLR: phase " + std::to_string(i + 1) + " of " + std::to_string(phases.size()) +
              " has zero length with total_steps = " + std::to_string(total_steps) +
              " and pct_start = " + num(pct_start) + " (PyTorch would divide by zero); change pct_start");
    }
    start = phases[i].end_step;
  }
  return phases;
}

OneCycleLR::OneCycleLR(torch::optim::Optimizer& optimizer, double max_lr, int64_t total_steps, double pct_start,
                       const std::string& anneal_strategy, double div_factor, double final_div_factor,
                       bool three_phase)
    : OneCycleLR(optimizer, std::vector<double>(optimizer.param_groups().size(), max_lr), total_steps, pct_start,
                 anneal_strategy, div_factor, final_div_factor, three_phase) {}

OneCycleLR::OneCycleLR(torch::optim::Optimizer& optimizer, std::vector<double> max_lrs, int64_t total_steps,
                       double pct_start, const std::string& anneal_strategy, double div_factor,
                       double final_div_factor, bool three_phase)
    : LRScheduler(optimizer, initial_lrs(max_lrs, optimizer.param_groups().size(), div_factor)),
      total_steps_(total_steps),
      pct_start_(pct_start),
      linear_(parse_anneal(anneal_strategy)),
      div_factor_(div_factor),
      final_div_factor_(final_div_factor),
      three_phase_(three_phase),
      max_lrs_(std::move(max_lrs)) {
  check_onecycle("OneCycleLR", total_steps, pct_start, div_factor, final_div_factor);
  phases_ = make_phases(total_steps, pct_start, three_phase);
  for (double initial : base_lrs()) min_lrs_.push_back(initial / final_div_factor);
  initial_step();
}

double OneCycleLR::value(int which, size_t group) const {
  switch (which) {
    case 0:
      return base_lrs()[group];
    case 1:
      return max_lrs_[group];
    default:
      return min_lrs_[group];
  }
}

std::vector<double> OneCycleLR::compute_lr(int64_t epoch) const {
  if (epoch > total_steps_) {
    invalid("OneCycleLR: tried to step " + std::to_string(epoch) + " times; the specified number of total steps is " +
            std::to_string(total_steps_) + " (build the scheduler with a larger total_steps)");
  }
  const double step = static_cast<double>(epoch);
  std::vector<double> lrs(num_groups());
  for (size_t g = 0; g < lrs.size(); ++g) {
    double start_step = 0;
    for (size_t i = 0; i < phases_.size(); ++i) {
      const Phase& phase = phases_[i];
      if (step <= phase.end_step || i + 1 == phases_.size()) {
        const double pct = (step - start_step) / (phase.end_step - start_step);
        const double start = value(phase.start, g);
        const double end = value(phase.end, g);
        if (linear_) {
          lrs[g] = (end - start) * pct + start;
        } else {
          const double cos_out = std::cos(kPi * pct) + 1;
          lrs[g] = end + (start - end) / 2.0 * cos_out;
        }
        break;
      }
      start_step = phase.end_step;
    }
  }
  return lrs;
}

void OneCycleLR::save_extra(std::map<std::string, double>& extra) const {
  extra["total_steps"] = static_cast<double>(total_steps_);
  extra["pct_start"] = pct_start_;
  extra["anneal_strategy"] = linear_ ? 1.0 : 0.0;
  extra["div_factor"] = div_factor_;
  extra["final_div_factor"] = final_div_factor_;
  extra["three_phase"] = three_phase_ ? 1.0 : 0.0;
  for (size_t g = 0; g < max_lrs_.size(); ++g) {
    extra["max_lr." + std::to_string(g)] = max_lrs_[g];
    extra["min_lr." + std::to_string(g)] = min_lrs_[g];
  }
}

void OneCycleLR::load_extra(const std::map<std::string, double>& extra) {
  const std::string t = type() + "::load_state_dict";
  const int64_t total_steps = extra_int(extra, type(), "total_steps");
  const double pct_start = extra_double(extra, type(), "pct_start");
  const int64_t anneal = extra_int(extra, type(), "anneal_strategy");
  const double div_factor = extra_double(extra, type(), "div_factor");
  const double final_div_factor = extra_double(extra, type(), "final_div_factor");
  const int64_t three_phase = extra_int(extra, type(), "three_phase");
  check_onecycle(t, total_steps, pct_start, div_factor, final_div_factor);
  if (anneal != 0 && anneal != 1) invalid(t + ": anneal_strategy must be 0 (cos) or 1 (linear)");
  if (three_phase != 0 && three_phase != 1) invalid(t + ": three_phase must be 0 or 1");
  std::vector<double> max_lrs, min_lrs;
  for (size_t g = 0; g < num_groups(); ++g) {
    max_lrs.push_back(extra_double(extra, type(), "max_lr." + std::to_string(g)));
    min_lrs.push_back(extra_double(extra, type(), "min_lr." + std::to_string(g)));
  }
  std::vector<Phase> phases = make_phases(total_steps, pct_start, three_phase == 1);
  total_steps_ = total_steps;
  pct_start_ = pct_start;
  linear_ = anneal == 1;
  div_factor_ = div_factor;
  final_div_factor_ = final_div_factor;
  three_phase_ = three_phase == 1;
  max_lrs_ = std::move(max_lrs);
  min_lrs_ = std::move(min_lrs);
  phases_ = std::move(phases);
}

// ---------------------------------------------------------------------------------------------
// LambdaLR

namespace {
std::vector<LambdaLR::Lambda> check_lambdas(std::vector<LambdaLR::Lambda> lambdas, size_t groups) {
  if (lambdas.size() != groups) {
    invalid("LambdaLR: expected " + std::to_string(groups) + " lr_lambdas (one per param group), got " +
            std::to_string(lambdas.size()));
  }
  for (const auto& f : lambdas) {
    if (!f) invalid("LambdaLR: lr_lambda is empty");
  }
  return lambdas;
}
}  // namespace

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, Lambda lr_lambda)
    : LambdaLR(optimizer, std::vector<Lambda>(optimizer.param_groups().size(), std::move(lr_lambda))) {}

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, std::vector<Lambda> lr_lambdas)
    : LRScheduler(optimizer), lambdas_(check_lambdas(std::move(lr_lambdas), optimizer.param_groups().size())) {
  initial_step();
}

std::vector<double> LambdaLR::compute_lr(int64_t epoch) const {
  std::vector<double> lrs = base_lrs();
  for (size_t i = 0; i < lrs.size(); ++i) lrs[i] = lrs[i] * lambdas_[i](epoch);
  return lrs;
}

// ---------------------------------------------------------------------------------------------
// make_lr_scheduler

namespace {

std::vector<int64_t> parse_milestones(const std::string& text, const std::string& full_key) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto b = item.find_first_not_of(" \t");
    const auto e = item.find_last_not_of(" \t");
    const std::string tok = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    if (tok.empty() || tok.find_first_not_of("0123456789") != std::string::npos || tok.size() > 15) {
      throw ConfigError(full_key + " = \"" + text + "\": \"" + tok +
                        "\" is not a non-negative integer; write the epochs comma-separated, e.g. \"30,80\"");
    }
    out.push_back(std::stoll(tok));
  }
  if (out.empty()) throw ConfigError(full_key + " is empty; write the epochs comma-separated, e.g. \"30,80\"");
  return out;
}

}  // namespace

std::shared_ptr<LRScheduler> make_lr_scheduler(const Options& section, torch::optim::Optimizer& optimizer,
                                               int64_t total_steps) {
  const std::string prefix = section.section().empty() ? std::string() : section.section() + ".";
  const std::vector<std::string> names = {
      "none",   "step",          "multistep",         "exponential",       "cosine",
      "linear_warmup",           "cosine_warmup",     "polynomial",        "onecycle",
      "StepLR", "MultiStepLR",   "ExponentialLR",     "CosineAnnealingLR", "LinearWarmupLR",
      "CosineAnnealingWarmupLR", "PolynomialLR",      "OneCycleLR"};
  static const std::map<std::string, std::string> canonical = {
      {"StepLR", "step"},
      {"MultiStepLR", "multistep"},
      {"ExponentialLR", "exponential"},
      {"CosineAnnealingLR", "cosine"},
      {"LinearWarmupLR", "linear_warmup"},
      {"CosineAnnealingWarmupLR", "cosine_warmup"},
      {"PolynomialLR", "polynomial"},
      {"OneCycleLR", "onecycle"}};
  std::string name = section.get_choice("name", "none", names);
  if (auto it = canonical.find(name); it != canonical.end()) name = it->second;

  const auto require = [&](const std::string& key) {
    if (!section.has(key)) {
      throw ConfigError(prefix + key + " is required for lr scheduler name = \"" + name + "\"");
    }
  };
  const auto steps = [&]() {
    const int64_t t = section.get_int("total_steps", total_steps);
    if (t <= 0) {
      throw ConfigError("lr scheduler \"" + name + "\" needs the number of training steps: set " + prefix +
                        "total_steps = <n> (got " + std::to_string(t) + ")");
    }
    return t;
  };

  // Read everything first, then check for unknown keys, and only then build the scheduler (whose
  // constructor writes the optimizer's lr).
  std::function<std::shared_ptr<LRScheduler>()> build;
  if (name == "step") {
    require("step_size");
    const int64_t step_size = section.get_int("step_size", 1, 1);
    const double gamma = section.get_double("gamma", 0.1, 1e-300);
    build = [&, step_size, gamma] { return std::make_shared<StepLR>(optimizer, step_size, gamma); };
  } else if (name == "multistep") {
    require("milestones");
    std::string text;
    try {
      text = section.get_string("milestones", "");
    } catch (const ConfigError& e) {
      throw ConfigError(std::string(e.what()) +
                        " (milestones is a comma-separated string, e.g. milestones = \"30,80\")");
    }
    const auto milestones = parse_milestones(text, prefix + "milestones");
    const double gamma = section.get_double("gamma", 0.1, 1e-300);
    build = [&, milestones, gamma] { return std::make_shared<MultiStepLR>(optimizer, milestones, gamma); };
  } else if (name == "exponential") {
    require("gamma");
    const double gamma = section.get_double("gamma", 0.1, 1e-300);
    build = [&, gamma] { return std::make_shared<ExponentialLR>(optimizer, gamma); };
  } else if (name == "cosine") {
    const int64_t T_max = section.has("T_max") ? section.get_int("T_max", 1, 1) : steps();
    section.mark_known({"total_steps"});
    const double eta_min = section.get_double("eta_min", 0.0, 0.0);
    build = [&, T_max, eta_min] { return std::make_shared<CosineAnnealingLR>(optimizer, T_max, eta_min); };
  } else if (name == "linear_warmup") {
    const int64_t total = steps();
    const int64_t warmup = section.get_int("warmup_steps", 0, 0);
    build = [&, total, warmup] { return std::make_shared<LinearWarmupLR>(optimizer, total, warmup); };
  } else if (name == "cosine_warmup") {
    const int64_t total = steps();
    const int64_t warmup = section.get_int("warmup_steps", 0, 0);
    const double eta_min = section.get_double("eta_min", 0.0, 0.0);
    build = [&, total, warmup, eta_min] {
      return std::make_shared<CosineAnnealingWarmupLR>(optimizer, total, warmup, eta_min);
    };
  } else if (name == "polynomial") {
    const int64_t total_iters = section.has("total_iters") ? section.get_int("total_iters", 1, 1) : steps();
    section.mark_known({"total_steps"});
    const double power = section.get_double("power", 1.0, 0.0);
    build = [&, total_iters, power] { return std::make_shared<PolynomialLR>(optimizer, total_iters, power); };
  } else if (name == "onecycle") {
    const int64_t total = steps();
    std::vector<double> max_lrs;
    if (section.has("max_lr")) {
      max_lrs.assign(optimizer.param_groups().size(), section.get_double("max_lr", 0.1, 1e-300));
    } else {
      section.mark_known({"max_lr"});
      for (const auto& group : optimizer.param_groups()) max_lrs.push_back(group.options().get_lr());
    }
    const double pct_start = section.get_double("pct_start", 0.3, 0.0, 1.0);
    const std::string anneal = section.get_choice("anneal_strategy", "cos", {"cos", "linear"});
    const double div_factor = section.get_double("div_factor", 25.0, 1e-300);
    const double final_div_factor = section.get_double("final_div_factor", 1e4, 1e-300);
    const bool three_phase = section.get_bool("three_phase", false);
    build = [&, total, max_lrs, pct_start, anneal, div_factor, final_div_factor, three_phase] {
      return std::make_shared<OneCycleLR>(optimizer, max_lrs, total, pct_start, anneal, div_factor,
                                          final_div_factor, three_phase);
    };
  }
  section.check_unknown();
  if (!build) return nullptr;  // "none"
  try {
    return build();
  } catch (const std::invalid_argument& e) {
    const std::string where = section.section().empty() ? std::string() : "[" + section.section() + "] ";
    throw ConfigError(where + "lr scheduler \"" + name + "\": " + e.what());
  }
}

}  // namespace booster
