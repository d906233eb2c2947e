// lr_schedulers.cpp — PyTorch 2.11's torch.optim.lr_scheduler (and ColossalAI's warmup schedulers)
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

#include "lr_scheduler_util.h"

namespace booster {

using namespace lr_detail;

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
  return cosine_annealing(epoch, T_max_, eta_min_, base_lrs(), group_lrs(), /*initial=*/epoch == 0);
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
    // The inner CosineAnnealingLR was made before the warmup scheduler's own initial step, so none of
    // its epochs is its initial step: at the hand-over (epoch == warmup_steps) torch 2.11 gives
    // 2 / (1 + cos(pi / T_max)) times the current lr (0.10003 for 0.1 at T_max 90), not the lr itself.
    return cosine_annealing(epoch - warmup_steps_, total_steps_ - warmup_steps_, eta_min_, base_lrs(), group_lrs(),
                            /*initial=*/false);
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

}  // namespace booster
