// parallelize.cpp — a tensor-parallel plan applied to named sub-modules (see booster/parallel/parallelize.h).
#include "booster/parallel/parallelize.h"

#include <fnmatch.h>

#include <algorithm>
#include <map>
#include <stdexcept>

namespace booster::parallel {

namespace {

// fnmatch with '.' as the path separator: '*' stays within one component.
bool matches(const std::string& pattern, const std::string& path) {
  std::string p = pattern, s = path;
  std::replace(p.begin(), p.end(), '.', '/');
  std::replace(s.begin(), s.end(), '.', '/');
  return fnmatch(p.c_str(), s.c_str(), FNM_PATHNAME) == 0;
}

const char* style_name(ParallelStyle::Kind k) {
  switch (k) {
    case ParallelStyle::Kind::kColwise: return "colwise (booster::nn::ColumnParallelLinear)";
    case ParallelStyle::Kind::kRowwise: return "rowwise (booster::nn::RowParallelLinear)";
    case ParallelStyle::Kind::kVocab: return "vocab_parallel (booster::nn::VocabParallelEmbedding)";
  }
  return "?";
}

}  // namespace

std::vector<std::string> parallelize(torch::nn::Module& model, const nn::TensorParallelContext& context,
                                     const ParallelizePlan& plan) {
  // Validate everything first: nothing changes when any entry is wrong.
  struct Target {
    std::string path;
    std::shared_ptr<torch::nn::Module> module;
    ParallelStyle style;
  };
  std::vector<Target> targets;
  std::map<std::string, std::string> matched_by;  // path -> pattern
  const auto modules = model.named_modules("", /*include_self=*/false);
  for (const auto& [pattern, style] : plan) {
    bool any = false;
    for (const auto& item : modules) {
      if (!matches(pattern, item.key())) continue;
      any = true;
      auto [it, fresh] = matched_by.emplace(item.key(), pattern);
      if (!fresh)
        throw std::invalid_argument("parallelize: module '" + item.key() + "' is matched by both '" + it->second +
                                    "' and '" + pattern + "'; make the patterns disjoint");
      torch::nn::Module* m = item.value().get();
      const bool fits = (style.kind == ParallelStyle::Kind::kColwise && dynamic_cast<nn::ColumnParallelLinearImpl*>(m)) ||
                        (style.kind == ParallelStyle::Kind::kRowwise && dynamic_cast<nn::RowParallelLinearImpl*>(m)) ||
                        (style.kind == ParallelStyle::Kind::kVocab && dynamic_cast<nn::VocabParallelEmbeddingImpl*>(m));
      if (!fits)
        throw std::invalid_argument("parallelize: module '" + item.key() + "' (" + m->name() + ", matched by '" +
                                    pattern + "') cannot be " + style_name(style.kind) +
                                    "; build that sub-module as the booster::nn layer the style names");
      targets.push_back({item.key(), item.value(), style});
    }
    if (!any)
      throw std::invalid_argument("parallelize: the pattern '" + pattern + "' matches no sub-module of " + model.name() +
                                  " (paths are dotted, as named_modules() gives them; '*' matches one component)");
  }
  // Sizes and state: checked for every target before any is sharded.
  const int t = context.size();
  for (const Target& x : targets) {
    auto* c0 = dynamic_cast<nn::ColumnParallelLinearImpl*>(x.module.get());
    auto* r0 = dynamic_cast<nn::RowParallelLinearImpl*>(x.module.get());
    auto* v0 = dynamic_cast<nn::VocabParallelEmbeddingImpl*>(x.module.get());
    if ((c0 && c0->group) || (r0 && r0->group) || (v0 && v0->group))
      throw std::logic_error("parallelize: '" + x.path + "' is already sharded over a tp group; the plan takes dense "
                             "layers (built with the default context)");
    if (auto* c = dynamic_cast<nn::ColumnParallelLinearImpl*>(x.module.get()); c && c->options.out_features() % t != 0)
      throw std::invalid_argument("parallelize: '" + x.path + "': out_features = " +
                                  std::to_string(c->options.out_features()) + " is not divisible by the tp size " +
                                  std::to_string(t));
    if (auto* r = dynamic_cast<nn::RowParallelLinearImpl*>(x.module.get()); r && r->options.in_features() % t != 0)
      throw std::invalid_argument("parallelize: '" + x.path + "': in_features = " + std::to_string(r->options.in_features()) +
                                  " is not divisible by the tp size " + std::to_string(t));
  }
  std::sort(targets.begin(), targets.end(), [&](const Target& a, const Target& b) {
    auto index = [&](const std::string& p) {
      for (size_t i = 0; i < modules.size(); ++i)
        if (modules[i].key() == p) return i;
      return modules.size();
    };
    return index(a.path) < index(b.path);
  });
  std::vector<std::string> done;
  for (const Target& x : targets) {
    if (auto* c = dynamic_cast<nn::ColumnParallelLinearImpl*>(x.module.get())) {
      c->options.gather_output(x.style.gather_output);
      c->parallelize(context);
    } else if (auto* r = dynamic_cast<nn::RowParallelLinearImpl*>(x.module.get())) {
      r->options.input_is_parallel(x.style.input_is_parallel);
      r->parallelize(context);
    } else if (auto* v = dynamic_cast<nn::VocabParallelEmbeddingImpl*>(x.module.get())) {
      v->parallelize(context);
    }
    done.push_back(x.path);
  }
  return done;
}

}  // namespace booster::parallel
