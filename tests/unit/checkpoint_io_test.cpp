// checkpoint_io_test.cpp — CheckpointIO on a world of one: optimizer state by parameter name for
// every supported optimizer (save, load into fresh objects, continue == uninterrupted, bit-exact),
// validation errors before any change, dtype conversion on load (fp32 <-> bf16 exact, refused
// float -> integer, one log line per load), LR scheduler state, and the `booster ckpt` tool.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "booster/checkpoint/checkpoint_io.h"
#include "booster/dist/process_group.h"
#include "booster/logging.h"
#include "booster/lr_scheduler.h"
#include "booster/wrappers/optimizer_wrapper.h"
#include "common/small_net.h"
#include "common/test_util.h"
#include "common/tensor_test_util.h"

using namespace booster;
using namespace booster::checkpoint;
using booster::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

namespace {

using booster::testing::world_of_one;

using booster::testing::Net;

std::shared_ptr<torch::optim::Optimizer> make_opt(const std::string& kind, std::vector<torch::Tensor> p) {
  using namespace torch::optim;
  if (kind == "sgd") return std::make_shared<SGD>(p, SGDOptions(0.05).momentum(0.9).nesterov(true));
  if (kind == "adam") return std::make_shared<Adam>(p, AdamOptions(1e-2).amsgrad(true));
  if (kind == "adamw") return std::make_shared<AdamW>(p, AdamWOptions(1e-2).weight_decay(0.1));
  if (kind == "rmsprop") return std::make_shared<RMSprop>(p, RMSpropOptions(1e-3).momentum(0.5).centered(true));
  return std::make_shared<Adagrad>(p, AdagradOptions(0.1));
}

// A model + its optimizer wrapper with parameter names, as Booster::boost makes them.
struct Trainer : booster::testing::NetTrainer {
  explicit Trainer(const std::string& kind) {
    torch::manual_seed(3);
    net = Net();
    opt = make_opt(kind, net->parameters());
    wrap();
  }
};

class CheckpointIOOptimizers : public ::testing::TestWithParam<std::string> {};

// Runs fn with booster::log at info on rank 0 and returns what it printed (stdout).
template <class F>
std::string captured_log(F&& fn) {
  struct Restore {
    ~Restore() { booster::log::set_level("info"); }
  } restore;
  booster::log::set_rank(0);
  booster::log::set_level("info");
  ::testing::internal::CaptureStdout();
  try {
    fn();
  } catch (...) {
    ::testing::internal::GetCapturedStdout();
    throw;
  }
  return ::testing::internal::GetCapturedStdout();
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

// A Trainer whose model is cast to `dtype` (bf16) before the optimizer is built; with
// master_weights = false the optimizer steps the bf16 parameters and its state is bf16.
struct CastTrainer : booster::testing::NetTrainer {
  CastTrainer(at::ScalarType dtype, bool master_weights) {
    torch::manual_seed(3);
    net = Net();
    net->to(dtype);
    opt = make_opt("adamw", net->parameters());
    OptimizerWrapperOptions o;
    o.master_weights = master_weights;
    wrap(o);
  }
};

}  // namespace

TEST_P(CheckpointIOOptimizers, SaveLoadContinueEqualsUninterrupted) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  Trainer full(GetParam()), first(GetParam()), resumed(GetParam());
  full.steps(5, 0);
  first.steps(3, 0);
  io.save_model(*first.net, dir.file("model"), {});
  io.save_optimizer(*first.wrapper, dir.file("opt"), {});
  io.load_model(*resumed.net, dir.file("model"));
  io.load_optimizer(*resumed.wrapper, dir.file("opt"));
  resumed.steps(2, 3);
  auto p = full.net->parameters(), q = resumed.net->parameters();
  for (size_t i = 0; i < p.size(); ++i) EXPECT_TRUE(torch::equal(p[i], q[i])) << GetParam() << " param " << i;
}

INSTANTIATE_TEST_SUITE_P(CheckpointIO, CheckpointIOOptimizers,
                         ::testing::Values("sgd", "adam", "adamw", "rmsprop", "adagrad"));

TEST(CheckpointIO, OptimizerFileHasNameKeyedStateAndGroups) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  Trainer t("adamw");
  t.steps(2, 0);
  io.save_optimizer(*t.wrapper, dir.file("opt"), {});
  auto state = load_safetensors(dir.file("opt/optimizer.safetensors"));
  std::vector<std::string> names;
  for (auto& [n, v] : state) names.push_back(n);
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("a.weight.exp_avg", "a.weight.exp_avg_sq", "a.bias.exp_avg",
                                                      "a.bias.exp_avg_sq", "b.weight.exp_avg", "b.weight.exp_avg_sq",
                                                      "b.bias.exp_avg", "b.bias.exp_avg_sq"));
  std::string groups = booster::testing::read_file(dir.file("opt/optimizer_groups.json"));
  EXPECT_THAT(groups, HasSubstr("\"optimizer\": \"AdamW\""));
  EXPECT_THAT(groups, HasSubstr("\"step\": 2"));
  EXPECT_THAT(groups, HasSubstr("\"a.weight\""));
}

TEST(CheckpointIO, LoadOptimizerValidatesBeforeChangingAnything) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  Trainer adamw("adamw"), sgd("sgd");
  adamw.steps(1, 0);
  sgd.steps(1, 0);
  io.save_optimizer(*adamw.wrapper, dir.file("opt"), {});
  auto before = sgd.opt->state().size();
  EXPECT_THAT([&] { io.load_optimizer(*sgd.wrapper, dir.file("opt")); },
              ThrowsMessage<CheckpointError>(HasSubstr("holds AdamW state but the optimizer is SGD")));
  EXPECT_EQ(sgd.opt->state().size(), before);
  // Different parameter names.
  Trainer other("adamw");
  auto names = other.wrapper->parameter_names();
  names[0] = "renamed.weight";
  other.wrapper->set_parameter_names(names);
  EXPECT_THAT([&] { io.load_optimizer(*other.wrapper, dir.file("opt")); },
              ThrowsMessage<CheckpointError>(HasSubstr("renamed.weight")));
  // A wrapper not made by boost() has no names.
  auto bare = OptimizerWrapper(make_opt("sgd", other.net->parameters()), nullptr);
  EXPECT_THROW(io.save_optimizer(bare, dir.file("x"), {}), CheckpointError);
  EXPECT_THROW(io.load_optimizer(*adamw.wrapper, dir.file("missing")), CheckpointError);
}

TEST(CheckpointIO, StrictLoadReportsEveryProblemTogetherAndChangesNothing) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  Net saved;
  io.save_model(*saved, dir.file("m"), {});
  struct OtherImpl : torch::nn::Module {
    OtherImpl() {
      a = register_module("a", torch::nn::Linear(6, 4));  // wrong shape
      c = register_module("c", torch::nn::Linear(2, 2));  // missing in the file
    }
    torch::nn::Linear a{nullptr}, c{nullptr};
  };
  auto other = std::make_shared<OtherImpl>();
  auto w = other->a->weight.detach().clone();
  try {
    io.load_model(*other, dir.file("m"));
    FAIL() << "expected CheckpointError";
  } catch (const CheckpointError& e) {
    std::string m = e.what();
    EXPECT_THAT(m, HasSubstr("a.weight: shape [5, 6] in the checkpoint, [4, 6] in the model"));
    EXPECT_THAT(m, HasSubstr("missing keys (2): c.weight, c.bias"));
    EXPECT_THAT(m, HasSubstr("unexpected keys (2): b.weight, b.bias"));
  }
  EXPECT_TRUE(torch::equal(other->a->weight, w));
}

// ---------------------------------------------------------------------------------------------
// Dtype conversion on load

TEST(CheckpointIO, LoadModelConvertsFp32ToBf16AndBackExactlyAndLogsOnce) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  torch::manual_seed(11);
  Net fp32;
  io.save_model(*fp32, dir.file("fp32"), {});
  // fp32 -> bf16: each value is the bf16 rounding (nearest even) of the saved one, as Tensor.to gives.
  torch::manual_seed(12);
  Net bf16;
  bf16->to(at::kBFloat16);
  std::string log = captured_log([&] { io.load_model(*bf16, dir.file("fp32")); });
  auto want = fp32->named_parameters(), got = bf16->named_parameters();
  for (const auto& item : want) {
    const at::Tensor& t = got[item.key()];
    EXPECT_EQ(t.scalar_type(), at::kBFloat16) << item.key();
    EXPECT_TRUE(torch::equal(t, item.value().detach().to(at::kBFloat16))) << item.key();
  }
  EXPECT_EQ(count_of(log, "converted"), 1u) << log;
  EXPECT_THAT(log, HasSubstr("load_model " + dir.file("fp32") + ": converted 4 tensors Float -> BFloat16 "
                             "(the model's dtype)"));

  // bf16 -> fp32: widening is exact.
  io.save_model(*bf16, dir.file("bf16"), {});
  torch::manual_seed(13);
  Net back;
  log = captured_log([&] { io.load_model(*back, dir.file("bf16")); });
  auto widened = back->named_parameters();
  for (const auto& item : got) {
    EXPECT_EQ(widened[item.key()].scalar_type(), at::kFloat);
    EXPECT_TRUE(torch::equal(widened[item.key()], item.value().detach().to(at::kFloat))) << item.key();
  }
  EXPECT_EQ(count_of(log, "converted"), 1u) << log;
  EXPECT_THAT(log, HasSubstr("converted 4 tensors BFloat16 -> Float (the model's dtype)"));

  // Same dtype: no conversion, no line.
  log = captured_log([&] { io.load_model(*back, dir.file("fp32")); });
  EXPECT_EQ(count_of(log, "converted"), 0u) << log;
}

TEST(CheckpointIO, StrictLoadIntoOtherDtypeStillReportsMissingKeyAndShapeTogether) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  Net saved;
  io.save_model(*saved, dir.file("m"), {});
  struct OtherImpl : torch::nn::Module {
    OtherImpl() {
      a = register_module("a", torch::nn::Linear(6, 4));  // wrong shape
      b = register_module("b", torch::nn::Linear(5, 3));  // fine, converted
      c = register_module("c", torch::nn::Linear(2, 2));  // missing in the file
      to(at::kBFloat16);
    }
    torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
  };
  auto other = std::make_shared<OtherImpl>();
  auto w = other->b->weight.detach().clone();
  try {
    io.load_model(*other, dir.file("m"));
    FAIL() << "expected CheckpointError";
  } catch (const CheckpointError& e) {
    std::string m = e.what();
    EXPECT_THAT(m, HasSubstr("nothing was changed"));
    EXPECT_THAT(m, HasSubstr("shape/dtype mismatches (2): a.weight: shape [5, 6] in the checkpoint, [4, 6] in the "
                             "model, a.bias: shape [5] in the checkpoint, [4] in the model\n"));
    EXPECT_THAT(m, HasSubstr("missing keys (2): c.weight, c.bias"));
    EXPECT_THAT(m, ::testing::Not(HasSubstr("b.weight")));  // convertible: not a problem
  }
  EXPECT_TRUE(torch::equal(other->b->weight, w));
}

TEST(CheckpointIO, FloatIntoIntegerLoadsOnlyWholeNumbersOtherDtypesFollowTorchCanCast) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  // One module type whose buffers take any dtype.
  struct BuffersImpl : torch::nn::Module {
    BuffersImpl(at::ScalarType count, at::ScalarType mask, at::ScalarType step, at::ScalarType whole) {
      register_buffer("count", torch::tensor({2.0, 2.75, -3.5}).to(count));
      register_buffer("mask", torch::tensor({0, 1, 2}).to(mask));
      register_buffer("step", torch::tensor({7, 300}).to(step));
      register_buffer("whole", torch::tensor({256.0, -3.0, 0.0}).to(whole));  // as num_batches_tracked in bf16
    }
  };
  auto saved = std::make_shared<BuffersImpl>(at::kFloat, at::kBool, at::kLong, at::kBFloat16);
  io.save_model(*saved, dir.file("m"), {});

  // Float -> Long with 2.75 would truncate: refused in strict and non-strict mode, naming the tensor
  // and the value; nothing changes (not even the whole-number tensor that would load).
  auto ints = std::make_shared<BuffersImpl>(at::kLong, at::kBool, at::kLong, at::kLong);
  auto before = ints->named_buffers();
  std::map<std::string, at::Tensor> copies;
  for (const auto& item : before) copies[item.key()] = item.value().clone();
  for (bool strict : {true, false}) {
    EXPECT_THAT([&] { io.load_model(*ints, dir.file("m"), strict); },
                ThrowsMessage<CheckpointError>(HasSubstr(
                    "count: dtype Float in the checkpoint, Long in the model (refused: floating-point values would "
                    "be truncated: 2.75 is not a whole number")));
    for (const auto& item : ints->named_buffers()) EXPECT_TRUE(torch::equal(item.value(), copies[item.key()])) << item.key();
  }
  // A whole number out of the integer's range is refused too (256 into int8).
  auto bytes = std::make_shared<BuffersImpl>(at::kFloat, at::kBool, at::kLong, at::kChar);
  EXPECT_THAT([&] { io.load_model(*bytes, dir.file("m")); },
              ThrowsMessage<CheckpointError>(HasSubstr("whole: dtype BFloat16 in the checkpoint, Char in the model "
                                                       "(refused: floating-point values would be truncated: 256 is "
                                                       "out of Char's range")));
  // Long -> Bool (non-bool into bool) is refused.
  auto bools = std::make_shared<BuffersImpl>(at::kFloat, at::kBool, at::kBool, at::kLong);
  EXPECT_THAT([&] { io.load_model(*bools, dir.file("m")); },
              ThrowsMessage<CheckpointError>(HasSubstr("step: dtype Long in the checkpoint, Bool in the model "
                                                       "(refused: values would collapse to true/false")));

  // Float -> Double, Bool -> Float, Long -> Int (narrowing wraps as copy_ does) and BFloat16 whole
  // numbers -> Long convert.
  auto wide = std::make_shared<BuffersImpl>(at::kDouble, at::kFloat, at::kInt, at::kLong);
  std::string log = captured_log([&] { io.load_model(*wide, dir.file("m")); });
  auto buffers = wide->named_buffers();
  EXPECT_TRUE(torch::equal(buffers["count"], torch::tensor({2.0, 2.75, -3.5}, at::kDouble)));
  EXPECT_TRUE(torch::equal(buffers["mask"], torch::tensor({0.0f, 1.0f, 1.0f})));
  EXPECT_TRUE(torch::equal(buffers["step"], torch::tensor({7, 300}, at::kInt)));
  EXPECT_TRUE(torch::equal(buffers["whole"], torch::tensor({256, -3, 0}, at::kLong)));
  EXPECT_EQ(count_of(log, "converted"), 1u) << log;
  EXPECT_THAT(log, HasSubstr("converted 1 tensor Long -> Int, 1 tensor Float -> Double, 1 tensor Bool -> Float, "
                             "1 tensor BFloat16 -> Long (the model's dtypes)"));
}

TEST(CheckpointIO, LoadOptimizerConvertsStateToTheOptimizersDtype) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  // bf16 model without master weights: AdamW's moments are bf16.
  CastTrainer bf16(at::kBFloat16, /*master_weights=*/false);
  bf16.steps(2);
  io.save_optimizer(*bf16.wrapper, dir.file("bf16"), {});
  auto saved = bf16.wrapper->gather_param_states();
  ASSERT_EQ(saved[0].tensor("exp_avg").scalar_type(), at::kBFloat16);

  // Into fp32: exact widening, one line.
  Trainer fp32("adamw");
  std::string log = captured_log([&] { io.load_optimizer(*fp32.wrapper, dir.file("bf16")); });
  auto widened = fp32.wrapper->gather_param_states();
  ASSERT_EQ(widened.size(), saved.size());
  for (size_t i = 0; i < saved.size(); ++i)
    for (const char* k : {"exp_avg", "exp_avg_sq"}) {
      EXPECT_EQ(widened[i].tensor(k).scalar_type(), at::kFloat);
      EXPECT_TRUE(torch::equal(widened[i].tensor(k), saved[i].tensor(k).to(at::kFloat))) << i << " " << k;
      EXPECT_EQ(widened[i].scalar("step"), 2);
    }
  EXPECT_EQ(count_of(log, "converted"), 1u) << log;
  EXPECT_THAT(log, HasSubstr("load_optimizer " + dir.file("bf16") + ": converted 8 state tensors BFloat16 -> Float "
                             "(the optimizer's dtype)"));
  fp32.steps(1, 2);  // and it steps

  // fp32 state into the bf16 optimizer: rounded to nearest even.
  fp32.steps(1, 3);
  io.save_optimizer(*fp32.wrapper, dir.file("fp32"), {});
  auto full = fp32.wrapper->gather_param_states();
  CastTrainer into(at::kBFloat16, false);
  log = captured_log([&] { io.load_optimizer(*into.wrapper, dir.file("fp32")); });
  auto rounded = into.wrapper->gather_param_states();
  for (size_t i = 0; i < full.size(); ++i)
    EXPECT_TRUE(torch::equal(rounded[i].tensor("exp_avg_sq"), full[i].tensor("exp_avg_sq").to(at::kBFloat16))) << i;
  EXPECT_THAT(log, HasSubstr("converted 8 state tensors Float -> BFloat16 (the optimizer's dtype)"));
  into.steps(1);

  // With master weights (the default) a bf16 model's optimizer state is fp32: nothing to convert.
  CastTrainer masters(at::kBFloat16, /*master_weights=*/true);
  log = captured_log([&] { io.load_optimizer(*masters.wrapper, dir.file("fp32")); });
  EXPECT_EQ(count_of(log, "converted"), 0u) << log;
  EXPECT_EQ(masters.wrapper->gather_param_states()[0].tensor("exp_avg").scalar_type(), at::kFloat);
}

TEST(CheckpointIO, TiedWeightsAreWrittenOnceAndRestoredToBothNames) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  struct TiedImpl : torch::nn::Module {
    TiedImpl() {
      w = register_parameter("emb_weight", torch::randn({7, 4}));
      register_parameter("head_weight", w);  // the same tensor under a second name (weight tying)
    }
    torch::Tensor w;
  };
  auto saved = std::make_shared<TiedImpl>();
  io.save_model(*saved, dir.file("m"), {});
  auto file = load_safetensors(dir.file("m/model.safetensors"));
  ASSERT_EQ(file.size(), 1u);  // written once, as HF does
  EXPECT_EQ(file[0].first, "emb_weight");
  auto loaded = std::make_shared<TiedImpl>();
  io.load_model(*loaded, dir.file("m"));  // strict: head_weight is satisfied through the tie
  EXPECT_TRUE(torch::equal(loaded->named_parameters()["head_weight"], saved->w));
}

TEST(CheckpointIO, LrSchedulerRoundTrip) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  Trainer a("sgd"), b("sgd");
  booster::CosineAnnealingLR sa(*a.opt, 20), sb(*b.opt, 20);
  for (int i = 0; i < 7; ++i) sa.step();
  io.save_lr_scheduler(sa, dir.file("sched/lr_scheduler.json"));
  io.load_lr_scheduler(sb, dir.file("sched/lr_scheduler.json"));
  for (int i = 0; i < 5; ++i) {
    sa.step();
    sb.step();
    EXPECT_EQ(sa.get_last_lr(), sb.get_last_lr());
  }
}

TEST(CheckpointIO, BoosterCkptInspectAndConvert) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  Net net;
  io.save_model(*net, dir.file("m"), {});
  auto r = booster::testing::run_process({BOOSTER_CLI_PATH, "ckpt", "inspect", dir.file("m")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("format: safetensors"));
  EXPECT_THAT(r.output, HasSubstr("tensors: 4"));
  EXPECT_THAT(r.output, HasSubstr("total tensor bytes: 212"));  // (30 + 5 + 15 + 3) float32 = 212 bytes
  EXPECT_THAT(r.output, HasSubstr("a.weight  F32  [5, 6]"));
  auto c = booster::testing::run_process({BOOSTER_CLI_PATH, "ckpt", "convert", dir.file("m"), dir.file("bin"), "--to", "bin"});
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_TRUE(std::filesystem::exists(dir.file("bin/pytorch_model.bin")));
  auto x = load_state_dict(dir.file("m")), y = load_state_dict(dir.file("bin"));
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(torch::equal(x[i].second, y[i].second));
  auto bad = booster::testing::run_process({BOOSTER_CLI_PATH, "ckpt", "inspect", dir.file("nope")});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.output, HasSubstr("does not exist"));
}
