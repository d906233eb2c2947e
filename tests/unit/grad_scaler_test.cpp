// grad_scaler_test.cpp — booster::mixed_precision::DynamicGradScaler / ConstantGradScaler against
// ColossalAI's grad scalers (colossalai/amp/naive_amp/grad_scaler/*.py), and the has_inf_or_nan /
// unscale_grads helpers.
//
// The scale sequences are checked against two independent encodings of the reference: a table
// stepped through ColossalAI's Python by hand (kScript), and a literal transcription of the Python
// into C++ on float32 tensors (ColossalReference), which also covers non-power-of-two factors where
// float32 rounding matters.

#include "booster/mixed_precision/grad_scaler.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "booster/config.h"

using booster::Config;
using booster::ConfigError;
using booster::mixed_precision::ConstantGradScaler;
using booster::mixed_precision::DynamicGradScaler;
using booster::mixed_precision::DynamicGradScalerOptions;
using booster::mixed_precision::GradScaler;
using booster::mixed_precision::has_inf_or_nan;
using booster::mixed_precision::ScalerState;
using booster::mixed_precision::unscale_grads;
using ::testing::AllOf;
using ::testing::HasSubstr;

namespace {

// ---------------------------------------------------------------------------------------------
// Reference 1: the most literal transcription of ColossalAI's DynamicGradScaler (dynamic_grad_scaler.py
// + base_grad_scaler.py) — float32 tensors, Python truthiness for min/max, `>=` and `==` as written.
// The sanity checks and logging are left out.
class ColossalReference {
 public:
  ColossalReference(double initial_scale, double growth_factor, double backoff_factor, int64_t growth_interval,
                    std::optional<double> min_scale, std::optional<double> max_scale, int64_t hysteresis) {
    // BaseGradScaler.__init__: self._scale = torch.tensor([initial_scale], dtype=torch.float)
    _scale = at::tensor({initial_scale}, at::TensorOptions().dtype(at::kFloat));
    // if min_scale: self._min_scale = torch.tensor([min_scale], dtype=torch.float) else: None
    if (min_scale && *min_scale != 0.0) _min_scale = at::tensor({*min_scale}, at::TensorOptions().dtype(at::kFloat));
    if (max_scale && *max_scale != 0.0) _max_scale = at::tensor({*max_scale}, at::TensorOptions().dtype(at::kFloat));
    _growth_factor = growth_factor;
    _backoff_factor = backoff_factor;
    _growth_interval = growth_interval;
    _growth_step = 0;
    _hysteresis = hysteresis;
    _hysteresis_step = 0;
  }

  void update(bool overflow) {
    if (overflow) {
      _hysteresis_step += 1;
      _growth_step = 0;

      if (_hysteresis_step >= _hysteresis) {
        _backoff_scale();
      }
    } else {
      _growth_step += 1;
      if (_growth_step == _growth_interval) {
        _growth_step = 0;
        _hysteresis_step = 0;
        _grow_scale();
      }
    }
  }

  void _backoff_scale() {
    _scale = _scale * _backoff_factor;
    if (_min_scale.defined()) {
      _scale = at::max(_scale, _min_scale);
    }
  }

  void _grow_scale() {
    _scale = _scale * _growth_factor;
    if (_max_scale.defined()) {
      _scale = at::min(_scale, _max_scale);
    }
  }

  double scale() const { return static_cast<double>(_scale.item<float>()); }
  // BaseGradScaler.inv_scale: self._scale.double().reciprocal().float()
  double inv_scale() const { return static_cast<double>(_scale.to(at::kDouble).reciprocal().to(at::kFloat).item<float>()); }

  at::Tensor _scale, _min_scale, _max_scale;
  double _growth_factor, _backoff_factor;
  int64_t _growth_interval, _growth_step, _hysteresis, _hysteresis_step;
};

ColossalReference reference_for(const DynamicGradScalerOptions& o) {
  return ColossalReference(o.initial_scale, o.growth_factor, o.backoff_factor, o.growth_interval, o.min_scale,
                           o.max_scale, o.hysteresis);
}

// ---------------------------------------------------------------------------------------------
// Reference 2: ColossalAI's update() stepped through by hand.
//
// Options: initial_scale 8, growth_factor 2, backoff_factor 0.5, growth_interval 3, hysteresis 2,
// min_scale 1, max_scale 32. Start: scale 8, growth_step 0, hysteresis_step 0. 'O' = overflow.
//
//  step  in  growth_step  hysteresis_step  scale   why
//   1    .       1             0             8
//   2    .       2             0             8
//   3    .       3 -> 0        0             16    growth_step == 3: grow, reset both counters
//   4    O       0             1             16    1 < 2: hysteresis absorbs the overflow
//   5    .       1             1             16
//   6    O       0             2             8     2 >= 2: back off (growth counter was reset)
//   7    O       0             3             4     3 >= 2: back off again (not reset by a backoff)
//   8    .       1             3             4     a clean step does not reset hysteresis_step
//   9    O       0             4             2
//  10    O       0             5             1
//  11    O       0             6             1     0.5 clamped to min_scale 1
//  12    .       1             6             1
//  13    .       2             6             1
//  14    .       3 -> 0        6 -> 0        2     exactly 3 clean steps after the overflow: grow
//  15    O       0             1             2     absorbed again: the growth reset hysteresis_step
//  16    .       1             1             2
//  17    .       2             1             2
//  18    .       3 -> 0        1 -> 0        4
//  19    .       1             0             4
//  20    .       2             0             4
//  21    O       0             1             4     overflow one step before a growth: counter reset
//  22    .       1             1             4
//  23    .       2             1             4
//  24    .       3 -> 0        1 -> 0        8     so the growth comes 3 clean steps after step 21
//  25    .       1             0             8
//  26    .       2             0             8
//  27    .       0             0             16
//  28    .       1             0             16
//  29    .       2             0             16
//  30    .       0             0             32
//  31    .       1             0             32
//  32    .       2             0             32
//  33    .       0             0             32    64 clamped to max_scale 32
//  34    O       0             1             32
//  35    O       0             2             16
// Overflows: steps 4, 6, 7, 9, 10, 11, 15, 21, 34, 35 = 10.
struct Step {
  bool overflow;
  int64_t growth_step;
  int64_t hysteresis_step;
  double scale;
};

const std::vector<Step> kScript = {
    {false, 1, 0, 8},  {false, 2, 0, 8},  {false, 0, 0, 16}, {true, 0, 1, 16},  {false, 1, 1, 16},
    {true, 0, 2, 8},   {true, 0, 3, 4},   {false, 1, 3, 4},  {true, 0, 4, 2},   {true, 0, 5, 1},
    {true, 0, 6, 1},   {false, 1, 6, 1},  {false, 2, 6, 1},  {false, 0, 0, 2},  {true, 0, 1, 2},
    {false, 1, 1, 2},  {false, 2, 1, 2},  {false, 0, 0, 4},  {false, 1, 0, 4},  {false, 2, 0, 4},
    {true, 0, 1, 4},   {false, 1, 1, 4},  {false, 2, 1, 4},  {false, 0, 0, 8},  {false, 1, 0, 8},
    {false, 2, 0, 8},  {false, 0, 0, 16}, {false, 1, 0, 16}, {false, 2, 0, 16}, {false, 0, 0, 32},
    {false, 1, 0, 32}, {false, 2, 0, 32}, {false, 0, 0, 32}, {true, 0, 1, 32},  {true, 0, 2, 16},
};
constexpr int64_t kScriptOverflows = 10;

DynamicGradScalerOptions script_options() {
  DynamicGradScalerOptions o;
  o.initial_scale = 8;
  o.growth_factor = 2;
  o.backoff_factor = 0.5;
  o.growth_interval = 3;
  o.hysteresis = 2;
  o.min_scale = 1;
  o.max_scale = 32;
  return o;
}

// The std::invalid_argument message of `fn` ("" and a failure if it does not throw one).
std::string invalid_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected std::invalid_argument";
  return "";
}

std::string config_error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected ConfigError";
  return "";
}

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

// ---------------------------------------------------------------------------------------------
// DynamicGradScaler: the scripted sequence

TEST(DynamicGradScalerTest, ScriptMatchesHandSteppedColossalAI) {
  DynamicGradScaler scaler(script_options());
  ColossalReference ref = reference_for(script_options());
  EXPECT_EQ(scaler.scale(), 8.0);
  EXPECT_EQ(ref.scale(), 8.0);
  for (size_t i = 0; i < kScript.size(); ++i) {
    const Step& s = kScript[i];
    scaler.update(s.overflow);
    ref.update(s.overflow);
    SCOPED_TRACE("step " + std::to_string(i + 1));
    // the hand-stepped table and the literal transcription agree ...
    EXPECT_EQ(ref.scale(), s.scale);
    EXPECT_EQ(ref._growth_step, s.growth_step);
    EXPECT_EQ(ref._hysteresis_step, s.hysteresis_step);
    // ... and the class agrees with both
    EXPECT_EQ(scaler.scale(), s.scale);
    EXPECT_EQ(scaler.growth_step(), s.growth_step);
    EXPECT_EQ(scaler.hysteresis_step(), s.hysteresis_step);
    EXPECT_EQ(scaler.inv_scale(), 1.0 / s.scale);
    EXPECT_EQ(scaler.inv_scale(), ref.inv_scale());
  }
  EXPECT_EQ(scaler.overflow_count(), kScriptOverflows);
}

TEST(DynamicGradScalerTest, MatchesLiteralTranscriptionOnRandomSequences) {
  // Non-power-of-two factors: every backoff/growth rounds in float32, so this checks the float32
  // emulation against real float32 tensor arithmetic, and both clamps.
  struct Case {
    double initial, growth, backoff;
    int64_t interval, hysteresis;
    double min, max;
  };
  const std::vector<Case> cases = {
      {1000.0, 1.7, 0.3, 3, 2, 0.01, 1e6},    {65536.0, 2.0, 0.5, 5, 2, 1.0, 4294967296.0},
      {3.3, 1.1, 0.9, 1, 0, 0.1, 7.7},        {1e-3, 3.14159, 0.271828, 2, 3, 1e-30, 1e30},
      {12345.678, 1.0001, 0.99, 4, 1, 10000.0, 3e38},
  };
  for (const Case& c : cases) {
    DynamicGradScalerOptions o;
    o.initial_scale = c.initial;
    o.growth_factor = c.growth;
    o.backoff_factor = c.backoff;
    o.growth_interval = c.interval;
    o.hysteresis = c.hysteresis;
    o.min_scale = c.min;
    o.max_scale = c.max;
    DynamicGradScaler scaler(o);
    ColossalReference ref = reference_for(o);
    std::mt19937 rng(1234);
    // phases: mostly clean (hits max_scale), mostly overflow (hits min_scale), mixed
    const double p_overflow[] = {0.05, 0.7, 0.25};
    bool hit_min = false, hit_max = false;
    int step = 0;
    for (double p : p_overflow) {
      std::bernoulli_distribution overflow(p);
      for (int i = 0; i < 1500; ++i, ++step) {
        const bool ov = overflow(rng);
        scaler.update(ov);
        ref.update(ov);
        ASSERT_EQ(scaler.scale(), ref.scale()) << "case initial=" << c.initial << " step " << step;
        ASSERT_EQ(scaler.growth_step(), ref._growth_step);
        ASSERT_EQ(scaler.hysteresis_step(), ref._hysteresis_step);
        ASSERT_EQ(scaler.inv_scale(), ref.inv_scale());
        hit_min = hit_min || scaler.scale() == static_cast<double>(static_cast<float>(c.min));
        hit_max = hit_max || scaler.scale() == static_cast<double>(static_cast<float>(c.max));
      }
    }
    if (c.max < 1e31) {
      EXPECT_TRUE(hit_max) << "case initial=" << c.initial;
    }
    if (c.min > 1e-29) {
      EXPECT_TRUE(hit_min) << "case initial=" << c.initial;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// DynamicGradScaler: individual rules

TEST(DynamicGradScalerTest, DefaultsAreColossalAIs) {
  const DynamicGradScalerOptions o;
  EXPECT_EQ(o.initial_scale, std::ldexp(1.0, 16));
  EXPECT_EQ(o.growth_factor, 2.0);
  EXPECT_EQ(o.backoff_factor, 0.5);
  EXPECT_EQ(o.growth_interval, 1000);
  EXPECT_EQ(o.hysteresis, 2);
  EXPECT_EQ(o.min_scale, 1.0);
  EXPECT_EQ(o.max_scale, std::ldexp(1.0, 32));
  DynamicGradScaler scaler;
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.inv_scale(), 1.0 / 65536.0);
  EXPECT_EQ(scaler.growth_step(), 0);
  EXPECT_EQ(scaler.hysteresis_step(), 0);
  EXPECT_EQ(scaler.overflow_count(), 0);
}

TEST(DynamicGradScalerTest, HysteresisOneOverflowDoesNotBackOffTwoDo) {
  DynamicGradScaler scaler;  // hysteresis = 2
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.hysteresis_step(), 1);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 32768.0);
  EXPECT_EQ(scaler.hysteresis_step(), 2);
  // ColossalAI does not reset the hysteresis counter on backoff: the third overflow backs off too.
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 16384.0);
  EXPECT_EQ(scaler.hysteresis_step(), 3);
  EXPECT_EQ(scaler.overflow_count(), 3);
}

TEST(DynamicGradScalerTest, HysteresisZeroAndOneBackOffOnEveryOverflow) {
  for (int64_t h : {0, 1}) {
    DynamicGradScalerOptions o;
    o.hysteresis = h;
    DynamicGradScaler scaler(o);
    scaler.update(true);
    EXPECT_EQ(scaler.scale(), 32768.0) << "hysteresis " << h;
    scaler.update(true);
    EXPECT_EQ(scaler.scale(), 16384.0) << "hysteresis " << h;
  }
}

TEST(DynamicGradScalerTest, HysteresisThree) {
  DynamicGradScalerOptions o = script_options();
  o.hysteresis = 3;
  DynamicGradScaler scaler(o);
  scaler.update(true);
  scaler.update(false);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 8.0);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 4.0);
}

TEST(DynamicGradScalerTest, GrowsAfterExactlyGrowthIntervalCleanSteps) {
  DynamicGradScaler scaler;  // growth_interval = 1000
  for (int i = 1; i < 1000; ++i) {
    scaler.update(false);
    ASSERT_EQ(scaler.scale(), 65536.0) << "clean step " << i;
    ASSERT_EQ(scaler.growth_step(), i);
  }
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 131072.0);
  EXPECT_EQ(scaler.growth_step(), 0);
}

TEST(DynamicGradScalerTest, OverflowResetsGrowthCounter) {
  DynamicGradScaler scaler;
  for (int i = 0; i < 999; ++i) scaler.update(false);
  scaler.update(true);  // absorbed by hysteresis, but the 999 clean steps are forgotten
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.growth_step(), 0);
  for (int i = 0; i < 999; ++i) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 65536.0);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 131072.0);
  EXPECT_EQ(scaler.hysteresis_step(), 0);  // growth resets the hysteresis counter
}

TEST(DynamicGradScalerTest, ClampsAtMinScale) {
  DynamicGradScalerOptions o;
  o.initial_scale = 4;
  o.min_scale = 3;
  o.hysteresis = 1;
  DynamicGradScaler scaler(o);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 3.0);  // 2 clamped to 3
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 3.0);
}

TEST(DynamicGradScalerTest, ClampsAtMaxScale) {
  DynamicGradScalerOptions o;
  o.initial_scale = 4;
  o.max_scale = 6;
  o.growth_interval = 1;
  DynamicGradScaler scaler(o);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 6.0);  // 8 clamped to 6
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 6.0);
  scaler.update(true);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 3.0);
}

TEST(DynamicGradScalerTest, InitialScaleMayEqualMinAndMax) {
  DynamicGradScalerOptions o;
  o.initial_scale = 5;
  o.min_scale = 5;
  o.max_scale = 5;
  o.hysteresis = 1;
  o.growth_interval = 1;
  DynamicGradScaler scaler(o);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 5.0);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 5.0);
}

// ---------------------------------------------------------------------------------------------
// DynamicGradScaler: state

TEST(DynamicGradScalerTest, StateDictRoundTripContinuesTheSameSequence) {
  for (size_t split = 0; split <= kScript.size(); ++split) {
    DynamicGradScaler first(script_options());
    for (size_t i = 0; i < split; ++i) first.update(kScript[i].overflow);
    const ScalerState state = first.state_dict();
    if (split > 0) {
      EXPECT_EQ(state.scale, kScript[split - 1].scale);
      EXPECT_EQ(state.growth_step, kScript[split - 1].growth_step);
      EXPECT_EQ(state.hysteresis_step, kScript[split - 1].hysteresis_step);
    }
    DynamicGradScaler resumed(script_options());
    resumed.load_state_dict(state);
    for (size_t i = split; i < kScript.size(); ++i) {
      resumed.update(kScript[i].overflow);
      ASSERT_EQ(resumed.scale(), kScript[i].scale) << "split " << split << " step " << i + 1;
      ASSERT_EQ(resumed.growth_step(), kScript[i].growth_step);
      ASSERT_EQ(resumed.hysteresis_step(), kScript[i].hysteresis_step);
    }
  }
}

TEST(DynamicGradScalerTest, LoadStateDictKeepsScaleOutsideTheRange) {
  // As ColossalAI: the loaded scale is taken as is; the next backoff/growth clamps it.
  DynamicGradScaler scaler(script_options());  // [1, 32], interval 3
  scaler.load_state_dict({1024.0, 2, 0});
  EXPECT_EQ(scaler.scale(), 1024.0);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 32.0);
}

TEST(DynamicGradScalerTest, LoadStateDictErrors) {
  DynamicGradScaler scaler(script_options());
  scaler.update(true);
  const ScalerState before = scaler.state_dict();
  EXPECT_THAT(invalid_message([&] { scaler.load_state_dict({0.0, 0, 0}); }), HasSubstr("scale must be"));
  EXPECT_THAT(invalid_message([&] { scaler.load_state_dict({-2.0, 0, 0}); }), HasSubstr("got -2"));
  EXPECT_THAT(invalid_message([&] { scaler.load_state_dict({kNaN, 0, 0}); }), HasSubstr("scale must be"));
  EXPECT_THAT(invalid_message([&] { scaler.load_state_dict({kInf, 0, 0}); }), HasSubstr("scale must be"));
  EXPECT_THAT(invalid_message([&] { scaler.load_state_dict({1e39, 0, 0}); }), HasSubstr("float32"));
  EXPECT_THAT(invalid_message([&] { scaler.load_state_dict({8.0, -1, 0}); }), HasSubstr("growth_step"));
  EXPECT_THAT(invalid_message([&] { scaler.load_state_dict({8.0, 3, 0}); }),
              HasSubstr("growth_step must be in [0, growth_interval = 3), got 3"));
  EXPECT_THAT(invalid_message([&] { scaler.load_state_dict({8.0, 0, -1}); }), HasSubstr("hysteresis_step"));
  const ScalerState after = scaler.state_dict();
  EXPECT_EQ(after.scale, before.scale);
  EXPECT_EQ(after.growth_step, before.growth_step);
  EXPECT_EQ(after.hysteresis_step, before.hysteresis_step);
}

TEST(DynamicGradScalerTest, OverflowCountIsNotState) {
  DynamicGradScaler a(script_options());
  a.update(true);
  a.update(true);
  DynamicGradScaler b(script_options());
  b.update(true);
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(b.overflow_count(), 1);
  EXPECT_EQ(b.hysteresis_step(), 2);
}

// ---------------------------------------------------------------------------------------------
// DynamicGradScaler: validation

TEST(DynamicGradScalerTest, ValidationErrors) {
  auto with = [](const std::function<void(DynamicGradScalerOptions&)>& change) {
    DynamicGradScalerOptions o;
    change(o);
    return invalid_message([&] { DynamicGradScaler s(o); });
  };
  // initial_scale > 0 (BaseGradScaler's assert), finite, a float32 value
  for (double v : {0.0, -1.0, kNaN, kInf, 1e39}) {
    EXPECT_THAT(with([&](auto& o) { o.initial_scale = v; }), HasSubstr("initial_scale must be")) << v;
  }
  // growth_factor > 1
  for (double v : {1.0, 0.5, -2.0, kNaN, kInf, 1.00000001 /* 1 in float32 */}) {
    EXPECT_THAT(with([&](auto& o) { o.growth_factor = v; }), HasSubstr("growth_factor must be")) << v;
  }
  // 0 < backoff_factor < 1
  for (double v : {0.0, 1.0, -0.5, 1.5, kNaN, 0.99999999 /* 1 in float32 */, 1e-50 /* 0 in float32 */}) {
    EXPECT_THAT(with([&](auto& o) { o.backoff_factor = v; }), HasSubstr("backoff_factor must be")) << v;
  }
  // growth_interval >= 1 (missing in ColossalAI)
  for (int64_t v : {0, -1}) {
    EXPECT_THAT(with([&](auto& o) { o.growth_interval = v; }), HasSubstr("growth_interval must be >= 1")) << v;
  }
  // hysteresis >= 0 (ColossalAI's assert)
  EXPECT_THAT(with([](auto& o) { o.hysteresis = -1; }), AllOf(HasSubstr("hysteresis must be >= 0"), HasSubstr("got -1")));
  // min_scale > 0
  for (double v : {0.0, -1.0, kNaN, kInf, 1e-50 /* 0 in float32 */}) {
    EXPECT_THAT(with([&](auto& o) { o.min_scale = v; }), HasSubstr("min_scale must be")) << v;
  }
  // max_scale > 0, finite, float32
  for (double v : {0.0, kNaN, kInf, 1e39}) {
    EXPECT_THAT(with([&](auto& o) { o.max_scale = v; }), HasSubstr("max_scale must be")) << v;
  }
  // max_scale >= min_scale
  EXPECT_THAT(with([](auto& o) {
                o.min_scale = 4;
                o.max_scale = 2;
                o.initial_scale = 3;
              }),
              HasSubstr("max_scale (2) must be >= min_scale (4)"));
  // min_scale <= initial_scale <= max_scale (ColossalAI's asserts)
  EXPECT_THAT(with([](auto& o) { o.initial_scale = 0.5; }),
              HasSubstr("initial_scale (0.5) must be >= min_scale (1)"));
  EXPECT_THAT(with([](auto& o) { o.initial_scale = std::ldexp(1.0, 33); }),
              HasSubstr("initial_scale (8589934592) must be <= max_scale (4294967296)"));
  // messages name the class
  EXPECT_THAT(with([](auto& o) { o.growth_factor = 1; }), HasSubstr("DynamicGradScaler: "));
}

TEST(DynamicGradScalerTest, RangeChecksAreInFloat32LikeColossalAI) {
  DynamicGradScalerOptions o;
  o.initial_scale = 1.0;
  o.min_scale = 1.00000001;  // rounds to 1.0f, as torch.tensor([min_scale], dtype=torch.float)
  EXPECT_NO_THROW(DynamicGradScaler s(o));
}

// ---------------------------------------------------------------------------------------------
// DynamicGradScaler::from_options

TEST(DynamicGradScalerOptionsTest, ReadsEveryKey) {
  const Config c = Config::from_string(
      "[mixed_precision]\n"
      "initial_scale = 1024\n"  // TOML integer accepted for a float option
      "growth_factor = 4.0\n"
      "backoff_factor = 0.25\n"
      "growth_interval = 50\n"
      "hysteresis = 3\n"
      "min_scale = 0.5\n"
      "max_scale = 65536.0\n");
  const booster::Options section = c.section("mixed_precision");
  const DynamicGradScalerOptions o = DynamicGradScaler::from_options(section);
  EXPECT_EQ(o.initial_scale, 1024.0);
  EXPECT_EQ(o.growth_factor, 4.0);
  EXPECT_EQ(o.backoff_factor, 0.25);
  EXPECT_EQ(o.growth_interval, 50);
  EXPECT_EQ(o.hysteresis, 3);
  EXPECT_EQ(o.min_scale, 0.5);
  EXPECT_EQ(o.max_scale, 65536.0);
  EXPECT_NO_THROW(section.check_unknown());  // every key was read
  DynamicGradScaler s(o);
  EXPECT_EQ(s.scale(), 1024.0);
}

TEST(DynamicGradScalerOptionsTest, EmptySectionGivesDefaults) {
  const DynamicGradScalerOptions o = DynamicGradScaler::from_options(booster::Options("mixed_precision"));
  const DynamicGradScalerOptions d;
  EXPECT_EQ(o.initial_scale, d.initial_scale);
  EXPECT_EQ(o.growth_factor, d.growth_factor);
  EXPECT_EQ(o.backoff_factor, d.backoff_factor);
  EXPECT_EQ(o.growth_interval, d.growth_interval);
  EXPECT_EQ(o.hysteresis, d.hysteresis);
  EXPECT_EQ(o.min_scale, d.min_scale);
  EXPECT_EQ(o.max_scale, d.max_scale);
}

TEST(DynamicGradScalerOptionsTest, ConfigErrors) {
  auto read = [](const std::string& line) {
    const Config c = Config::from_string("[mixed_precision]\n" + line + "\n", "mp.toml");
    return config_error_message([&] { DynamicGradScaler::from_options(c.section("mixed_precision")); });
  };
  EXPECT_THAT(read("growth_interval = 0"), HasSubstr("mixed_precision.growth_interval = 0 is out of range"));
  EXPECT_THAT(read("growth_interval = 0"), HasSubstr("mp.toml:2"));
  EXPECT_THAT(read("growth_interval = 10.0"), HasSubstr("must be an integer"));
  EXPECT_THAT(read("hysteresis = -1"), HasSubstr("mixed_precision.hysteresis"));
  EXPECT_THAT(read("backoff_factor = 1.5"), HasSubstr("mixed_precision.backoff_factor"));
  EXPECT_THAT(read("growth_factor = 0.5"), HasSubstr("mixed_precision.growth_factor"));
  EXPECT_THAT(read("initial_scale = -1"), HasSubstr("mixed_precision.initial_scale"));
  EXPECT_THAT(read("min_scale = \"1\""), HasSubstr("must be a number"));
  EXPECT_THAT(read("max_scale = 1e39"), HasSubstr("mixed_precision.max_scale"));
  // strict bounds are the constructor's
  const Config c = Config::from_string("[mixed_precision]\ngrowth_factor = 1\n");
  const DynamicGradScalerOptions o = DynamicGradScaler::from_options(c.section("mixed_precision"));
  EXPECT_THAT(invalid_message([&] { DynamicGradScaler s(o); }), HasSubstr("growth_factor must be"));
}

TEST(DynamicGradScalerOptionsTest, DoesNotCheckUnknownKeys) {
  const Config c = Config::from_string("[mixed_precision]\ninital_scale = 8\n");
  const booster::Options section = c.section("mixed_precision");
  EXPECT_NO_THROW(DynamicGradScaler::from_options(section));
  EXPECT_THAT(config_error_message([&] { section.check_unknown(); }), HasSubstr("initial_scale"));
}

// ---------------------------------------------------------------------------------------------
// ConstantGradScaler

TEST(GradScalerConstantTest, ScaleNeverChanges) {
  ConstantGradScaler scaler(1024.0);
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_EQ(scaler.inv_scale(), 1.0 / 1024.0);
  for (int i = 0; i < 2000; ++i) scaler.update(i % 3 == 0);
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_EQ(scaler.overflow_count(), 667);
  const ScalerState s = scaler.state_dict();
  EXPECT_EQ(s.scale, 1024.0);
  EXPECT_EQ(s.growth_step, 0);
  EXPECT_EQ(s.hysteresis_step, 0);
}

TEST(GradScalerConstantTest, LoadStateDictTakesTheScale) {
  // ColossalAI's BaseGradScaler.load_state_dict: self._scale = state_dict['scale']
  ConstantGradScaler scaler(1024.0);
  scaler.load_state_dict({8.0, 5, 7});
  EXPECT_EQ(scaler.scale(), 8.0);
  EXPECT_EQ(scaler.state_dict().growth_step, 0);
  EXPECT_THAT(invalid_message([&] { scaler.load_state_dict({0.0, 0, 0}); }), HasSubstr("scale must be"));
  EXPECT_EQ(scaler.scale(), 8.0);
}

TEST(GradScalerConstantTest, ValidationErrors) {
  for (double v : {0.0, -1.0, kNaN, kInf, 1e39}) {
    EXPECT_THAT(invalid_message([&] { ConstantGradScaler s(v); }), HasSubstr("ConstantGradScaler: initial_scale"))
        << v;
  }
}

TEST(GradScalerConstantTest, ThroughTheBaseClass) {
  std::vector<std::unique_ptr<GradScaler>> scalers;
  scalers.push_back(std::make_unique<ConstantGradScaler>(4.0));
  DynamicGradScalerOptions o;
  o.initial_scale = 4;
  o.hysteresis = 1;
  scalers.push_back(std::make_unique<DynamicGradScaler>(o));
  for (auto& s : scalers) s->update(true);
  EXPECT_EQ(scalers[0]->scale(), 4.0);
  EXPECT_EQ(scalers[1]->scale(), 2.0);
  EXPECT_EQ(scalers[1]->inv_scale(), 0.5);
  EXPECT_EQ(scalers[0]->overflow_count(), 1);
  EXPECT_EQ(scalers[1]->overflow_count(), 1);
}

// ---------------------------------------------------------------------------------------------
// has_inf_or_nan

TEST(GradScalerHelpersTest, HasInfOrNanFloat32) {
  const double inf = kInf;
  EXPECT_FALSE(has_inf_or_nan({}));
  EXPECT_FALSE(has_inf_or_nan({at::ones({3, 4}), at::zeros({5})}));
  for (double bad : {inf, -inf, kNaN}) {
    at::Tensor t = at::randn({7, 9});
    t[3][4] = bad;
    EXPECT_TRUE(has_inf_or_nan({t})) << bad;
    EXPECT_TRUE(has_inf_or_nan({at::ones({2}), t})) << bad;  // in the second tensor only
    EXPECT_TRUE(has_inf_or_nan({t, at::ones({2})})) << bad;
  }
  // -inf and +inf together (inf + -inf would cancel to nan in a sum; here both are caught)
  EXPECT_TRUE(has_inf_or_nan({at::tensor({-inf, inf})}));
  // 0-dim tensors
  EXPECT_TRUE(has_inf_or_nan({at::scalar_tensor(kNaN)}));
  EXPECT_FALSE(has_inf_or_nan({at::scalar_tensor(3.0)}));
}

TEST(GradScalerHelpersTest, HasInfOrNanNoFalsePositiveOnLargeFiniteValues) {
  // A sum of these overflows (the sum trick would report an overflow); every element is finite.
  EXPECT_FALSE(has_inf_or_nan({at::full({1000}, 3e38, at::kFloat)}));
  EXPECT_FALSE(has_inf_or_nan({at::full({1000}, 60000.0, at::kHalf), at::full({1000}, -60000.0, at::kHalf)}));
  EXPECT_FALSE(has_inf_or_nan({at::tensor({-DBL_MAX, DBL_MAX}, at::TensorOptions().dtype(at::kDouble))}));
}

TEST(GradScalerHelpersTest, HasInfOrNanHalfAndBFloat16) {
  for (at::ScalarType dtype : {at::kHalf, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    EXPECT_FALSE(has_inf_or_nan({at::randn({33, 17}).to(dtype)}));
    for (double bad : {kInf, -kInf, kNaN}) {
      at::Tensor t = at::randn({33, 17}).to(dtype);
      t[32][16] = bad;
      EXPECT_TRUE(has_inf_or_nan({t})) << bad;
    }
    // 70000 overflows float16 when the tensor is made: inf; fine in bfloat16
    const bool expected = dtype == at::kHalf;
    EXPECT_EQ(has_inf_or_nan({at::full({4}, 70000.0).to(dtype)}), expected);
  }
}

TEST(GradScalerHelpersTest, HasInfOrNanSkipsUndefinedEmptyAndIntegerTensors) {
  EXPECT_FALSE(has_inf_or_nan({at::Tensor(), at::ones({3}), at::Tensor()}));
  EXPECT_TRUE(has_inf_or_nan({at::Tensor(), at::full({3}, kNaN)}));
  EXPECT_FALSE(has_inf_or_nan({at::empty({0}), at::empty({4, 0}, at::kHalf)}));
  EXPECT_FALSE(has_inf_or_nan({at::arange(10, at::kLong), at::ones({3}, at::kBool)}));
}

TEST(GradScalerHelpersTest, HasInfOrNanLargeAndStrided) {
  // large enough for the vectorized / parallel reduction paths
  at::Tensor big = at::randn({1 << 20});
  EXPECT_FALSE(has_inf_or_nan({big}));
  big[(1 << 20) - 3] = kNaN;
  EXPECT_TRUE(has_inf_or_nan({big}));
  // non-contiguous views: only the elements of the view count
  at::Tensor m = at::randn({64, 64});
  m[5][0] = kInf;
  EXPECT_TRUE(has_inf_or_nan({m.t()}));
  EXPECT_TRUE(has_inf_or_nan({m.select(1, 0)}));
  EXPECT_FALSE(has_inf_or_nan({m.select(1, 1)}));
  EXPECT_FALSE(has_inf_or_nan({m.slice(0, 6, 64, 2)}));
}

TEST(GradScalerHelpersTest, HasInfOrNanComplex) {
  at::Tensor z = at::zeros({4}, at::kComplexFloat);
  EXPECT_FALSE(has_inf_or_nan({z}));
  at::Tensor parts = at::zeros({4, 2});
  parts[2][1] = kInf;  // imaginary part
  EXPECT_TRUE(has_inf_or_nan({at::view_as_complex(parts)}));
  EXPECT_TRUE(has_inf_or_nan({at::view_as_complex(parts).conj()}));
}

// ---------------------------------------------------------------------------------------------
// unscale_grads

TEST(GradScalerHelpersTest, UnscaleGradsInPlace) {
  at::Tensor a = at::tensor({1024.0, -2048.0, 0.5}, at::TensorOptions().dtype(at::kFloat));
  at::Tensor h = at::tensor({1024.0, 3072.0}, at::TensorOptions().dtype(at::kFloat)).to(at::kHalf);
  at::Tensor b = at::tensor({4096.0}, at::TensorOptions().dtype(at::kFloat)).to(at::kBFloat16);
  const void* a_data = a.data_ptr();
  unscale_grads({a, at::Tensor(), h, b}, 1.0 / 1024.0);
  EXPECT_EQ(a.data_ptr(), a_data);  // in place
  EXPECT_TRUE(at::equal(a, at::tensor({1.0, -2.0, 0.5 / 1024.0}, at::TensorOptions().dtype(at::kFloat))));
  EXPECT_EQ(h.scalar_type(), at::kHalf);
  EXPECT_TRUE(at::equal(h.to(at::kFloat), at::tensor({1.0, 3.0}, at::TensorOptions().dtype(at::kFloat))));
  EXPECT_EQ(b.item<float>(), 4.0f);
  // views share storage: unscaling a view changes the base
  at::Tensor base = at::full({4}, 8.0);
  unscale_grads({base.slice(0, 0, 2)}, 0.5);
  EXPECT_TRUE(at::equal(base, at::tensor({4.0, 4.0, 8.0, 8.0}, at::TensorOptions().dtype(at::kFloat))));
}

TEST(GradScalerHelpersTest, UnscaleGradsByOneAndErrors) {
  at::Tensor a = at::full({3}, 5.0);
  unscale_grads({a}, 1.0);
  EXPECT_TRUE(at::equal(a, at::full({3}, 5.0)));
  unscale_grads({}, 0.5);
  EXPECT_THAT(invalid_message([&] { unscale_grads({a}, kInf); }), HasSubstr("inv_scale must be finite"));
  EXPECT_THAT(invalid_message([&] { unscale_grads({a}, kNaN); }), HasSubstr("inv_scale must be finite"));
  EXPECT_TRUE(at::equal(a, at::full({3}, 5.0)));
}

TEST(GradScalerHelpersTest, UnscaleWithScalerInvScale) {
  DynamicGradScaler scaler;
  at::Tensor g = at::full({8}, 3.0).mul(scaler.scale());
  EXPECT_FALSE(has_inf_or_nan({g}));
  unscale_grads({g}, scaler.inv_scale());
  EXPECT_TRUE(at::equal(g, at::full({8}, 3.0)));
}
