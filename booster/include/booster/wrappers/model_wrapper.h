// model_wrapper.h — the boosted model: calls the user's `forward` with its native signature and the
// plugin's type-erased hooks around it. Header-only (a template over the user's module type M).
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <stdexcept>
#include <utility>

#include "booster/wrappers/model_hooks.h"

namespace booster {

template <class M>
class ModelWrapper {
 public:
  ModelWrapper() = default;
  ModelWrapper(std::shared_ptr<M> module, std::shared_ptr<ModelHooks> hooks)
      : module_(std::move(module)), hooks_(std::move(hooks)) {}

  // Runs hooks->pre_forward(), M::forward(args...), hooks->post_forward(); returns forward's result.
  // If forward throws, hooks->abort_forward() runs and the exception propagates.
  template <class... Args>
  decltype(auto) forward(Args&&... args) {
    check();
    hooks_->pre_forward();
    try {
      if constexpr (std::is_void_v<decltype(module_->forward(std::forward<Args>(args)...))>) {
        module_->forward(std::forward<Args>(args)...);
        hooks_->post_forward();
      } else {
        auto out = module_->forward(std::forward<Args>(args)...);
        hooks_->post_forward();
        return out;
      }
    } catch (...) {
      hooks_->abort_forward();
      throw;
    }
  }
  template <class... Args>
  decltype(auto) operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  M* operator->() { return module_.get(); }
  M& operator*() { return *module_; }
  const std::shared_ptr<M>& module() const { return module_; }
  ModelHooks& hooks() { check(); return *hooks_; }
  const std::shared_ptr<ModelHooks>& hooks_ptr() const { return hooks_; }
  void train(bool on = true) { module_->train(on); }
  void eval() { module_->eval(); }

 private:
  void check() const {
    if (!module_ || !hooks_) throw std::logic_error("booster: ModelWrapper used before Booster::boost()");
  }
  std::shared_ptr<M> module_;
  std::shared_ptr<ModelHooks> hooks_;
};

}  // namespace booster
