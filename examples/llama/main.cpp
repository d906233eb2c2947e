// Llama with Booster: a Llama-3-style byte-level decoder (model.h; transformers' LlamaForCausalLM)
// trained on the King James Bible (examples/gpt/data.h: whole books held out for validation) with
// the plugin named in the TOML config.
//   build/bin/booster run --nproc_per_node 2 build/bin/llama --config examples/configs/llama_ddp.toml
// Also runs standalone (1 rank) or with explicit --rank/--world_size/--host/--port flags.
//
// The trainer (options, loop, evaluation, metrics.csv, sampling, --init_from / --score / --sample)
// is examples/common/lm_trainer.h's, the same as examples/gpt's; this file gives it the model: its
// [train] keys, its HuggingFace config (hf_config.h) and the "llama" state-dict adapter, so
// [train] save_model = true writes a directory LlamaForCausalLM.from_pretrained loads, and
// --init_from DIR loads one (transformers' save_pretrained of a Llama with vocab_size >= 256, or ours).
#include "common/lm_trainer.h"
#include "hf_config.h"
#include "model.h"

namespace {

llama::LlamaConfig read_config(const booster::Options& t) {
  llama::LlamaConfig c;
  c.n_layer = t.get_int("n_layer", 4, 1, 64);
  c.n_head = t.get_int("n_head", 4, 1, 64);
  c.n_kv_head = t.get_int("n_kv_head", 2, 1, 64);  // grouped-query attention: key/value heads
  c.n_embd = t.get_int("n_embd", 256, 8, 8192);
  c.n_ctx = t.get_int("n_ctx", 256, 2, 8192);  // context length = training window
  c.intermediate_size = t.get_int("intermediate_size", 0, 0, 1 << 20);  // 0: 8 n_embd / 3 rounded up to 32
  c.rms_norm_eps = t.get_double("rms_norm_eps", 1e-5, 1e-12, 1.0);
  c.rope_theta = t.get_double("rope_theta", 500000.0, 1.0);
  llama::validate(c);
  return c;
}

examples::lm::ModelSpec<llama::LlamaConfig> spec() {
  examples::lm::ModelSpec<llama::LlamaConfig> s;
  s.name = "llama";
  s.adapter = "llama";
  s.lora_targets = "q_proj,v_proj";  // PEFT's default for llama
  s.description = "Llama-3-style byte-level LM on the King James Bible, trained with Booster";
  s.default_config = "examples/configs/llama_ddp.toml";
  s.default_output_dir = "runs/llama";
  s.read_config = read_config;
  s.from_hf = [](const nlohmann::json& hf, const llama::LlamaConfig&) { return llama::from_hf_config(hf); };
  s.to_hf = llama::to_hf_config;
  s.describe = llama::describe;
  s.loss = examples::lm::lm_loss;
  s.vocab_size = [](const llama::LlamaConfig& c) { return c.vocab_size; };
  s.n_ctx = [](const llama::LlamaConfig& c) { return c.n_ctx; };
  return s;
}

}  // namespace

int main(int argc, char** argv) { return examples::lm::run_lm<llama::LlamaImpl>(argc, argv, spec()); }
