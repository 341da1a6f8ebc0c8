"""Sample text from a trained run with the decode caches.

    python -m eval.generate --workdir=DIR --prompt=TEXT --max_new_tokens=N \
        [--temperature=0.8 --top_k=0 --seed=0]

The prompt is run once through `model.prefill` (the chunkwise / full-sequence form),
then `model.decode_step` runs one token at a time inside a single jitted `lax.scan`.
Prints the text, the decode speed (tokens per second, compile time excluded) and the
bytes of decode state (sum of the cache arrays' nbytes: constant in the generated length
for linear mixers, growing with it for softmax's KV cache). Temperature 0 is greedy.
"""
from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from eval import common


def cache_nbytes(cache: Any) -> int:
    """Bytes held by a decode cache: the sum of its arrays' nbytes."""
    return int(sum(np.dtype(x.dtype).itemsize * int(np.prod(x.shape))
                   for x in jax.tree_util.tree_leaves(cache) if hasattr(x, "shape")))


def sample_logits(logits: jax.Array, key: jax.Array, temperature: float,
                  top_k: int) -> jax.Array:
    """Next tokens (B,) from logits (B,V): argmax at temperature 0, else top-k softmax
    sampling."""
    if temperature <= 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits.astype(jnp.float32) / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def _last_logits(logits: jax.Array) -> jax.Array:
    return logits[:, -1] if logits.ndim == 3 else logits


def generate(model: nnx.Module, prompt: np.ndarray, max_new_tokens: int, *,
             temperature: float = 0.0, top_k: int = 0, seed: int = 0) -> dict[str, Any]:
    """Continues `prompt` (B, P) int tokens by `max_new_tokens`; returns tokens and timings.

    Returns `tokens` (B, max_new_tokens) NumPy, `prefill_s`, `decode_s`, `tokens_per_s`
    (new tokens of the whole batch per decode second) and `state_bytes` (the cache).
    """
    prompt = np.asarray(prompt, np.int32)
    if prompt.ndim != 2 or prompt.shape[1] == 0:
        raise ValueError("the prompt must be a non-empty (batch, length) array of tokens: "
                         "pass a non-empty --prompt")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    batch, plen = prompt.shape
    graphdef, state = nnx.split(model)
    cache = model.init_cache(batch, plen + max_new_tokens)
    state_bytes = cache_nbytes(cache)

    def prefill(state, tokens, cache):
        m = nnx.merge(graphdef, state)
        logits, cache = m.prefill(tokens, cache)
        return _last_logits(logits).astype(jnp.float32), cache

    def decode(state, logits, cache, key):
        m = nnx.merge(graphdef, state)

        def body(carry, k):
            logits, cache = carry
            tok = sample_logits(logits, k, temperature, top_k)
            logits, cache = m.decode_step(tok, cache)
            return (logits.astype(jnp.float32), cache), tok

        keys = jax.random.split(key, max_new_tokens)
        (_, cache), toks = jax.lax.scan(body, (logits, cache), keys)
        return toks.T, cache

    tokens = jnp.asarray(prompt)
    # The cache is donated: a softmax KV cache can be tens of GB, and it must not be
    # copied between the prefill and the decode loop.
    prefill_c = jax.jit(prefill, donate_argnums=(2,)).lower(state, tokens, cache).compile()
    t0 = time.perf_counter()
    logits, cache = jax.block_until_ready(prefill_c(state, tokens, cache))
    prefill_s = time.perf_counter() - t0

    key = jax.random.PRNGKey(seed)
    decode_c = jax.jit(decode, donate_argnums=(2,)).lower(state, logits, cache,
                                                          key).compile()
    t0 = time.perf_counter()
    toks, cache = jax.block_until_ready(decode_c(state, logits, cache, key))
    decode_s = time.perf_counter() - t0
    return {
        "tokens": np.asarray(toks),
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "tokens_per_s": batch * max_new_tokens / decode_s,
        "state_bytes": state_bytes,
        "final_state_bytes": cache_nbytes(cache),
    }


def run(workdir: str, prompt: str, max_new_tokens: int, temperature: float = 0.8,
        top_k: int = 0, seed: int = 0, step: int | str | None = None) -> dict[str, Any]:
    # The run's saved tokenizer: no corpus is read to sample.
    model, config, dataset, step = common.load_run(workdir, step, data=False)
    ids = dataset.tokenizer.encode(prompt)
    if not ids:
        raise ValueError("--prompt encodes to no tokens: pass a non-empty --prompt")
    out = generate(model, np.asarray([ids], np.int32), max_new_tokens,
                   temperature=temperature, top_k=top_k, seed=seed)
    text = dataset.tokenizer.decode([int(t) for t in out["tokens"][0]])
    return {"text": text, "prompt": prompt, "new_tokens": max_new_tokens,
            "tokens_per_s": out["tokens_per_s"], "prefill_s": out["prefill_s"],
            "decode_s": out["decode_s"], "state_bytes": out["state_bytes"],
            "step": int(step),
            "mixers": (sorted(set(model.layer_mixers())) if hasattr(model, "layer_mixers")
                       else None)}


@common.user_errors
def main(argv):
    del argv
    from absl import flags
    f = flags.FLAGS
    r = run(f.workdir, f.prompt, f.max_new_tokens, f.temperature, f.top_k, f.seed,
            step=f.step)
    print(r["prompt"] + r["text"])
    print(f"\n[{r['new_tokens']} tokens, {r['tokens_per_s']:.1f} tokens/s decode, "
          f"prefill {r['prefill_s'] * 1e3:.1f} ms, decode state {r['state_bytes']:,} "
          f"bytes]")
    common.print_json({k: v for k, v in r.items() if k != "text"})


if __name__ == "__main__":
    from absl import app, flags

    flags.DEFINE_string("workdir", None, "Run directory written by train.py.",
                        required=True)
    flags.DEFINE_string("prompt", None, "Text to continue.", required=True)
    flags.DEFINE_integer("max_new_tokens", 200, "Tokens to generate.")
    flags.DEFINE_float("temperature", 0.8, "Softmax temperature; 0 is greedy (argmax).")
    flags.DEFINE_integer("top_k", 0,
                         "Sample from the k most likely tokens only; 0 keeps all.")
    flags.DEFINE_integer("seed", 0, "Random seed of the sampler.")
    flags.DEFINE_string("step", "latest", common.STEP_HELP)
    app.run(main)
