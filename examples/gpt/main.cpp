// GPT with Booster: GPT-2 (model.h; transformers' GPT2LMHeadModel, byte-level) trained on the King
// James Bible (data.h: whole books held out for validation) with the plugin named in the TOML config.
//   build/bin/booster run --nproc_per_node 2 build/bin/gpt --config examples/configs/gpt_ddp.toml
// (scripts/run_gpt.sh builds and runs exactly that). Also runs standalone (1 rank) or with explicit
// --rank/--world_size/--host/--port flags.
//
// The trainer (options, loop, evaluation, metrics.csv, sampling, --init_from / --score / --sample)
// is examples/common/lm_trainer.h's; this file gives it the model: its [train] keys, its
// HuggingFace config (hf_config.h) and the "gpt2" state-dict adapter, so [train] save_model = true
// writes a directory GPT2LMHeadModel.from_pretrained loads, and --init_from DIR loads one
// (transformers' save_pretrained of a GPT-2 with vocab_size >= 256, or ours).
//   build/bin/gpt --init_from runs/gpt_ddp/model --score "And God said, Let there be light"
//   prints one line "bits per byte: X" (X with 9 decimals)
#include "common/lm_trainer.h"
#include "hf_config.h"
#include "model.h"

namespace {

gpt::GPTConfig read_config(const booster::Options& t) {
  gpt::GPTConfig c;
  c.n_layer = t.get_int("n_layer", 4, 1, 64);
  c.n_head = t.get_int("n_head", 4, 1, 64);
  c.n_embd = t.get_int("n_embd", 256, 8, 8192);
  c.n_ctx = t.get_int("n_ctx", 256, 2, 8192);  // context length = training window
  c.dropout = t.get_double("dropout", 0.0, 0.0, 0.9);
  // "tanh": GPT-2's own GELU (transformers' "gelu_new"); "exact": erf GELU ("gelu"), faster on CPU in bf16.
  c.gelu_tanh = t.get_choice("gelu", "tanh", {"exact", "tanh"}) == "tanh";
  return c;
}

examples::lm::ModelSpec<gpt::GPTConfig> spec() {
  examples::lm::ModelSpec<gpt::GPTConfig> s;
  s.name = "gpt";
  s.adapter = "gpt2";
  s.lora_targets = "c_attn";  // PEFT's default for gpt2
  s.description = "GPT-2 byte-level LM on the King James Bible, trained with Booster";
  s.default_config = "examples/configs/gpt_ddp.toml";
  s.default_output_dir = "runs/gpt";
  s.read_config = read_config;
  s.from_hf = [](const nlohmann::json& hf, const gpt::GPTConfig& train) {
    gpt::GPTConfig c = gpt::from_hf_config(hf);
    c.dropout = train.dropout;  // a training choice: [train]'s
    return c;
  };
  s.to_hf = gpt::to_hf_config;
  s.describe = gpt::describe;
  s.loss = examples::lm::lm_loss;
  s.vocab_size = [](const gpt::GPTConfig& c) { return c.vocab_size; };
  s.n_ctx = [](const gpt::GPTConfig& c) { return c.n_ctx; };
  return s;
}

}  // namespace

int main(int argc, char** argv) { return examples::lm::run_lm<gpt::GPTImpl>(argc, argv, spec()); }
