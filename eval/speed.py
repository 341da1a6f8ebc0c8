"""Throughput of one model configuration: training tokens/s and decode tokens/s by length.

Used by `eval.compare` for the `speed` task. Timings exclude compilation (each function
is compiled ahead of time with `.lower().compile()`), run one warm-up call, and stop the
clock only after `block_until_ready`. A measurement that fails (out of memory, say)
records its error instead of a number, so one bad length does not lose the others.
"""
from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from eval import generate as gen


def build_model(model_cfg: Mapping[str, Any], seed: int = 0):
    from models.config import ModelConfig
    from models.lm import LanguageModel

    return LanguageModel(ModelConfig.from_dict(dict(model_cfg)), rngs=nnx.Rngs(seed))


def count_params(model: nnx.Module) -> int:
    return int(sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))))


def train_step_time(model: nnx.Module, batch: int, seq_len: int, steps: int = 5,
                    lr: float = 1e-3) -> dict[str, float]:
    """Seconds per AdamW step (cross-entropy, forward + backward + update) on random tokens."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    params = jax.tree_util.tree_map(jnp.copy, params)  # donated below: keep the model's own arrays
    vocab = model_vocab(model)
    opt = optax.adamw(lr)
    opt_state = opt.init(params)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, vocab, (batch, seq_len + 1)), jnp.int32)

    def loss_fn(params, rest, tokens):
        m = nnx.merge(graphdef, params, rest)
        logits = m(tokens[:, :-1], deterministic=True).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    def step(params, opt_state, rest, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, rest, tokens)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, opt_state, rest, tokens).compile()
    params, opt_state, loss = jax.block_until_ready(compiled(params, opt_state, rest, tokens))
    t0 = time.perf_counter()
    for _ in range(steps):
        params, opt_state, loss = compiled(params, opt_state, rest, tokens)
    jax.block_until_ready(loss)
    step_s = (time.perf_counter() - t0) / steps
    return {"step_s": step_s, "tokens_per_s": batch * seq_len / step_s, "loss": float(loss)}


def model_vocab(model: nnx.Module) -> int:
    cfg = getattr(model, "cfg", None) or getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "vocab_size"):
        raise AttributeError("the model exposes no cfg.vocab_size")
    return int(cfg.vocab_size)


def decode_time(model: nnx.Module, batch: int, context: int, new_tokens: int) -> dict[str, float]:
    """Decode tokens/s after prefilling `context` random tokens, and the cache's bytes."""
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, model_vocab(model), (batch, context)).astype(np.int32)
    out = gen.generate(model, prompt, new_tokens, temperature=0.0)
    return {"tokens_per_s": out["tokens_per_s"], "step_s": out["decode_s"] / new_tokens,
            "prefill_s": out["prefill_s"], "state_bytes": out["state_bytes"]}


def measure(model_cfg: Mapping[str, Any], *, train_lengths: Sequence[int] = (),
            train_batch: int = 8, train_steps: int = 5, decode_contexts: Sequence[int] = (),
            decode_batch: int = 1, decode_tokens: int = 32, deadline: float | None = None,
            log=print) -> dict[str, Any]:
    """Train and decode throughput of one model; `{train: {T: ...}, decode: {ctx: ...}}`.

    Lengths past `deadline` (a time.time() value) are skipped and marked so.
    """
    model = build_model(model_cfg)
    out: dict[str, Any] = {"params": count_params(model), "state_size": int(model.state_size()),
                           "train": {}, "decode": {}}
    # decode first: the decode-state comparison is the headline of the speed task
    jobs = [("decode", c) for c in decode_contexts] + [("train", t) for t in train_lengths]
    for kind, n in jobs:
        if deadline is not None and time.time() > deadline:
            out[kind][str(n)] = {"error": "skipped: sweep time budget spent"}
            continue
        try:
            if kind == "train":
                cell = train_step_time(model, train_batch, n, train_steps)
            else:
                cell = decode_time(model, decode_batch, n, decode_tokens)
        except Exception as e:  # noqa: BLE001 (an OOM at one length must not lose the rest)
            cell = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
        out[kind][str(n)] = cell
        log(f"  {kind} T={n}: {cell}")
    return out
