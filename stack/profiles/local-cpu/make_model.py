"""Build the local CPU stack's model directory: the tiny DeepSeek-V2-architecture MoE (config
from real vLLM runs, see tests/fixtures/README.md) with a byte-level BPE tokenizer trained
here, and seeded random weights (`model.safetensors`, the checkpoint layout vLLM loads).

Not vLLM's `--load-format dummy`: it fills every tensor from the same seed, so every MoE layer's
router holds the same weights and all layers route alike (every row of the Experts heatmap the
same). Here each tensor has a seed of its own, the same on every machine.

Run with the vLLM environment's Python (it has tokenizers and transformers):
    .vllm-venv/bin/python stack/profiles/local-cpu/make_model.py OUT_DIR
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).parent
CONFIG = HERE / "tiny-deepseek-v2-config.json"
SEED = 20261201
INIT_STD = 0.02  # the config's initializer_range, as a trained checkpoint's scale
# A small corpus of its own, so the tokenizer is the same on every machine.
CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Mixture of experts models route every token to a few experts out of many. ",
    "Prefill computes the prompt; decode generates one token at a time, using the KV cache. ",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i))\n",
    '{"tool": "search", "arguments": {"query": "expert parallelism load balance"}}',
    "0123456789 ,.;:!?()[]{}<>/\\|@#$%^&*-_=+'\"`~ \t\n",
]


def weights(config: dict) -> dict:
    """Every tensor the model has, named as in a DeepSeek-V2 checkpoint (experts one by one, as
    vLLM's loader reads them), drawn from a seed of its own; norms 1 as at initialisation."""
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    with torch.device("meta"):
        shapes = {n: t.shape for n, t in DeepseekV2ForCausalLM(DeepseekV2Config(**config)).state_dict().items()}
    inter = config["moe_intermediate_size"]
    out = {}
    for i, (name, shape) in enumerate(sorted(shapes.items())):
        if "norm" in name:
            out[name] = torch.ones(shape, dtype=torch.bfloat16)
            continue
        g = torch.Generator().manual_seed(SEED + i)
        t = torch.empty(shape).normal_(0.0, INIT_STD, generator=g).to(torch.bfloat16)
        prefix, _, fused = name.rpartition(".experts.")
        if not prefix:
            out[name] = t
        elif fused == "gate_up_proj":  # (experts, 2 * inter, hidden): gate rows, then up rows
            for e in range(shape[0]):
                out[f"{prefix}.experts.{e}.gate_proj.weight"] = t[e, :inter].clone()
                out[f"{prefix}.experts.{e}.up_proj.weight"] = t[e, inter:].clone()
        elif fused == "down_proj":  # (experts, hidden, inter)
            for e in range(shape[0]):
                out[f"{prefix}.experts.{e}.down_proj.weight"] = t[e].clone()
        else:
            raise ValueError(f"unexpected expert tensor {name}")
    return out


def build(out: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    config = json.loads(CONFIG.read_text())
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config["vocab_size"],
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 50, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    # The corpus gives a few hundred tokens; the model samples from all vocab_size ids. Every id must
    # decode to text, or streams carry empty chunks and no inter-token gap can be measured. The
    # fillers are the load generator's words (w0, w1, ...), so its prompts are about a token a word.
    fast.add_tokens([f"w{i}" for i in range(config["vocab_size"] - len(fast))])
    assert len(fast) == config["vocab_size"], (len(fast), config["vocab_size"])
    fast.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant: {% endif %}"
    )
    fast.save_pretrained(out)
    shutil.copy(CONFIG, out / "config.json")
    from safetensors.torch import save_file

    save_file(weights(config), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_model.py OUT_DIR")
    print(build(Path(sys.argv[1])))
