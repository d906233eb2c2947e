// activation_estimate.cpp — the transformer activation formula (booster/core/activation_estimate.h).
#include "booster/core/activation_estimate.h"

#include <stdexcept>

namespace booster {

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("booster: transformer_activation_bytes: " + what);
}

}  // namespace

int64_t transformer_activation_bytes(const TransformerShape& shape, const ActivationOptions& o) {
  require(shape.layers >= 1, "layers must be >= 1, got " + std::to_string(shape.layers));
  require(shape.hidden >= 1, "hidden must be >= 1, got " + std::to_string(shape.hidden));
  require(shape.heads >= 1, "heads must be >= 1, got " + std::to_string(shape.heads));
  require(shape.seq_length >= 1, "seq_length must be >= 1, got " + std::to_string(shape.seq_length));
  require(shape.micro_batch >= 1, "micro_batch must be >= 1, got " + std::to_string(shape.micro_batch));
  require(shape.vocab >= 0, "vocab must be >= 0, got " + std::to_string(shape.vocab));
  require(o.precision == "fp32" || o.precision == "bf16" || o.precision == "fp16",
          "precision must be \"fp32\", \"bf16\" or \"fp16\", got \"" + o.precision + "\"");
  require(o.checkpointing == "none" || o.checkpointing == "full" || o.checkpointing == "selective",
          "checkpointing must be \"none\", \"full\" or \"selective\", got \"" + o.checkpointing + "\"");
  require(o.selective_every >= 1, "selective_every must be >= 1, got " + std::to_string(o.selective_every));
  require(o.tp >= 1, "tp must be >= 1, got " + std::to_string(o.tp));
  require(o.sp >= 1, "sp must be >= 1, got " + std::to_string(o.sp));
  const std::string& mode = o.sequence_parallelism;
  require(mode.empty() || mode == "split_gather" || mode == "all_to_all",
          "sequence_parallelism must be \"\", \"split_gather\" or \"all_to_all\", got \"" + mode + "\"");
  require(mode != "split_gather" || o.tp > 1, "sequence_parallelism \"split_gather\" shards over the tp group: it needs tp > 1");
  require(o.sp == 1 || mode == "all_to_all", "sp > 1 is the \"all_to_all\" degree: set sequence_parallelism = \"all_to_all\"");
  const int64_t shards = mode == "split_gather" ? o.tp : mode == "all_to_all" ? o.sp : 1;
  require(shape.seq_length % shards == 0, "seq_length " + std::to_string(shape.seq_length) +
                                              " is not divisible by the sequence-parallel degree " + std::to_string(shards));

  const double s = static_cast<double>(shape.seq_length), b = static_cast<double>(shape.micro_batch);
  const double h = static_cast<double>(shape.hidden), a = static_cast<double>(shape.heads);
  const double e = o.precision == "fp32" ? 4.0 : 2.0;
  const double t = static_cast<double>(o.tp);
  const double sbh = s * b * h;
  const double scores = (2 * e + 1) * a * s * s * b;      // softmax output, mask, dropout output
  const double linear = (5 * e + 1 + 9 * e + 1 + 2 * e);  // per sbh: attention + MLP + LayerNorms (e = 2: 34)
  double layer = 0;   // one layer's full activations on this rank
  double input = e * sbh;  // a checkpointed layer's input
  if (mode == "split_gather") {
    layer = (linear * sbh + scores) / t;
    input /= t;
  } else if (o.tp > 1) {
    // Replicated: the LayerNorm inputs (2e), the attention and MLP inputs (2e), their dropout masks
    // (2) and the block output (e·... counted in the paper's 10 at e = 2): 10·(e/2)·sbh; the rest split.
    const double replicated = 10.0 * (e / 2.0);
    layer = replicated * sbh + (linear - replicated) * sbh / t + scores / t;
  } else {
    layer = linear * sbh + scores;
  }
  if (mode == "all_to_all") {
    layer /= static_cast<double>(o.sp);
    input /= static_cast<double>(o.sp);
  }
  const int64_t L = shape.layers;
  int64_t checkpointed = 0;
  if (o.checkpointing == "full") checkpointed = L;
  if (o.checkpointing == "selective") checkpointed = (L + o.selective_every - 1) / o.selective_every;
  double total = static_cast<double>(L - checkpointed) * layer + static_cast<double>(checkpointed) * input;
  if (checkpointed > 0) total += layer;  // the layer being recomputed in backward
  if (shape.vocab > 0) {
    const double logits = s * b * static_cast<double>(shape.vocab) * (e + 4.0) / t / static_cast<double>(o.sp);
    total += logits;
  }
  return static_cast<int64_t>(total);
}

}  // namespace booster
