"""Make the tiny Hugging Face checkpoints that tests/models/test_hf_import.py reads.

Run ONCE, where torch and transformers are installed (never the project's environment;
neither is in requirements.txt):

    python -m venv /tmp/hfenv
    /tmp/hfenv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu
    /tmp/hfenv/bin/pip install transformers safetensors numpy
    /tmp/hfenv/bin/python scripts/make_hf_fixtures.py [--out=tests/fixtures/hf]

For each family (Llama with llama3 RoPE scaling and grouped-query attention, untied
head; Mistral with a sliding window shorter than the input and a tied head; Qwen2 with
q/k/v biases; GPT-2) it builds a model from transformers' own config class with random
weights (every parameter drawn, biases and norm gains included, so that none sits at
its trivial init), saves it with save_pretrained (config.json + model.safetensors,
float32) and writes the float32 logits of transformers' forward pass on a fixed input:

    OUT/<name>/config.json, model.safetensors, input_ids.npy (2, 16) int32,
    logits.npy (2, 16, vocab) float32
    OUT/MANIFEST.json: the versions of torch and transformers that made them
"""
from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np
import torch
import transformers

SEQ = 16
VOCAB = 96


def configs() -> dict:
    t = transformers
    common = dict(vocab_size=VOCAB, max_position_embeddings=64, attn_implementation="eager")
    return {
        # Grouped-query attention (2 query heads share 1 kv head), head_dim 16 so that one
        # RoPE frequency falls in llama3's smoothed band, another above, two below.
        "llama": t.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
            **common),
        # A window of 8 over a 16-token input: the sliding window is exercised.
        "mistral": t.MistralConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=8,
            tie_word_embeddings=True, **common),
        # Qwen2: q, k, v biases, rope_theta 1e6, tied head.
        "qwen2": t.Qwen2Config(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rope_theta=1_000_000.0,
            tie_word_embeddings=True, **common),
        "gpt2": t.GPT2Config(
            vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
            attn_implementation="eager"),
    }


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Every parameter drawn: matrices N(0, 0.15^2), norm gains 1 + N(0, 0.1^2), biases
    N(0, 0.1^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if p.ndim >= 2:
                p.copy_(0.15 * noise)
            elif name.endswith("weight"):  # a norm's gain
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.1 * noise)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="tests/fixtures/hf")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    ids = np.random.default_rng(0).integers(0, VOCAB, size=(2, SEQ)).astype(np.int32)
    for i, (name, cfg) in enumerate(configs().items()):
        torch.manual_seed(i)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        randomize(model, seed=100 + i)
        model.eval()
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(folder, safe_serialization=True)
        (folder / "generation_config.json").unlink(missing_ok=True)
        with torch.no_grad():
            logits = model(torch.from_numpy(ids.astype(np.int64))).logits
        np.save(folder / "input_ids.npy", ids)
        np.save(folder / "logits.npy", logits.float().numpy())
        size = sum(f.stat().st_size for f in folder.iterdir())
        print(f"{name}: {size / 1024:.0f} KB, logits |max| {logits.abs().max():.3f}")
    (out / "MANIFEST.json").write_text(json.dumps(
        {"made_by": "scripts/make_hf_fixtures.py", "torch": torch.__version__,
         "transformers": transformers.__version__, "input": "input_ids.npy (2, 16)",
         "logits": "float32, transformers' eager attention"}, indent=2) + "\n")


if __name__ == "__main__":
    main()
