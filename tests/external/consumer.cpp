// consumer — an out-of-tree trainer: boosts a model with the third-party plugin (by the path given,
// or by name from the install's plugin directory) and trains one step with the installed torch_ddp
// plugin found by name, then saves that model to CHECKPOINT_DIR (for `booster ckpt inspect`).
// Exits non-zero on any mismatch.
#include <torch/torch.h>

#include <booster/booster.h>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::cerr << "usage: consumer CHECKPOINT_DIR [path to booster_plugin_third_party.so]\n"
                 "  without the path, the third_party plugin is loaded by name\n";
    return 2;
  }
  const std::string checkpoint_dir = argv[1];
  try {
    std::string toml = "[booster]\nplugin = \"third_party\"\n";
    if (argc == 3) toml += std::string("[plugin]\npath = \"") + argv[2] + "\"\n";
    booster::Booster third(booster::Config::from_string(toml));
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
    ddp.save_model(b2.model, checkpoint_dir);
    std::cout << "consumer ok: third_party (" << (argc == 3 ? "by path" : "by name")
              << ") and torch_ddp plugins loaded, model saved to " << checkpoint_dir << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "consumer: " << e.what() << std::endl;
    return 1;
  }
}
