#!/usr/bin/env python3
"""transformers' side of the HuggingFace interop tests (tests/hf/hf_interop_test.cpp), run with the
venv's python3 (torch 2.11, transformers pinned by scripts/install_deps.sh).

  make <gpt2|llama> <dir> [--sharded] [--seed N]
      A tiny random GPT2LMHeadModel / LlamaForCausalLM (vocabulary 256, every parameter, LayerNorm
      and RMSNorm weights included, drawn at random so no tensor is at its default), saved with
      save_pretrained as safetensors: one model.safetensors, or with --sharded shards of at most
      20 kB + model.safetensors.index.json.

  logits <dir> <text> <out.safetensors>
      Loads <dir> with from_pretrained (output_loading_info), runs the model in float32 on the bytes
      of <text> (one sequence, labels = input_ids) and saves {"logits": [T, V] float32} to
      <out.safetensors>. Prints one JSON line: {"loss", "bits_per_byte" (loss / ln 2), "missing",
      "unexpected", "mismatched", "architecture"}.
"""
import json
import math
import sys

import torch
from safetensors.torch import save_file


def tiny_config(arch):
    if arch == "gpt2":
        from transformers import GPT2Config
        return GPT2Config(vocab_size=256, n_positions=128, n_embd=32, n_layer=2, n_head=4,
                          bos_token_id=None, eos_token_id=None)
    if arch == "llama":
        from transformers import LlamaConfig
        return LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                           rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                           tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)
    raise SystemExit(f"unknown architecture {arch}")


def make(arch, out, sharded, seed):
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "weight" in name:  # norm weights around 1
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    kwargs = {"max_shard_size": "20KB"} if sharded else {}
    model.save_pretrained(out, safe_serialization=True, **kwargs)
    print(json.dumps({"architecture": type(model).__name__,
                      "parameters": sum(p.numel() for p in model.parameters())}))


def logits(path, text, out):
    from transformers import AutoModelForCausalLM
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, dtype=torch.float32)
    model.eval()
    ids = torch.tensor([list(text.encode("utf-8"))], dtype=torch.long)
    with torch.no_grad():
        result = model(input_ids=ids, labels=ids)
    save_file({"logits": result.logits[0].float().contiguous()}, out)
    loss = result.loss.item()
    print(json.dumps({"loss": loss, "bits_per_byte": loss / math.log(2.0),
                      "missing": sorted(info.get("missing_keys", [])),
                      "unexpected": sorted(info.get("unexpected_keys", [])),
                      "mismatched": [str(m) for m in info.get("mismatched_keys", [])],
                      "architecture": type(model).__name__}))


def main(argv):
    if len(argv) >= 3 and argv[0] == "make":
        seed = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 0
        make(argv[1], argv[2], "--sharded" in argv, seed)
    elif len(argv) == 4 and argv[0] == "logits":
        logits(argv[1], argv[2], argv[3])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
