"""Check that transformers loads our exported softmax models and computes our logits.

Not a test (the suite needs neither torch nor transformers): run it by hand where a
separate environment has them (scripts/make_hf_fixtures.py says how to make one):

    python scripts/check_hf_export.py --python=/tmp/hfenv/bin/python [--out=/tmp/hf_export]

In this environment it exports, with models.hf.save, the imported fixtures
(tests/fixtures/hf/*) and models of our own (the repository's default softmax block;
llama3-scaled RoPE with grouped-query attention and an untied head; Qwen2-style q/k/v
biases; a GPT-2-style block), each with our float32 logits on a fixed input; then
`--python` runs this file again with --transformers, which loads every folder with
AutoModelForCausalLM.from_pretrained and compares: max |ours - theirs| / max |theirs|
per model, failing (exit 1) above 1e-4.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOLERANCE = 1e-4


def _our_models():
    """(name, ModelConfig) of models that exist only on our side."""
    from models import ModelConfig
    base = dict(vocab_size=80, d_model=32, num_layers=2, num_heads=4, d_ff=64,
                max_len=64, scan_layers=True)
    return [
        ("ours_default", ModelConfig(**base, tie_embeddings=True)),
        ("ours_llama3_gqa", ModelConfig(**{**base, "num_heads": 2}, num_kv_heads=1,
                                        head_dim=16, rope_scaling="llama3", rope_factor=8.0,
                                        rope_original_max_len=32)),
        ("ours_qwen2", ModelConfig(**base, qkv_bias=True, tie_embeddings=True,
                                   rope_theta=1e6)),
        ("ours_gpt2", ModelConfig(**base, norm="layernorm", norm_eps=1e-5,
                                  mlp_type="gelu_tanh", qkv_bias=True, o_bias=True,
                                  mlp_bias=True, positions="learned", num_positions=32,
                                  tie_embeddings=True)),
    ]


def export(out: pathlib.Path) -> list[str]:
    import jax
    from flax import nnx

    from models import LanguageModel, hf
    sys.path.insert(0, str(ROOT))
    rng = np.random.default_rng(0)
    models = []
    for folder in sorted((ROOT / "tests" / "fixtures" / "hf").iterdir()):
        if (folder / "config.json").is_file():
            models.append((f"fixture_{folder.name}", hf.load(folder)))
    for name, cfg in _our_models():
        model = LanguageModel(cfg, rngs=nnx.Rngs(1))
        # Random gains and biases too, so that none sits at its trivial init.
        flat = {k: v + rng.normal(0, 0.1, v.shape).astype(np.float32)
                for k, v in hf.unrolled_params(model).items()}
        models.append((name, hf.build(cfg, flat)))
    names = []
    for name, model in models:
        folder = out / name
        family = hf.save(model, folder)
        ids = rng.integers(0, model.cfg.vocab_size, size=(2, 16)).astype(np.int32)
        with jax.default_matmul_precision("highest"):
            logits = np.asarray(model(ids), np.float32)
        np.save(folder / "check_ids.npy", ids)
        np.save(folder / "check_logits.npy", logits)
        print(f"exported {name} as {family}")
        names.append(name)
    return names


def compare(out: pathlib.Path) -> int:
    import torch
    import transformers
    worst = 0.0
    rows = []
    for folder in sorted(p for p in out.iterdir() if (p / "check_logits.npy").is_file()):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager").eval()
        ids = np.load(folder / "check_ids.npy")
        ours = np.load(folder / "check_logits.npy")
        with torch.no_grad():
            theirs = model(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
        err = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
        worst = max(worst, err)
        rows.append({"model": folder.name, "class": type(model).__name__,
                     "max_rel_err": err})
        print(f"{folder.name:22s} {type(model).__name__:22s} max|ours-hf|/max|hf| = {err:.2e}")
    print(json.dumps({"transformers": transformers.__version__, "rows": rows}))
    return 0 if worst <= TOLERANCE else 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/hf_export")
    parser.add_argument("--python", help="a Python with torch and transformers")
    parser.add_argument("--transformers", action="store_true",
                        help="(internal) compare in the environment with transformers")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    if args.transformers:
        sys.exit(compare(out))
    if not args.python:
        sys.exit("error: pass --python=PATH, a Python with torch and transformers")
    out.mkdir(parents=True, exist_ok=True)
    export(out)
    sys.exit(subprocess.call([args.python, __file__, "--transformers", f"--out={out}"]))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
