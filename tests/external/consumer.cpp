// consumer — an out-of-tree trainer: boosts a model with a third-party plugin loaded by path and
// with the installed torch_ddp plugin found through BOOSTER_PLUGIN_PATH; exits non-zero on mismatch.
#include <torch/torch.h>

#include <booster/booster.h>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: consumer <path to booster_plugin_third_party.so>\n";
    return 2;
  }
  try {
    auto config = booster::Config::from_string(std::string("[booster]\nplugin = \"third_party\"\n[plugin]\npath = \"") +
                                               argv[1] + "\"\n");
    booster::Booster third(config);
    auto net = torch::nn::Linear(4, 2);
    auto boosted = third.boost(net);
    auto x = torch::randn({3, 4});
    auto y = boosted.model.forward(x);
    if (!torch::equal(y, net->forward(x))) throw std::runtime_error("forward differs");
    if (boosted.model.hooks().stats().at("forwards") != 1) throw std::runtime_error("plugin hooks did not run");

    booster::Booster ddp(booster::Config::from_string("[booster]\nplugin = \"torch_ddp\"\n"));
    auto net2 = torch::nn::Linear(4, 2);
    auto opt = std::make_shared<torch::optim::SGD>(net2->parameters(), torch::optim::SGDOptions(0.1));
    auto b2 = ddp.boost(net2, opt);
    auto loss = b2.model.forward(x).sum();
    ddp.backward(loss, *b2.optimizer);
    b2.optimizer->step();
    std::cout << "consumer ok: third_party and torch_ddp plugins loaded" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "consumer: " << e.what() << std::endl;
    return 1;
  }
}
