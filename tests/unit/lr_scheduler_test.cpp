// lr_scheduler_test.cpp — booster/lr_scheduler.h against Python torch 2.11's torch.optim.lr_scheduler
// (and ColossalAI's warmup schedulers, mirrored in tests/unit/lr_scheduler_reference.py): every case's
// lr sequence over 150 steps with two param groups, state round trips through JSON, rebinding to a
// new optimizer, argument errors, and make_lr_scheduler from a config table.
#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "booster/config.h"
#include "booster/lr_scheduler.h"
#include "common/test_util.h"

#ifndef BOOSTER_PYTHON
#define BOOSTER_PYTHON "/usr/bin/python3"
#endif

namespace {

using booster::LRScheduler;
using booster::SchedulerState;

constexpr int kSteps = 150;
constexpr double kTol = 1e-12;

// Two param groups, lr 0.1 and 0.01, as the Python reference.
struct Opt {
  torch::Tensor p0 = torch::zeros({1}, torch::requires_grad());
  torch::Tensor p1 = torch::zeros({1}, torch::requires_grad());
  std::unique_ptr<torch::optim::Optimizer> opt;

  explicit Opt(bool adam = false, double lr0 = 0.1, double lr1 = 0.01) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    if (adam) {
      groups.emplace_back(std::vector<torch::Tensor>{p0}, std::make_unique<torch::optim::AdamOptions>(lr0));
      groups.emplace_back(std::vector<torch::Tensor>{p1}, std::make_unique<torch::optim::AdamOptions>(lr1));
      opt = std::make_unique<torch::optim::Adam>(std::move(groups), torch::optim::AdamOptions(lr0));
    } else {
      groups.emplace_back(std::vector<torch::Tensor>{p0}, std::make_unique<torch::optim::SGDOptions>(lr0));
      groups.emplace_back(std::vector<torch::Tensor>{p1}, std::make_unique<torch::optim::SGDOptions>(lr1));
      opt = std::make_unique<torch::optim::SGD>(std::move(groups), torch::optim::SGDOptions(lr0));
    }
  }
  std::vector<double> lrs() const {
    std::vector<double> out;
    for (const auto& g : opt->param_groups()) out.push_back(g.options().get_lr());
    return out;
  }
};

using Factory = std::function<std::unique_ptr<LRScheduler>(torch::optim::Optimizer&)>;

template <class S, class... A>
Factory make(A... args) {
  return [=](torch::optim::Optimizer& o) { return std::make_unique<S>(o, args...); };
}

// The same cases, by name, as lr_scheduler_reference.py's CASES.
const std::map<std::string, Factory>& cases() {
  using namespace booster;
  static const std::map<std::string, Factory> c = {
      {"step_30", make<StepLR>(int64_t{30})},
      {"step_7_g0.5", make<StepLR>(int64_t{7}, 0.5)},
      {"multistep_30_80", make<MultiStepLR>(std::vector<int64_t>{30, 80})},
      {"multistep_dups", make<MultiStepLR>(std::vector<int64_t>{0, 50, 50, 120}, 0.5)},
      {"exponential_0.97", make<ExponentialLR>(0.97)},
      {"exponential_1.01", make<ExponentialLR>(1.01)},
      {"cosine_50_etamin", make<CosineAnnealingLR>(int64_t{50}, 0.001)},
      {"cosine_150", make<CosineAnnealingLR>(int64_t{150})},
      {"cosine_7", make<CosineAnnealingLR>(int64_t{7}, 1e-4)},
      {"linear_warmup_150_20", make<LinearWarmupLR>(int64_t{150}, int64_t{20})},
      {"linear_warmup_150_0", make<LinearWarmupLR>(int64_t{150})},
      {"cosine_warmup_100_10", make<CosineAnnealingWarmupLR>(int64_t{100}, int64_t{10}, 1e-4)},
      {"cosine_warmup_150_0", make<CosineAnnealingWarmupLR>(int64_t{150})},
      {"cosine_warmup_150_1", make<CosineAnnealingWarmupLR>(int64_t{150}, int64_t{1})},
      {"polynomial_default", [](torch::optim::Optimizer& o) { return std::make_unique<PolynomialLR>(o); }},
      {"polynomial_100_2", make<PolynomialLR>(int64_t{100}, 2.0)},
      {"polynomial_120_0.5", make<PolynomialLR>(int64_t{120}, 0.5)},
      {"onecycle_default", make<OneCycleLR>(0.5, int64_t{150})},
      {"onecycle_linear_3phase",
       make<OneCycleLR>(std::vector<double>{1.0, 0.1}, int64_t{150}, 0.25, std::string("linear"), 10.0, 100.0,
                        true)},
      {"onecycle_cos_3phase_200",
       make<OneCycleLR>(0.3, int64_t{200}, 0.3, std::string("cos"), 25.0, 1e4, true)},
      {"lambda_pow",
       [](torch::optim::Optimizer& o) {
         return std::make_unique<LambdaLR>(o, [](int64_t e) { return std::pow(0.95, static_cast<double>(e)); });
       }},
      {"lambda_per_group",
       [](torch::optim::Optimizer& o) {
         return std::make_unique<LambdaLR>(
             o, std::vector<LambdaLR::Lambda>{
                    [](int64_t e) { return 1.0 / static_cast<double>(1 + e); },
                    [](int64_t e) { return std::pow(0.95, static_cast<double>(e)); }});
       }},
  };
  return c;
}

using Seq = std::vector<std::vector<double>>;

// Python's sequences, computed once per test binary run.
const std::map<std::string, Seq>& reference() {
  static const std::map<std::string, Seq> ref = [] {
    std::map<std::string, Seq> out;
    const auto result = booster::testing::run_process(
        {BOOSTER_PYTHON, std::string(BOOSTER_SOURCE_DIR) + "/tests/unit/lr_scheduler_reference.py"}, {}, 300);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    const std::string prefix = "REF_JSON ";
    const auto at = result.output.find(prefix);
    if (at == std::string::npos) {
      ADD_FAILURE() << "no REF_JSON line in the reference script's output:\n" << result.output;
      return out;
    }
    const auto eol = result.output.find('\n', at);
    const auto j = nlohmann::json::parse(result.output.substr(at + prefix.size(), eol - at - prefix.size()));
    for (const auto& [name, seq] : j.items()) out[name] = seq.get<Seq>();
    return out;
  }();
  return ref;
}

// Construction value, then the lr after each of `steps` steps.
Seq run_cpp(const Factory& f, int steps) {
  Opt o;
  auto s = f(*o.opt);
  Seq seq{s->get_last_lr()};
  for (int i = 0; i < steps; ++i) {
    s->step();
    seq.push_back(o.lrs());
  }
  return seq;
}

std::string case_test_name(const std::string& name) {
  std::string out = name;
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return out;
}

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const auto& [name, f] : cases()) names.push_back(name);
  return names;
}

template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "<no exception>";
}

// ---- every scheduler against Python

class LRSchedulerVsPyTorch : public ::testing::TestWithParam<std::string> {};

TEST_P(LRSchedulerVsPyTorch, SequenceMatches) {
  const std::string& name = GetParam();
  const auto& ref = reference();
  auto it = ref.find(name);
  ASSERT_NE(it, ref.end()) << "the reference script has no case " << name;
  const Seq& py = it->second;
  ASSERT_EQ(py.size(), static_cast<size_t>(kSteps + 1));
  const Seq cpp = run_cpp(cases().at(name), kSteps);
  double max_diff = 0;
  for (size_t e = 0; e < py.size(); ++e) {
    ASSERT_EQ(py[e].size(), 2u);
    ASSERT_EQ(cpp[e].size(), 2u);
    for (size_t g = 0; g < 2; ++g) {
      const double d = std::fabs(py[e][g] - cpp[e][g]);
      max_diff = std::max(max_diff, d);
      EXPECT_LE(d, kTol) << name << " epoch " << e << " group " << g << ": python " << py[e][g] << ", C++ "
                         << cpp[e][g];
    }
  }
  std::printf("[          ] %-26s max |C++ - python| = %.3g\n", name.c_str(), max_diff);
  RecordProperty("max_abs_diff", std::to_string(max_diff));
}

INSTANTIATE_TEST_SUITE_P(LRScheduler, LRSchedulerVsPyTorch, ::testing::ValuesIn(case_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return case_test_name(info.param);
                         });

TEST(LRScheduler, ReferenceCoversEveryCase) {
  std::vector<std::string> py;
  for (const auto& [name, seq] : reference()) py.push_back(name);
  EXPECT_EQ(py, case_names());
}

// ---- state round trip and rebind, for every case

class LRSchedulerResume : public ::testing::TestWithParam<std::string> {};

TEST_P(LRSchedulerResume, StateRoundTripContinuesIdentically) {
  const Factory& f = cases().at(GetParam());
  const Seq uninterrupted = run_cpp(f, 100);

  Seq seq;
  std::string json;
  {
    Opt o;
    auto s = f(*o.opt);
    seq.push_back(s->get_last_lr());
    for (int i = 0; i < 40; ++i) {
      s->step();
      seq.push_back(o.lrs());
    }
    json = s->to_json();
    EXPECT_EQ(s->last_epoch(), 40);
  }
  Opt fresh;
  auto s = f(*fresh.opt);
  const SchedulerState state = LRScheduler::from_json(json);
  EXPECT_EQ(state.type, s->type());
  EXPECT_EQ(state.last_epoch, 40);
  s->load_state_dict(state);
  EXPECT_EQ(s->last_epoch(), 40);
  EXPECT_EQ(s->get_last_lr(), seq.back());
  EXPECT_EQ(fresh.lrs(), seq.back());
  for (int i = 0; i < 60; ++i) {
    s->step();
    seq.push_back(fresh.lrs());
  }
  ASSERT_EQ(seq.size(), uninterrupted.size());
  for (size_t e = 0; e < seq.size(); ++e) EXPECT_EQ(seq[e], uninterrupted[e]) << "epoch " << e;
  // The JSON of the state is stable through a second round trip.
  EXPECT_EQ(LRScheduler::from_json(s->to_json()).extra, s->state_dict().extra);
}

TEST_P(LRSchedulerResume, RebindToNewOptimizerContinues) {
  const Factory& f = cases().at(GetParam());
  const Seq uninterrupted = run_cpp(f, 100);
  Opt first;
  auto s = f(*first.opt);
  Seq seq{s->get_last_lr()};
  for (int i = 0; i < 40; ++i) {
    s->step();
    seq.push_back(first.lrs());
  }
  Opt second(/*adam=*/true, 0.5, 0.5);  // another optimizer type, other lrs: rebind overwrites them
  s->rebind(*second.opt);
  EXPECT_EQ(&s->optimizer(), second.opt.get());
  EXPECT_EQ(second.lrs(), seq.back());
  for (int i = 0; i < 60; ++i) {
    s->step();
    seq.push_back(second.lrs());
  }
  EXPECT_EQ(first.lrs(), uninterrupted[40]) << "the old optimizer is no longer touched";
  for (size_t e = 0; e < seq.size(); ++e) EXPECT_EQ(seq[e], uninterrupted[e]) << "epoch " << e;
}

INSTANTIATE_TEST_SUITE_P(LRScheduler, LRSchedulerResume, ::testing::ValuesIn(case_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return case_test_name(info.param);
                         });

// ---- base behaviour

TEST(LRScheduler, ConstructionPerformsInitialStep) {
  Opt o;
  booster::LinearWarmupLR s(*o.opt, 100, 9);
  EXPECT_EQ(s.last_epoch(), 0);
  EXPECT_EQ(s.base_lrs(), (std::vector<double>{0.1, 0.01}));
  EXPECT_EQ(o.lrs(), (std::vector<double>{1.0 / 10 * 0.1, 1.0 / 10 * 0.01}));  // ColossalAI: (e+1)/(W+1) * lr
  EXPECT_EQ(s.get_last_lr(), o.lrs());
  EXPECT_EQ(s.type(), "LinearWarmupLR");
  s.step();
  EXPECT_EQ(s.last_epoch(), 1);
  EXPECT_EQ(s.get_last_lr(), o.lrs());
}

TEST(LRScheduler, ChainableSchedulersComposeWithExternalLrChanges) {
  // As PyTorch: StepLR multiplies whatever lr the optimizer holds.
  Opt o;
  booster::StepLR s(*o.opt, 2, 0.5);
  s.step();  // epoch 1: unchanged
  o.opt->param_groups()[0].options().set_lr(1.0);
  s.step();  // epoch 2: * 0.5
  EXPECT_EQ(o.lrs()[0], 0.5);
  EXPECT_EQ(o.lrs()[1], 0.005);
}

TEST(LRScheduler, LinearWarmupStaysAtZeroPastTotalSteps) {
  Opt o;
  booster::LinearWarmupLR s(*o.opt, 10, 2);
  for (int i = 0; i < 15; ++i) s.step();
  EXPECT_EQ(o.lrs(), (std::vector<double>{0.0, 0.0}));
}

TEST(LRScheduler, OneCyclePastTotalStepsThrowsAndChangesNothing) {
  Opt o;
  booster::OneCycleLR s(*o.opt, 1.0, 10);
  for (int i = 0; i < 10; ++i) s.step();
  const auto before = o.lrs();
  const std::string msg = error_of<std::invalid_argument>([&] { s.step(); });
  EXPECT_NE(msg.find("tried to step 11 times"), std::string::npos) << msg;
  EXPECT_NE(msg.find("total steps is 10"), std::string::npos) << msg;
  EXPECT_EQ(s.last_epoch(), 10);
  EXPECT_EQ(o.lrs(), before);
}

// ---- argument errors

TEST(LRScheduler, BadArgumentsThrowInvalidArgument) {
  using namespace booster;
  Opt o;
  auto& opt = *o.opt;
  struct Case {
    std::function<void()> f;
    std::string expect;
  };
  const std::vector<Case> bad = {
      {[&] { StepLR(opt, 0); }, "step_size must be > 0, got 0"},
      {[&] { StepLR(opt, -3); }, "step_size must be > 0, got -3"},
      {[&] { StepLR(opt, 10, 0.0); }, "gamma must be > 0"},
      {[&] { MultiStepLR(opt, {10}, -0.5); }, "gamma must be > 0"},
      {[&] { MultiStepLR(opt, {10, -1}); }, "milestones must be >= 0"},
      {[&] { ExponentialLR(opt, 0.0); }, "ExponentialLR: gamma must be > 0"},
      {[&] { CosineAnnealingLR(opt, 0); }, "T_max must be > 0, got 0"},
      {[&] { CosineAnnealingLR(opt, 10, -1.0); }, "eta_min must be >= 0"},
      {[&] { LinearWarmupLR(opt, 10, 11); }, "warmup_steps (11) must not exceed total_steps (10)"},
      {[&] { LinearWarmupLR(opt, 0); }, "total_steps must be > 0"},
      {[&] { LinearWarmupLR(opt, 10, -1); }, "warmup_steps must be >= 0"},
      {[&] { CosineAnnealingWarmupLR(opt, 10, 11); }, "warmup_steps (11) must not exceed total_steps (10)"},
      {[&] { CosineAnnealingWarmupLR(opt, 10, 10); }, "T_max = total_steps - warmup_steps = 0"},
      {[&] { PolynomialLR(opt, 0); }, "total_iters must be > 0"},
      {[&] { PolynomialLR(opt, 5, -1.0); }, "power must be >= 0"},
      {[&] { OneCycleLR(opt, 0.1, 100, 0.3, "exp"); }, "anneal_strategy must be \"cos\" or \"linear\", got \"exp\""},
      {[&] { OneCycleLR(opt, 0.1, 100, 1.5); }, "pct_start must be a number in [0, 1]"},
      {[&] { OneCycleLR(opt, 0.1, 0); }, "total_steps must be > 0"},
      {[&] { OneCycleLR(opt, std::vector<double>{0.1}, 100); }, "expected 2 values for max_lr"},
      {[&] { OneCycleLR(opt, 0.1, 10, 0.1); }, "zero length"},
      {[&] { LambdaLR(opt, LambdaLR::Lambda{}); }, "lr_lambda is empty"},
      {[&] { LambdaLR(opt, std::vector<LambdaLR::Lambda>{[](int64_t) { return 1.0; }}); },
       "expected 2 lr_lambdas"},
  };
  for (const auto& c : bad) {
    const std::string msg = error_of<std::invalid_argument>(c.f);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in: " << msg;
  }
}

TEST(LRScheduler, RebindRequiresSameGroupCount) {
  Opt o;
  booster::StepLR s(*o.opt, 10);
  auto p = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD one_group(std::vector<torch::Tensor>{p}, torch::optim::SGDOptions(0.1));
  const std::string msg = error_of<std::invalid_argument>([&] { s.rebind(one_group); });
  EXPECT_NE(msg.find("the new optimizer has 1 param groups, the scheduler was built for 2"), std::string::npos) << msg;
  EXPECT_EQ(&s.optimizer(), o.opt.get());
}

TEST(LRScheduler, LoadStateDictErrors) {
  Opt o;
  booster::StepLR step(*o.opt, 10);
  booster::CosineAnnealingLR cos(*o.opt, 10);
  for (int i = 0; i < 3; ++i) step.step();

  // Type mismatch names both types and changes nothing.
  std::string msg = error_of<std::invalid_argument>([&] { cos.load_state_dict(step.state_dict()); });
  EXPECT_NE(msg.find("StepLR"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CosineAnnealingLR"), std::string::npos) << msg;
  EXPECT_EQ(cos.last_epoch(), 0);

  // Group count mismatch names both counts.
  SchedulerState three = step.state_dict();
  three.base_lrs.push_back(0.1);
  three.last_lrs.push_back(0.1);
  msg = error_of<std::invalid_argument>([&] { step.load_state_dict(three); });
  EXPECT_NE(msg.find("3 base_lrs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2 param groups"), std::string::npos) << msg;

  // Missing / invalid hyperparameter.
  SchedulerState missing = step.state_dict();
  missing.extra.erase("gamma");
  msg = error_of<std::invalid_argument>([&] { step.load_state_dict(missing); });
  EXPECT_NE(msg.find("no 'gamma' entry"), std::string::npos) << msg;
  SchedulerState bad = step.state_dict();
  bad.extra["step_size"] = 2.5;
  msg = error_of<std::invalid_argument>([&] { step.load_state_dict(bad); });
  EXPECT_NE(msg.find("'step_size' = 2.5 is not an integer"), std::string::npos) << msg;
  EXPECT_EQ(step.last_epoch(), 3);

  // Malformed JSON.
  msg = error_of<std::invalid_argument>([] { LRScheduler::from_json("{not json"); });
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
  msg = error_of<std::invalid_argument>([] { LRScheduler::from_json(R"({"type":"StepLR"})"); });
  EXPECT_NE(msg.find("missing \"last_epoch\""), std::string::npos) << msg;
}

TEST(LRScheduler, StateDictContents) {
  Opt o;
  booster::MultiStepLR s(*o.opt, {30, 80, 80}, 0.5);
  for (int i = 0; i < 5; ++i) s.step();
  const SchedulerState st = s.state_dict();
  EXPECT_EQ(st.type, "MultiStepLR");
  EXPECT_EQ(st.last_epoch, 5);
  EXPECT_EQ(st.base_lrs, (std::vector<double>{0.1, 0.01}));
  EXPECT_EQ(st.extra.at("gamma"), 0.5);
  EXPECT_EQ(st.extra.at("milestone.30"), 1.0);
  EXPECT_EQ(st.extra.at("milestone.80"), 2.0);
  const auto j = nlohmann::json::parse(s.to_json());
  EXPECT_EQ(j.at("type"), "MultiStepLR");
  EXPECT_EQ(j.at("last_epoch"), 5);
  EXPECT_EQ(j.at("extra").at("milestone.80"), 2.0);
}

// ---- make_lr_scheduler

Seq run_sched(LRScheduler& s, Opt& o, int steps) {
  Seq seq{s.get_last_lr()};
  for (int i = 0; i < steps; ++i) {
    s.step();
    seq.push_back(o.lrs());
  }
  return seq;
}

TEST(LRSchedulerFactory, BuildsEachSchedulerLikeTheConstructor) {
  struct Case {
    std::string toml;
    std::string type;
    Factory direct;
  };
  using namespace booster;
  const std::vector<Case> cs = {
      {"name = \"step\"\nstep_size = 7\ngamma = 0.5", "StepLR", make<StepLR>(int64_t{7}, 0.5)},
      {"name = \"MultiStepLR\"\nmilestones = \"30, 80,80\"", "MultiStepLR",
       make<MultiStepLR>(std::vector<int64_t>{30, 80, 80})},
      {"name = \"exponential\"\ngamma = 0.97", "ExponentialLR", make<ExponentialLR>(0.97)},
      {"name = \"cosine\"\neta_min = 0.001", "CosineAnnealingLR", make<CosineAnnealingLR>(int64_t{120}, 0.001)},
      {"name = \"cosine\"\nT_max = 30", "CosineAnnealingLR", make<CosineAnnealingLR>(int64_t{30})},
      {"name = \"linear_warmup\"\nwarmup_steps = 12", "LinearWarmupLR",
       make<LinearWarmupLR>(int64_t{120}, int64_t{12})},
      {"name = \"CosineAnnealingWarmupLR\"\nwarmup_steps = 10\neta_min = 1e-4\ntotal_steps = 90",
       "CosineAnnealingWarmupLR", make<CosineAnnealingWarmupLR>(int64_t{90}, int64_t{10}, 1e-4)},
      {"name = \"polynomial\"\npower = 2", "PolynomialLR", make<PolynomialLR>(int64_t{120}, 2.0)},
      {"name = \"onecycle\"\nmax_lr = 0.4\nanneal_strategy = \"linear\"\nthree_phase = true", "OneCycleLR",
       make<OneCycleLR>(0.4, int64_t{120}, 0.3, std::string("linear"), 25.0, 1e4, true)},
      {"name = \"onecycle\"", "OneCycleLR",  // max_lr defaults to each group's lr
       make<OneCycleLR>(std::vector<double>{0.1, 0.01}, int64_t{120})},
  };
  for (const auto& c : cs) {
    SCOPED_TRACE(c.toml);
    const auto cfg = Config::from_string("[train.lr_scheduler]\n" + c.toml + "\n");
    Opt a;
    auto s = make_lr_scheduler(cfg.section("train").table("lr_scheduler"), *a.opt, 120);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->type(), c.type);
    Opt b;
    auto d = c.direct(*b.opt);
    EXPECT_EQ(run_sched(*s, a, 120), run_sched(*d, b, 120));
  }
}

TEST(LRSchedulerFactory, NoneGivesNullptr) {
  Opt o;
  EXPECT_EQ(booster::make_lr_scheduler(booster::Config::from_string("[train]\nname = \"none\"\n").section("train"),
                                       *o.opt, 100),
            nullptr);
  EXPECT_EQ(booster::make_lr_scheduler(booster::Options("train"), *o.opt, 100), nullptr);
  EXPECT_EQ(o.lrs(), (std::vector<double>{0.1, 0.01}));
}

TEST(LRSchedulerFactory, ConfigErrors) {
  using booster::Config;
  using booster::ConfigError;
  const auto err = [](const std::string& toml, int64_t total_steps = 100) {
    Opt o;
    const std::string msg = error_of<ConfigError>([&] {
      booster::make_lr_scheduler(Config::from_string("[train]\n" + toml + "\n", "cfg.toml").section("train"),
                                 *o.opt, total_steps);
    });
    // A failed build never touches the optimizer.
    EXPECT_EQ(o.lrs(), (std::vector<double>{0.1, 0.01})) << toml;
    return msg;
  };
  std::string msg = err("name = \"step\"\nstep_size = 10\ngama = 0.5");
  EXPECT_NE(msg.find("gama"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'gamma'"), std::string::npos) << msg;

  msg = err("name = \"cosin\"");
  EXPECT_NE(msg.find("is not one of"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean \"cosine\""), std::string::npos) << msg;

  msg = err("name = \"step\"");
  EXPECT_NE(msg.find("train.step_size is required"), std::string::npos) << msg;

  msg = err("name = \"step\"\nstep_size = 0");
  EXPECT_NE(msg.find("train.step_size = 0 is out of range"), std::string::npos) << msg;

  msg = err("name = \"multistep\"\nmilestones = \"30,x\"");
  EXPECT_NE(msg.find("\"x\" is not a non-negative integer"), std::string::npos) << msg;

  msg = err("name = \"multistep\"\nmilestones = [30, 80]");
  EXPECT_NE(msg.find("comma-separated string"), std::string::npos) << msg;

  msg = err("name = \"linear_warmup\"\nwarmup_steps = 200");
  EXPECT_NE(msg.find("warmup_steps (200) must not exceed total_steps (100)"), std::string::npos) << msg;

  msg = err("name = \"cosine_warmup\"", 0);
  EXPECT_NE(msg.find("train.total_steps"), std::string::npos) << msg;

  msg = err("name = \"onecycle\"\nanneal_strategy = \"exp\"");
  EXPECT_NE(msg.find("anneal_strategy"), std::string::npos) << msg;

  // Keys of another scheduler are unknown to this one.
  msg = err("name = \"cosine\"\nstep_size = 3");
  EXPECT_NE(msg.find("step_size"), std::string::npos) << msg;
}

}  // namespace
