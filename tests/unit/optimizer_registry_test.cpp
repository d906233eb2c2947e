// optimizer_registry_test.cpp — the optimizer registry: LibTorch's five optimizers are built in
// (names, keys, JSON keys, memory rule); a user-registered optimizer (DebiasedMomentum,
// tests/common/debiased_momentum.h) checkpoints by parameter name and resumes bit-exactly, and runs
// under ZeRO on a world of one; an unregistered type, a second registration and inconsistent
// specs are clear errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "booster/booster.h"
#include "booster/checkpoint/checkpoint_io.h"
#include "booster/checkpoint/safetensors.h"
#include "booster/dist/process_group.h"
#include "booster/optim/optimizer_registry.h"
#include "booster/wrappers/optimizer_wrapper.h"
#include "booster/wrappers/zero_optimizer.h"
#include "common/debiased_momentum.h"
#include "common/small_net.h"
#include "common/test_util.h"
#include "common/tensor_test_util.h"

using namespace booster;
using booster::checkpoint::CheckpointError;
using booster::checkpoint::CheckpointIO;
using booster::testing::DebiasedMomentum;
using booster::testing::DebiasedMomentumOptions;
using booster::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsSupersetOf;
using ::testing::ThrowsMessage;

namespace {

using booster::testing::world_of_one;

std::set<std::string> json_keys(const nlohmann::json& j) {
  std::set<std::string> keys;
  for (auto& [k, v] : j.items()) keys.insert(k);
  return keys;
}

using booster::testing::Net;

// DebiasedMomentum with two parameter groups of different options, wrapped as boost() would.
struct RegistryTrainer : booster::testing::NetTrainer {
  RegistryTrainer() {
    booster::testing::ensure_debiased_momentum_registered();
    seed_base = 200;
    torch::manual_seed(5);
    net = Net();
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(net->a->parameters(),
                        std::make_unique<DebiasedMomentumOptions>(DebiasedMomentumOptions(0.05).beta(0.8)));
    groups.emplace_back(net->b->parameters(), std::make_unique<DebiasedMomentumOptions>(
                                                  DebiasedMomentumOptions(0.02).weight_decay(0.1).debias(false)));
    opt = std::make_shared<DebiasedMomentum>(std::move(groups), DebiasedMomentumOptions(0.01));
    wrap();
  }
};

// SGD by another name: a subclass is its own type for the registry.
struct UnregisteredSGD : torch::optim::SGD {
  using torch::optim::SGD::SGD;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Built-ins

TEST(OptimizerRegistry, BuiltinsResolveByTypeAndByName) {
  using namespace torch::optim;
  auto p = std::vector<torch::Tensor>{torch::zeros({3, 2}, torch::requires_grad())};
  SGD sgd(p, SGDOptions(0.1));
  Adam adam(p, AdamOptions(0.1).amsgrad(true));
  AdamW adamw(p, AdamWOptions(0.1));
  RMSprop rmsprop(p, RMSpropOptions(0.1).momentum(0.5).centered(true));
  Adagrad adagrad(p, AdagradOptions(0.1));
  struct Case {
    torch::optim::Optimizer* opt;
    std::string name;
    std::vector<std::string> tensor_keys, scalar_keys, json_keys;
    int64_t per_element;
  };
  std::vector<Case> cases{
      {&sgd, "SGD", {"momentum_buffer"}, {}, {"dampening", "lr", "momentum", "nesterov", "weight_decay"}, 0},
      {&adam, "Adam", {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, {"step"},
       {"amsgrad", "betas", "eps", "lr", "weight_decay"}, 3},
      {&adamw, "AdamW", {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, {"step"},
       {"amsgrad", "betas", "eps", "lr", "weight_decay"}, 2},
      {&rmsprop, "RMSprop", {"square_avg", "momentum_buffer", "grad_avg"}, {"step"},
       {"alpha", "centered", "eps", "lr", "momentum", "weight_decay"}, 3},
      {&adagrad, "Adagrad", {"sum"}, {"step"}, {"eps", "initial_accumulator_value", "lr", "lr_decay", "weight_decay"}, 1},
  };
  for (const auto& c : cases) {
    const OptimizerTypeInfo& info = optimizer_type_info(*c.opt);
    EXPECT_EQ(info.name(), c.name);
    EXPECT_EQ(&optimizer_type_info(c.name), &info) << c.name;
    const auto& options = c.opt->param_groups()[0].options();
    EXPECT_EQ(&optimizer_type_info_for_options(options), &info) << c.name;
    EXPECT_EQ(info.tensor_keys(), c.tensor_keys) << c.name;
    EXPECT_EQ(info.scalar_keys(), c.scalar_keys) << c.name;
    auto j = info.options_to_json(options);
    EXPECT_EQ(json_keys(j), std::set<std::string>(c.json_keys.begin(), c.json_keys.end())) << c.name;
    EXPECT_EQ(j.at("lr").get<double>(), 0.1) << c.name;
    EXPECT_EQ(info.state_tensors_per_element(options), c.per_element) << c.name;
  }
  EXPECT_EQ(optimizer_type_info(adam).options_to_json(adam.param_groups()[0].options()).dump(),
            R"({"amsgrad":true,"betas":[0.9,0.999],"eps":1e-08,"lr":0.1,"weight_decay":0.0})");
  EXPECT_THAT(registered_optimizer_names(), IsSupersetOf({"Adagrad", "Adam", "AdamW", "RMSprop", "SGD"}));
  // An entry checks the dynamic type of what it is given.
  EXPECT_THAT([&] { optimizer_type_info("SGD").options_to_json(adam.param_groups()[0].options()); },
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("optimizer SGD was given options of type "
                                                                   "torch::optim::AdamOptions"),
                                                         HasSubstr("torch::optim::SGDOptions"))));
}

TEST(OptimizerRegistry, BuiltinStateRoundTripsAndRejectsForeignKeys) {
  auto p = torch::randn({4, 3}, torch::requires_grad());
  torch::optim::AdamW adamw({p}, torch::optim::AdamWOptions(0.1));
  p.mutable_grad() = torch::randn({4, 3});
  adamw.step();
  const OptimizerTypeInfo& info = optimizer_type_info(adamw);
  ParamOptimState s = info.extract_state(*adamw.state().begin()->second);
  EXPECT_EQ(s.scalars, (std::map<std::string, int64_t>{{"step", 1}}));
  ASSERT_EQ(s.tensors.size(), 2u);  // max_exp_avg_sq is undefined without amsgrad: dropped
  ParamOptimState back = info.extract_state(*info.make_state(s));
  EXPECT_EQ(back.scalars, s.scalars);
  for (const auto& [k, t] : s.tensors) EXPECT_TRUE(torch::equal(back.tensors.at(k), t)) << k;
  ParamOptimState foreign;
  foreign.tensors["momentum_buffer"] = torch::zeros({4, 3});
  EXPECT_THAT([&] { info.make_state(foreign); },
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("'momentum_buffer' is not a state tensor of optimizer AdamW"),
                                                         HasSubstr("exp_avg, exp_avg_sq, max_exp_avg_sq"))));
  EXPECT_THAT([&] { optimizer_type_info("SGD").extract_state(*adamw.state().begin()->second); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("torch::optim::AdamWParamState")));
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST(OptimizerRegistry, UnregisteredOptimizerIsAClearError) {
  auto p = torch::zeros({2}, torch::requires_grad());
  auto opt = std::make_shared<UnregisteredSGD>(std::vector<torch::Tensor>{p}, torch::optim::SGDOptions(0.1));
  auto names_what = AllOf(HasSubstr("optimizer type (anonymous namespace)::UnregisteredSGD is not registered"),
                          HasSubstr("registered: Adagrad, Adam, AdamW"),
                          HasSubstr("booster::register_optimizer<(anonymous namespace)::UnregisteredSGD>(spec)"),
                          HasSubstr("booster/optim/optimizer_registry.h"));
  EXPECT_THAT([&] { optimizer_type_info(*opt); }, ThrowsMessage<std::invalid_argument>(names_what));
  EXPECT_THAT([&] { optimizer_state_bytes(*opt); }, ThrowsMessage<std::invalid_argument>(names_what));
  EXPECT_THAT([&] { optimizer_type_info("UnregisteredSGD"); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("no optimizer is registered under the name "
                                                             "'UnregisteredSGD' (registered: Adagrad")));
  // Checkpoints refuse it with the same explanation.
  TempDir dir;
  CheckpointIO io(world_of_one());
  OptimizerWrapper wrapper(opt, nullptr);
  wrapper.set_parameter_names({"p"});
  EXPECT_THAT([&] { io.save_optimizer(wrapper, dir.file("opt"), {}); },
              ThrowsMessage<CheckpointError>(AllOf(HasSubstr("cannot checkpoint the optimizer"), names_what)));
}

TEST(OptimizerRegistry, SecondRegistrationIsAnErrorAndChangesNothing) {
  booster::testing::ensure_debiased_momentum_registered();
  const OptimizerTypeInfo& before = optimizer_type_info("DebiasedMomentum");
  auto names = registered_optimizer_names();
  // The same spec again.
  EXPECT_THAT([] { register_optimizer<DebiasedMomentum>(booster::testing::debiased_momentum_spec()); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("the name 'DebiasedMomentum' is already registered (for "
                                                             "booster::testing::DebiasedMomentum)")));
  // The same type under another name.
  auto renamed = booster::testing::debiased_momentum_spec();
  renamed.name = "DebiasedMomentum2";
  EXPECT_THAT([&] { register_optimizer<DebiasedMomentum>(renamed); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("optimizer type booster::testing::DebiasedMomentum is "
                                                             "already registered (as 'DebiasedMomentum')")));
  // Another type under a built-in's name.
  auto stolen = booster::testing::debiased_momentum_spec();
  stolen.name = "AdamW";
  EXPECT_THAT([&] { register_optimizer<UnregisteredSGD>(stolen); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("the name 'AdamW' is already registered (for "
                                                             "torch::optim::AdamW)")));
  EXPECT_EQ(registered_optimizer_names(), names);
  EXPECT_EQ(&optimizer_type_info("DebiasedMomentum"), &before);
}

TEST(OptimizerRegistry, IncompleteOrInconsistentSpecsAreRejected) {
  auto spec = booster::testing::debiased_momentum_spec;
  auto no_name = spec();
  no_name.name.clear();
  EXPECT_THAT([&] { make_optimizer_type_info<DebiasedMomentum>(no_name); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("the name is empty")));
  auto no_function = spec();
  no_function.options_from_json = nullptr;
  EXPECT_THAT([&] { make_optimizer_type_info<DebiasedMomentum>(no_function); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("every function of the spec is required")));
  auto twice = spec();
  twice.scalar_keys = {"momentum"};
  EXPECT_THAT([&] { make_optimizer_type_info<DebiasedMomentum>(twice); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("state key 'momentum' is empty or declared twice")));
  // get_state writing an undeclared key is caught when state is extracted.
  auto undeclared = spec();
  undeclared.tensor_keys = {"velocity"};
  OptimizerTypeInfo info = make_optimizer_type_info<DebiasedMomentum>(undeclared);
  booster::testing::DebiasedMomentumParamState st;
  st.momentum(torch::zeros({2}));
  EXPECT_THAT([&] { info.extract_state(st); },
              ThrowsMessage<std::logic_error>(HasSubstr("wrote state tensor 'momentum', which is not among its tensor "
                                                        "keys (velocity)")));
}

// ---------------------------------------------------------------------------------------------
// A user-registered optimizer in checkpoints and ZeRO

TEST(OptimizerRegistry, UserOptimizerRoundTripsThroughACheckpoint) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  RegistryTrainer full, first, resumed;
  full.steps(5, 0);
  first.steps(3, 0);
  io.save_model(*first.net, dir.file("model"), {});
  io.save_optimizer(*first.wrapper, dir.file("opt"), {});

  // The files: name-keyed state under the registered keys, the registered name and options.
  auto tensors = checkpoint::load_safetensors(dir.file("opt/optimizer.safetensors"));
  std::set<std::string> names;
  for (auto& [n, t] : tensors) names.insert(n);
  EXPECT_EQ(names, (std::set<std::string>{"a.weight.momentum", "a.bias.momentum", "b.weight.momentum",
                                          "b.bias.momentum"}));
  auto doc = nlohmann::json::parse(booster::testing::read_file(dir.file("opt/optimizer_groups.json")));
  EXPECT_EQ(doc.at("optimizer"), "DebiasedMomentum");
  EXPECT_EQ(doc.at("scalars").at("b.bias").at("step"), 3);
  EXPECT_EQ(doc.at("param_groups").at(1).at("options"),
            (nlohmann::json{{"lr", 0.02}, {"beta", 0.9}, {"weight_decay", 0.1}, {"debias", false}}));

  // Loading restores equal state and options (the resumed optimizer was built with others).
  resumed.opt->param_groups()[1].options().set_lr(1.0);
  io.load_model(*resumed.net, dir.file("model"));
  io.load_optimizer(*resumed.wrapper, dir.file("opt"));
  auto want = first.wrapper->gather_param_states(), got = resumed.wrapper->gather_param_states();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].scalars, want[i].scalars) << i;
    ASSERT_EQ(got[i].tensors.size(), 1u) << i;
    EXPECT_TRUE(torch::equal(got[i].tensors.at("momentum"), want[i].tensors.at("momentum"))) << i;
  }
  const auto& info = optimizer_type_info(*resumed.opt);
  for (size_t g = 0; g < 2; ++g)
    EXPECT_EQ(info.options_to_json(resumed.opt->param_groups()[g].options()),
              info.options_to_json(first.opt->param_groups()[g].options()))
        << "group " << g;

  // And training continues exactly as the uninterrupted run.
  resumed.steps(2, 3);
  auto p = full.net->parameters(), q = resumed.net->parameters();
  for (size_t i = 0; i < p.size(); ++i) EXPECT_TRUE(torch::equal(p[i], q[i])) << "param " << i;
  // A checkpoint of a built-in type is refused by name.
  RegistryTrainer other;
  auto sgd = std::make_shared<torch::optim::SGD>(other.net->parameters(), torch::optim::SGDOptions(0.1));
  OptimizerWrapper sgd_wrapper(sgd, nullptr);
  sgd_wrapper.set_parameter_names(other.wrapper->parameter_names());
  EXPECT_THAT([&] { io.load_optimizer(sgd_wrapper, dir.file("opt")); },
              ThrowsMessage<CheckpointError>(HasSubstr("holds DebiasedMomentum state but the optimizer is SGD")));
}

namespace {
Booster make_zero_booster() {
  booster::testing::ScopedEnv env;
  for (const char* v : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) env.unset(v);
  env.set("BOOSTER_PLUGIN_PATH", BOOSTER_PLUGIN_DIR);
  return Booster(Config::from_string("[booster]\nplugin = \"low_level_zero\"\n[plugin]\nprecision = \"fp32\"\nstage = 1\n",
                                     "test.toml"));
}
}  // namespace

TEST(OptimizerRegistry, UserOptimizerUnderZeroOnOneRankEqualsPlainLibTorch) {
  booster::testing::ensure_debiased_momentum_registered();
  Booster booster = make_zero_booster();
  torch::manual_seed(3);
  torch::nn::Linear net(5, 3), ref(5, 3);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < net->parameters().size(); ++i) ref->parameters()[i].copy_(net->parameters()[i]);
  }
  const auto options = DebiasedMomentumOptions(0.05).weight_decay(0.01);
  auto opt = std::make_shared<DebiasedMomentum>(net->parameters(), options);
  DebiasedMomentum ref_opt(ref->parameters(), options);
  Criterion mse = [](const torch::Tensor& y, const torch::Tensor& t) { return torch::mse_loss(y, t); };
  auto [model, optimizer, criterion, loader, scheduler] = booster.boost(net, opt, mse);
  ASSERT_NE(std::dynamic_pointer_cast<ZeroOptimizer>(optimizer), nullptr);
  // Planned before the first step from the registered rule: one fp32 tensor per element (18).
  EXPECT_EQ(booster.memory_report(model, optimizer.get()).optimizer_states, 18 * 4);
  for (int step = 0; step < 3; ++step) {
    torch::Tensor x = torch::randn({8, 5}), y = torch::randn({8, 3});
    booster.backward(criterion(model.forward(x), y), *optimizer);
    optimizer->step();
    optimizer->zero_grad();
    torch::mse_loss(ref->forward(x), y).backward();
    ref_opt.step();
    ref_opt.zero_grad();
  }
  auto want = ref->named_parameters();
  for (const auto& item : net->named_parameters())
    EXPECT_TRUE(torch::allclose(item.value(), want[item.key()], 1e-6, 1e-7)) << item.key();
  EXPECT_EQ(booster.memory_report(model, optimizer.get()).optimizer_states, 18 * 4);
  // ZeRO's gathered state is the reference's, keyed as registered.
  auto states = optimizer->gather_param_states();
  auto ref_params = ref->parameters();
  ASSERT_EQ(states.size(), ref_params.size());
  for (size_t i = 0; i < states.size(); ++i) {
    const auto& ref_state = static_cast<const booster::testing::DebiasedMomentumParamState&>(
        *ref_opt.state().at(optimizer_state_key(ref_params[i])));
    EXPECT_EQ(states[i].scalar("step"), 3);
    EXPECT_TRUE(torch::allclose(states[i].tensor("momentum"), ref_state.momentum(), 1e-6, 1e-7)) << i;
  }
  // An unregistered optimizer cannot be sharded: boost() names it and the fix (the plugin wraps it).
  torch::nn::Linear other(5, 3);
  auto unregistered = std::make_shared<UnregisteredSGD>(other->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_THAT([&] { booster.boost(other, unregistered, mse); },
              ThrowsMessage<PluginError>(AllOf(HasSubstr("(anonymous namespace)::UnregisteredSGD is not registered"),
                                                         HasSubstr("booster::register_optimizer<"))));
}
