// lr_scheduler.h — learning-rate schedulers with PyTorch's names, arguments and arithmetic.
//
// LibTorch's C++ API has few schedulers. This family reproduces Python torch 2.11's
// torch.optim.lr_scheduler step by step (same formulas, same order of floating-point operations,
// so the lr sequences equal Python's bit for bit when both use the same libm), plus ColossalAI's
// LinearWarmupLR and CosineAnnealingWarmupLR (colossalai/nn/lr_scheduler/). The unit test
// compares every scheduler with Python over 150 steps (tests/unit/lr_scheduler_reference.py).
//
// Usage, as in PyTorch: construct after the optimizer (the constructor performs the initial step,
// so the optimizer holds the epoch-0 lr), call step() once per iteration after optimizer.step().
//
//   torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
//   booster::CosineAnnealingLR sched(opt, /*T_max=*/1000);
//   for (...) { ...; opt.step(); sched.step(); }
//
// Like PyTorch, the "chainable" schedulers (StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR,
// PolynomialLR, the cosine part of CosineAnnealingWarmupLR) compute the new lr from the lr the
// optimizer currently holds, so a change made to the optimizer's lr from outside composes with
// the schedule exactly as in PyTorch. The others compute it from base_lrs.
//
// Differences from PyTorch, all deliberate:
//  - load_state_dict() and rebind() also write last_lrs into the optimizer's param groups (PyTorch
//    leaves that to the optimizer's state dict), so resuming works whatever the load order.
//  - Hyperparameters live in SchedulerState::extra as numbers; load_state_dict() restores them,
//    as PyTorch's __dict__.update does. LambdaLR's functions are not part of the state (as PyTorch
//    does for plain functions/lambdas).
//  - step() is exception-safe: a step that throws (OneCycleLR past total_steps) changes nothing.
//  - No `last_epoch` constructor argument and no step(epoch) (both deprecated upstream): a
//    schedule is resumed through load_state_dict().
//
// Writing your own: derive from LRScheduler, implement type() and compute_lr(), and call
// initial_step() at the end of your constructor (a base constructor cannot call virtuals).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "booster/export.h"

// Forward declaration keeps this header light; include <torch/optim/optimizer.h> (or any
// optimizer header) to construct a scheduler.
namespace torch {
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace booster {

class Options;

// The serializable state of a scheduler (PyTorch's state_dict()).
//   type        the class name ("StepLR", "OneCycleLR", ...); load_state_dict() checks it.
//   last_epoch  number of step() calls since construction (0 right after construction).
//   base_lrs    PyTorch's base_lrs (initial_lr of each param group).
//   last_lrs    get_last_lr(): the lr of each group after the last step.
//   extra       the scheduler's hyperparameters and per-group values by name (integers and
//               booleans stored as exact doubles); documented on each class.
struct SchedulerState {
  std::string type;
  int64_t last_epoch = 0;
  std::vector<double> base_lrs;
  std::vector<double> last_lrs;
  std::map<std::string, double> extra;
};

// Base class: PyTorch's torch.optim.lr_scheduler._LRScheduler. Holds a non-owning pointer to the
// optimizer, which must outlive the scheduler (or be replaced through rebind()).
class BOOSTER_API LRScheduler {
 public:
  virtual ~LRScheduler();
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // The class name, also SchedulerState::type ("StepLR", ...).
  virtual std::string type() const = 0;

  // Advances last_epoch by one and writes the new lr into every param group.
  void step();
  // The lr of each param group after the last step (PyTorch's get_last_lr()).
  std::vector<double> get_last_lr() const;
  int64_t last_epoch() const;
  const std::vector<double>& base_lrs() const;
  torch::optim::Optimizer& optimizer() const;

  // Points the scheduler at another optimizer (e.g. one a plugin built around sharded parameters)
  // and writes get_last_lr() into its param groups, so the schedule continues where it was.
  // Throws std::invalid_argument if the number of param groups differs.
  void rebind(torch::optim::Optimizer& optimizer);

  SchedulerState state_dict() const;
  // Restores last_epoch, base_lrs, last_lrs and the hyperparameters in `extra`, then writes
  // last_lrs into the optimizer. Throws std::invalid_argument (changing nothing) when the type or
  // the number of param groups differs (naming both), or an extra entry is missing or invalid.
  void load_state_dict(const SchedulerState& state);

  // state_dict() as JSON: {"type":..,"last_epoch":..,"base_lrs":[..],"last_lrs":[..],"extra":{..}}.
  // Doubles are written with 17 significant digits, so from_json(to_json()) is exact.
  std::string to_json() const;
  // Parses to_json()'s format; throws std::invalid_argument on malformed JSON or missing fields.
  static SchedulerState from_json(const std::string& json);

 protected:
  // Records base_lrs = the current lr of each param group (PyTorch's initial_lr).
  explicit LRScheduler(torch::optim::Optimizer& optimizer);
  // Records the given base_lrs (one per param group; OneCycleLR uses max_lr / div_factor).
  LRScheduler(torch::optim::Optimizer& optimizer, std::vector<double> base_lrs);

  // PyTorch's _initial_step(): last_epoch = -1, then step(). Call at the end of the constructor.
  void initial_step();
  // PyTorch's get_lr() for `epoch` (= last_epoch + 1 of the step being taken); one lr per group.
  // Must not modify the scheduler: step() commits the result only if this returns.
  virtual std::vector<double> compute_lr(int64_t epoch) const = 0;
  // The lr each param group currently holds (PyTorch's group['lr']).
  std::vector<double> group_lrs() const;
  size_t num_groups() const;

  // Hyperparameters for SchedulerState::extra.
  virtual void save_extra(std::map<std::string, double>& extra) const;
  // Validates and restores them; throw std::invalid_argument before changing anything if invalid.
  virtual void load_extra(const std::map<std::string, double>& extra);

 private:
  torch::optim::Optimizer* optimizer_;
  int64_t last_epoch_ = -1;
  std::vector<double> base_lrs_;
  std::vector<double> last_lrs_;
};

// PyTorch torch.optim.lr_scheduler.StepLR (chainable form):
//   lr_e = lr_{e-1} * gamma  if e > 0 and e % step_size == 0,  else lr_{e-1}
// i.e. base_lr * gamma^floor(e / step_size). Throws std::invalid_argument if step_size <= 0 or
// gamma <= 0. extra: step_size, gamma.
class BOOSTER_API StepLR final : public LRScheduler {
 public:
  StepLR(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  std::string type() const override { return "StepLR"; }

 protected:
  std::vector<double> compute_lr(int64_t epoch) const override;
  void save_extra(std::map<std::string, double>& extra) const override;
  void load_extra(const std::map<std::string, double>& extra) override;

 private:
  int64_t step_size_;
  double gamma_;
};

// PyTorch torch.optim.lr_scheduler.MultiStepLR (chainable form): milestones are counted like
// Python's Counter, so a milestone listed k times multiplies by gamma^k:
//   lr_e = lr_{e-1} * gamma^count(e)  if e is a milestone,  else lr_{e-1}
// (a milestone 0 applies at construction, as in PyTorch). Throws std::invalid_argument if
// gamma <= 0 or a milestone is negative. extra: gamma, "milestone.<epoch>" = count.
class BOOSTER_API MultiStepLR final : public LRScheduler {
 public:
  MultiStepLR(torch::optim::Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);
  std::string type() const override { return "MultiStepLR"; }

 protected:
  std::vector<double> compute_lr(int64_t epoch) const override;
  void save_extra(std::map<std::string, double>& extra) const override;
  void load_extra(const std::map<std::string, double>& extra) override;

 private:
  std::map<int64_t, int64_t> milestones_;  // epoch -> count
  double gamma_;
};

// PyTorch torch.optim.lr_scheduler.ExponentialLR (chainable form):
//   lr_e = lr_{e-1} * gamma for e > 0 (base_lr * gamma^e).
// Throws std::invalid_argument if gamma <= 0. extra: gamma.
class BOOSTER_API ExponentialLR final : public LRScheduler {
 public:
  ExponentialLR(torch::optim::Optimizer& optimizer, double gamma);
  std::string type() const override { return "ExponentialLR"; }

 protected:
  std::vector<double> compute_lr(int64_t epoch) const override;
  void save_extra(std::map<std::string, double>& extra) const override;
  void load_extra(const std::map<std::string, double>& extra) override;

 private:
  double gamma_;
};

// PyTorch torch.optim.lr_scheduler.CosineAnnealingLR, in PyTorch's recursive form (not the
// closed form), so the values match torch.optim bit for bit:
//   e == 0:                          lr_e = lr_{e-1}
//   (e - 1 - T_max) % (2 T_max) == 0: lr_e = lr_{e-1} + (base_lr - eta_min)(1 - cos(pi / T_max)) / 2
//   otherwise:                       lr_e = (1 + cos(pi e / T_max)) / (1 + cos(pi (e-1) / T_max))
//                                           * (lr_{e-1} - eta_min) + eta_min
// which, undisturbed, is eta_min + (base_lr - eta_min)(1 + cos(pi e / T_max)) / 2 and keeps
// oscillating (back up to base_lr at 2 T_max) past T_max, as PyTorch. Throws
// std::invalid_argument if T_max <= 0 or eta_min < 0. extra: T_max, eta_min.
class BOOSTER_API CosineAnnealingLR final : public LRScheduler {
 public:
  CosineAnnealingLR(torch::optim::Optimizer& optimizer, int64_t T_max, double eta_min = 0.0);
  std::string type() const override { return "CosineAnnealingLR"; }

 protected:
  std::vector<double> compute_lr(int64_t epoch) const override;
  void save_extra(std::map<std::string, double>& extra) const override;
  void load_extra(const std::map<std::string, double>& extra) override;

 private:
  int64_t T_max_;
  double eta_min_;
};

// ColossalAI colossalai.nn.lr_scheduler.LinearWarmupLR (colossalai/nn/lr_scheduler/linear.py):
//   e <  warmup_steps: lr_e = (e + 1) / (warmup_steps + 1) * base_lr
//   e >= warmup_steps: lr_e = (total_steps - e) / (total_steps - warmup_steps) * base_lr
// so lr rises linearly to base_lr at e = warmup_steps, then falls linearly to 0 at total_steps.
// Deviation: for e >= total_steps the lr stays 0 (ColossalAI's formula goes negative). Throws
// std::invalid_argument if total_steps <= 0, warmup_steps < 0 or warmup_steps > total_steps.
// extra: total_steps, warmup_steps.
class BOOSTER_API LinearWarmupLR final : public LRScheduler {
 public:
  LinearWarmupLR(torch::optim::Optimizer& optimizer, int64_t total_steps, int64_t warmup_steps = 0);
  std::string type() const override { return "LinearWarmupLR"; }

 protected:
  std::vector<double> compute_lr(int64_t epoch) const override;
  void save_extra(std::map<std::string, double>& extra) const override;
  void load_extra(const std::map<std::string, double>& extra) override;

 private:
  int64_t total_steps_;
  int64_t warmup_steps_;
};

// ColossalAI colossalai.nn.lr_scheduler.CosineAnnealingWarmupLR (colossalai/nn/lr_scheduler/
// cosine.py), a WarmupScheduler (delayed.py) around torch's CosineAnnealingLR(T_max =
// total_steps - warmup_steps, eta_min):
//   e <  warmup_steps: lr_e = (e + 1) / warmup_steps * base_lr      (reaches base_lr at e = W-1)
//   e >= warmup_steps: CosineAnnealingLR's recursive rule at epoch e - warmup_steps, starting from
//                      the lr the optimizer holds (so lr_W = lr_{W-1} = base_lr)
// Past total_steps the cosine keeps oscillating, as torch's CosineAnnealingLR. In ColossalAI the
// wrapper's own last_epoch stops at warmup_steps while the inner scheduler counts on; here
// last_epoch() counts every step (inner epoch = last_epoch - warmup_steps). Throws
// std::invalid_argument if total_steps <= 0, warmup_steps < 0, warmup_steps >= total_steps (the
// inner T_max would be <= 0) or eta_min < 0. extra: total_steps, warmup_steps, eta_min.
class BOOSTER_API CosineAnnealingWarmupLR final : public LRScheduler {
 public:
  CosineAnnealingWarmupLR(torch::optim::Optimizer& optimizer, int64_t total_steps, int64_t warmup_steps = 0,
                          double eta_min = 0.0);
  std::string type() const override { return "CosineAnnealingWarmupLR"; }

 protected:
  std::vector<double> compute_lr(int64_t epoch) const override;
  void save_extra(std::map<std::string, double>& extra) const override;
  void load_extra(const std::map<std::string, double>& extra) override;

 private:
  int64_t total_steps_;
  int64_t warmup_steps_;
  double eta_min_;
};

// PyTorch torch.optim.lr_scheduler.PolynomialLR (new in 1.13; chainable form):
//   e == 0 or e > total_iters: lr_e = lr_{e-1}
//   otherwise:                 lr_e = lr_{e-1} * ((1 - e/total_iters) / (1 - (e-1)/total_iters))^power
// i.e. base_lr * (1 - min(e, total_iters)/total_iters)^power, 0 from total_iters on. Throws
// std::invalid_argument if total_iters <= 0 or power < 0. extra: total_iters, power.
class BOOSTER_API PolynomialLR final : public LRScheduler {
 public:
  explicit PolynomialLR(torch::optim::Optimizer& optimizer, int64_t total_iters = 5, double power = 1.0);
  std::string type() const override { return "PolynomialLR"; }

 protected:
  std::vector<double> compute_lr(int64_t epoch) const override;
  void save_extra(std::map<std::string, double>& extra) const override;
  void load_extra(const std::map<std::string, double>& extra) override;

 private:
  int64_t total_iters_;
  double power_;
};

// PyTorch torch.optim.lr_scheduler.OneCycleLR, learning rate only: there is no momentum cycling
// (PyTorch's cycle_momentum / base_momentum / max_momentum); the optimizer's momentum is left
// alone, which equals PyTorch with cycle_momentum=False. Per group:
//   initial_lr = max_lr / div_factor (= base_lrs; the optimizer's own lr is ignored),
//   min_lr = initial_lr / final_div_factor.
// Phases (end steps as PyTorch, as doubles):
//   two-phase:   [0, pct_start*T - 1]: initial -> max;   [.., T - 1]: max -> min
//   three_phase: [0, pct_start*T - 1]: initial -> max;   [.., 2*pct_start*T - 2]: max -> initial;
//                [.., T - 1]: initial -> min
// with pct = (e - phase_start) / (phase_end - phase_start) and
//   "cos":    end + (start - end) / 2 * (cos(pi * pct) + 1)
//   "linear": (end - start) * pct + start.
// Stepping to e > total_steps throws std::invalid_argument (as PyTorch's ValueError; the step is
// not taken). Also throws if total_steps <= 0, pct_start outside [0, 1], anneal_strategy not
// "cos"/"linear", div_factor or final_div_factor <= 0, max_lr has the wrong number of values or
// is <= 0, or a phase would have zero length (PyTorch divides by zero at that step; here the
// constructor refuses). extra: total_steps, pct_start, anneal_strategy (0 = cos, 1 = linear),
// div_factor, final_div_factor, three_phase (0/1), "max_lr.<group>", "min_lr.<group>".
class BOOSTER_API OneCycleLR final : public LRScheduler {
 public:
  OneCycleLR(torch::optim::Optimizer& optimizer, double max_lr, int64_t total_steps, double pct_start = 0.3,
             const std::string& anneal_strategy = "cos", double div_factor = 25.0,
             double final_div_factor = 1e4, bool three_phase = false);
  // One max_lr per param group (PyTorch's list form).
  OneCycleLR(torch::optim::Optimizer& optimizer, std::vector<double> max_lrs, int64_t total_steps,
             double pct_start = 0.3, const std::string& anneal_strategy = "cos", double div_factor = 25.0,
             double final_div_factor = 1e4, bool three_phase = false);
  std::string type() const override { return "OneCycleLR"; }

 protected:
  std::vector<double> compute_lr(int64_t epoch) const override;
  void save_extra(std::map<std::string, double>& extra) const override;
  void load_extra(const std::map<std::string, double>& extra) override;

 private:
  struct Phase {
    double end_step;
    int start;  // 0 = initial_lr, 1 = max_lr, 2 = min_lr
    int end;
  };
  static std::vector<Phase> make_phases(int64_t total_steps, double pct_start, bool three_phase);
  double value(int which, size_t group) const;

  int64_t total_steps_;
  double pct_start_;
  bool linear_;
  double div_factor_;
  double final_div_factor_;
  bool three_phase_;
  std::vector<double> max_lrs_;
  std::vector<double> min_lrs_;
  std::vector<Phase> phases_;
};

// PyTorch torch.optim.lr_scheduler.LambdaLR:  lr_e = base_lr * lr_lambda(e).
// One function for every group, or one per group. The functions are not part of the state (as
// PyTorch with plain functions): after load_state_dict() the constructor's functions are used.
// Throws std::invalid_argument on an empty function or a wrong number of functions.
class BOOSTER_API LambdaLR final : public LRScheduler {
 public:
  using Lambda = std::function<double(int64_t)>;
  LambdaLR(torch::optim::Optimizer& optimizer, Lambda lr_lambda);
  LambdaLR(torch::optim::Optimizer& optimizer, std::vector<Lambda> lr_lambdas);
  std::string type() const override { return "LambdaLR"; }

 protected:
  std::vector<double> compute_lr(int64_t epoch) const override;

 private:
  std::vector<Lambda> lambdas_;
};

// Builds a scheduler from a config table, e.g.
//   [train.lr_scheduler]
//   name = "cosine_warmup"     # or the class name "CosineAnnealingWarmupLR"
//   warmup_steps = 100
//   eta_min = 1e-5
// `name` (default "none" -> nullptr), snake_case or PyTorch class name:
//   "step"/"StepLR":                     step_size (required), gamma = 0.1
//   "multistep"/"MultiStepLR":           milestones (required, comma-separated string "30,80"),
//                                        gamma = 0.1
//   "exponential"/"ExponentialLR":       gamma (required)
//   "cosine"/"CosineAnnealingLR":        T_max = total_steps, eta_min = 0
//   "linear_warmup"/"LinearWarmupLR":    warmup_steps = 0
//   "cosine_warmup"/"CosineAnnealingWarmupLR": warmup_steps = 0, eta_min = 0
//   "polynomial"/"PolynomialLR":         total_iters = total_steps, power = 1.0
//   "onecycle"/"OneCycleLR":             max_lr = each group's current lr, pct_start = 0.3,
//                                        anneal_strategy = "cos", div_factor = 25,
//                                        final_div_factor = 1e4, three_phase = false
// A `total_steps` key in the table overrides the argument; a scheduler that needs it fails when
// neither is positive. Ends with section.check_unknown(), so pass a table of its own (or read
// the table's other keys first). Every problem throws ConfigError naming "<section>.<key>".
BOOSTER_API std::shared_ptr<LRScheduler> make_lr_scheduler(const Options& section,
                                                           torch::optim::Optimizer& optimizer,
                                                           int64_t total_steps);

}  // namespace booster
