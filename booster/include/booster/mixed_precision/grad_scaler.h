// grad_scaler.h — loss scalers for float16 training (ColossalAI's DynamicGradScaler and
// ConstantGradScaler), and the two gradient helpers the optimizer wrapper builds on: an inf/nan
// check and an in-place unscale.
//
// Reference: colossalai/amp/naive_amp/grad_scaler/{base,dynamic,constant}_grad_scaler.py. The
// update rule is ColossalAI's, step for step (see DynamicGradScaler::update), including two details
// that are easy to get wrong:
//   * the hysteresis counter is NOT reset when the scale backs off, nor by clean steps; only a
//     growth resets it. With hysteresis = 2, the first overflow after a growth is absorbed, and every
//     further overflow before the next growth backs off immediately;
//   * growth happens when the growth counter EQUALS growth_interval (a counter above the interval
//     would never grow; load_state_dict rejects such a state).
// Like ColossalAI (which keeps the scale in a float32 tensor), the scale is a float32 value: the
// options are rounded to float32, and each backoff/growth is a float32 multiply by the factor
// rounded to float32, then clamped. scale() returns that float32 value widened to double, so with
// power-of-two options (the defaults) every value is an exact power of two.
//
// Not thread-safe; one scaler per optimizer.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "booster/export.h"

namespace booster {
class Options;

namespace mixed_precision {

// Serializable scaler state. ColossalAI's DynamicGradScaler.state_dict() holds {scale,
// growth_factor, backoff_factor, hysteresis} and not the counters, so a resumed ColossalAI run
// restarts both counters at 0. Here the factors come from the config (the source of truth) and the
// counters are saved, so a resumed run continues exactly the same scale sequence.
struct ScalerState {
  double scale = 1.0;           // the loss scale (a float32 value)
  int64_t growth_step = 0;      // clean steps since the last overflow or growth
  int64_t hysteresis_step = 0;  // overflows since the last growth
};

// A loss scaler: the loss is multiplied by scale() before backward, gradients by inv_scale() before
// the optimizer step, and update() is told whether that step's gradients overflowed.
class BOOSTER_API GradScaler {
 public:
  virtual ~GradScaler();

  // The current loss scale (> 0).
  virtual double scale() const = 0;
  // 1 / scale() computed as ColossalAI does (scale.double().reciprocal().float()): the float32
  // rounding of the double reciprocal. Exact for power-of-two scales.
  double inv_scale() const;
  // Records one optimizer step: `overflow` = some gradient had an inf or nan (agreed across ranks).
  virtual void update(bool overflow) = 0;
  virtual ScalerState state_dict() const = 0;
  // Throws std::invalid_argument for an invalid state (see each scaler); the scaler is unchanged then.
  virtual void load_state_dict(const ScalerState& state) = 0;

  // Total update(true) calls since construction (statistics; not part of the state, not reset by
  // load_state_dict).
  int64_t overflow_count() const { return overflow_count_; }

 protected:
  GradScaler() = default;
  GradScaler(const GradScaler&) = default;
  GradScaler& operator=(const GradScaler&) = default;
  void count_overflow() { ++overflow_count_; }

 private:
  int64_t overflow_count_ = 0;
};

// DynamicGradScaler's options; the defaults are those ColossalAI's fp16 optimizers and booster
// mixed precision use (initial 2^16, growth x2 every 1000 clean steps, backoff x0.5 after 2
// overflows, scale within [1, 2^32]).
struct DynamicGradScalerOptions {
  double initial_scale = 65536.0;      // 2^16
  double growth_factor = 2.0;          // > 1
  double backoff_factor = 0.5;         // in (0, 1)
  int64_t growth_interval = 1000;      // >= 1 clean steps per growth
  int64_t hysteresis = 2;              // >= 0; overflows tolerated per growth period (0 acts as 1)
  double min_scale = 1.0;              // > 0; backoff never goes below it
  double max_scale = 4294967296.0;     // 2^32, >= min_scale; growth never goes above it
};

// ColossalAI's DynamicGradScaler: back off after `hysteresis` overflows, grow after
// `growth_interval` consecutive clean steps, clamp to [min_scale, max_scale].
class BOOSTER_API DynamicGradScaler final : public GradScaler {
 public:
  // Throws std::invalid_argument (message names the option and its value) unless:
  //   initial_scale, min_scale, max_scale are finite, > 0 and at most FLT_MAX (float32 range) and
  //     min_scale does not round to 0 in float32;
  //   growth_factor > 1 and backoff_factor in (0, 1) (ColossalAI asserts both), also after rounding
  //     to float32, and finite;
  //   growth_interval >= 1 (ColossalAI does not check; an interval <= 0 would never grow);
  //   hysteresis >= 0 (ColossalAI's assert; 0 behaves exactly like 1);
  //   min_scale <= initial_scale <= max_scale, compared in float32 (ColossalAI's asserts), which
  //     also implies max_scale >= min_scale.
  // ColossalAI's min_scale/max_scale = None (no clamp) has no equivalent: use a tiny min_scale and
  // max_scale = FLT_MAX instead.
  explicit DynamicGradScaler(const DynamicGradScalerOptions& options = {});

  // Reads initial_scale, growth_factor, backoff_factor, growth_interval, hysteresis, min_scale,
  // max_scale from a config section (e.g. [mixed_precision]); absent keys keep their defaults. Does
  // the per-key checks through the Options getters (booster::ConfigError with file:line for a wrong
  // type or a value out of its inclusive range: initial_scale, min_scale, max_scale in [0, FLT_MAX],
  // growth_factor in [1, FLT_MAX], backoff_factor in [0, 1], growth_interval >= 1, hysteresis >= 0).
  // The strict bounds (> 0, > 1, < 1) and the cross-option checks are the constructor's
  // (std::invalid_argument), so construct a scaler to validate. Does not call check_unknown().
  // `defaults` gives the values of absent keys (ColossalAI's plugins start at initial_scale = 2^32).
  static DynamicGradScalerOptions from_options(const booster::Options& section,
                                               const DynamicGradScalerOptions& defaults = {});

  double scale() const override { return static_cast<double>(scale_); }
  // ColossalAI's update():
  //   overflow:  hysteresis_step += 1; growth_step = 0;
  //              if hysteresis_step >= hysteresis: scale = max(scale * backoff_factor, min_scale)
  //   otherwise: growth_step += 1;
  //              if growth_step == growth_interval: growth_step = 0; hysteresis_step = 0;
  //                                                 scale = min(scale * growth_factor, max_scale)
  void update(bool overflow) override;
  // {scale, growth_step, hysteresis_step}.
  ScalerState state_dict() const override;
  // Restores scale and both counters. Throws std::invalid_argument unless scale is finite, > 0 and
  // a positive float32 value, 0 <= growth_step < growth_interval and hysteresis_step >= 0. The scale
  // is not clamped to [min_scale, max_scale] (as in ColossalAI; the next backoff/growth clamps it).
  void load_state_dict(const ScalerState& state) override;

  int64_t growth_step() const { return growth_step_; }
  int64_t hysteresis_step() const { return hysteresis_step_; }
  const DynamicGradScalerOptions& options() const { return options_; }

 private:
  DynamicGradScalerOptions options_;
  float scale_;
  float growth_factor_;
  float backoff_factor_;
  float min_scale_;
  float max_scale_;
  int64_t growth_step_ = 0;
  int64_t hysteresis_step_ = 0;
};

// ColossalAI's ConstantGradScaler: the scale never changes on update() (overflows are only counted).
class BOOSTER_API ConstantGradScaler final : public GradScaler {
 public:
  // Throws std::invalid_argument unless initial_scale is finite, > 0 and at most FLT_MAX.
  explicit ConstantGradScaler(double initial_scale);

  double scale() const override { return static_cast<double>(scale_); }
  void update(bool overflow) override;
  // {scale, 0, 0}.
  ScalerState state_dict() const override;
  // As ColossalAI's BaseGradScaler.load_state_dict: takes the saved scale (same checks as the
  // constructor, std::invalid_argument); the counters are ignored.
  void load_state_dict(const ScalerState& state) override;

 private:
  float scale_;
};

// True if any element of any defined tensor in `grads` is +inf, -inf or nan. Undefined tensors,
// empty tensors and integer/bool tensors (which cannot hold inf/nan) are skipped. Any device and
// floating dtype (float16, bfloat16, float32, float64; complex checks both parts), any strides.
//
// Algorithm: one reduction per tensor, at::aminmax (min and max in a single pass, no temporary of
// the tensor's size; float16 on CPU, which LibTorch 1.13's aminmax lacks, uses min() and max()). Both propagate nan, and max is +inf iff some element is +inf (min -inf iff
// some is -inf), so min*0 + max*0 is 0 when the tensor is finite and nan otherwise. These 0-dim
// results are summed per device and read back with one host sync per device (not per tensor).
// Unlike the "sum the tensor" trick (apex/ColossalAI's _has_inf_or_nan), large finite values can
// never overflow into a false positive, and unlike isfinite(t).all() nothing of the tensor's size is
// allocated.
BOOSTER_API bool has_inf_or_nan(const std::vector<at::Tensor>& grads);

// In place: every defined tensor in `grads` is multiplied by `inv_scale` (t.mul_(inv_scale): the
// multiply happens in the tensor's compute type, float32 for float16/bfloat16). Undefined tensors are
// skipped; inv_scale == 1 does nothing. Throws std::invalid_argument when inv_scale is not finite.
BOOSTER_API void unscale_grads(const std::vector<at::Tensor>& grads, double inv_scale);

}  // namespace mixed_precision
}  // namespace booster
