#!/usr/bin/env python3
"""peft's side of the LoRA interop tests (tests/hf/peft_interop_test.cpp), run with the venv's python3
(torch 2.11, transformers and peft pinned by scripts/install_deps.sh). The base models are
hf_reference.py's tiny random ones.

  logits <base_dir> <adapter_dir> <text> <out.safetensors>
      Loads the base model <base_dir> (from_pretrained, float32), then PeftModel.from_pretrained(base,
      <adapter_dir>), and saves {"logits": [T, V] float32} of the bytes of <text> to <out.safetensors>.
      Prints one JSON line: {"lora_modules": number of LoRA layers, "missing": adapter keys peft did
      not find in the file, "unexpected": keys of the file peft did not use}.

  make <base_dir> <adapter_dir> <r> <alpha> <target,target,...> <text> <out.safetensors> [--seed N]
      get_peft_model(base, LoraConfig(r, lora_alpha, target_modules, init_lora_weights=False)) (B
      non-zero), save_pretrained(<adapter_dir>), and the logits of that PeftModel as above.
"""
import json
import sys

import torch
from safetensors.torch import save_file


def _logits(model, text, out):
    model.eval()
    ids = torch.tensor([list(text.encode("utf-8"))], dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float().contiguous()
    save_file({"logits": logits}, out)


def _count_lora(model):
    return sum(1 for name, _ in model.named_modules() if name.endswith(".lora_A.default"))


def logits(base_dir, adapter_dir, text, out):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter_dir)
    # peft warns about (and keeps at init) keys it did not find; check them here.
    from peft.utils import load_peft_weights
    file_keys = set(load_peft_weights(adapter_dir).keys())
    want = set()
    for name, _ in model.named_parameters():
        if ".lora_" in name:
            want.add(name.replace(".default", ""))
    _logits(model, text, out)
    print(json.dumps({"lora_modules": _count_lora(model), "missing": sorted(want - file_keys),
                      "unexpected": sorted(file_keys - want)}))


def make(base_dir, adapter_dir, r, alpha, targets, text, out, seed):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none",
                        task_type="CAUSAL_LM", init_lora_weights=False)
    model = get_peft_model(base, config)
    model.save_pretrained(adapter_dir)
    _logits(model, text, out)
    print(json.dumps({"lora_modules": _count_lora(model)}))


def main(argv):
    if len(argv) == 5 and argv[0] == "logits":
        logits(argv[1], argv[2], argv[3], argv[4])
    elif len(argv) >= 8 and argv[0] == "make":
        seed = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 0
        make(argv[1], argv[2], int(argv[3]), float(argv[4]), argv[5].split(","), argv[6], argv[7], seed)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
