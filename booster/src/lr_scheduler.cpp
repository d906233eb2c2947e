// lr_scheduler.cpp — the LRScheduler base (stepping, rebinding, state and its JSON form) and
// make_lr_scheduler (the [train.lr_scheduler] table). The schedulers' formulas are
// lr_schedulers.cpp.
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
#include "lr_scheduler_util.h"

namespace booster {

using namespace lr_detail;

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
