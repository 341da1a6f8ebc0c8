"""Throughput of a training config: its train step's tokens/s and decode tokens/s by length.

Used by sweeps (the `speed` task). The training figure times the step train.py runs
(training.step.make_train_step: masked loss, the config's optimizer with its clipping
and weight-decay mask, sharded over the config's mesh, at the config's precision) on
batches of the config's data pipeline, segment ids included, so it measures what a
training run gets. Timings exclude compilation (each function is compiled ahead of time
with `.lower().compile()`), run one warm-up call, and stop the clock only after
`block_until_ready`. A measurement that fails (out of memory, say) records its error
instead of a number, so one bad length does not lose the others.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import jax
import numpy as np

from eval import generate as gen
from training import builders, config_tools, model_state, runtime
from training import sharding as shd
from training import step as step_fns


def at_shape(config, batch: int, seq_len: int):
    """A copy of the train.py config whose batches are (batch, seq_len)."""
    config = config.copy_and_resolve_references()
    config.data.seq_len = int(seq_len)
    config.train.batch_size = int(batch)
    return config


def jitted_train_step(config, dataset):
    """(the compiled steps (runtime.Steps: .train, .keys(s)), params,
    optimizer state, batch sharding) of a train.py config, set up by training.runtime as
    the training loop sets it up: the same mesh, shardings, optimizer, donation and train
    step (training.step.make_train_step)."""
    mesh = runtime.make_mesh(config)
    model_cfg = builders.build_model_config(config, dataset)
    model, layout = runtime.describe_model(config, model_cfg, mesh)
    params, opt_state, rest = runtime.init_fresh(model, layout)
    steps = runtime.compile_steps(model, rest, layout, config.train, mesh,
                                  step_fns.Rows.of(dataset))
    return steps, params, opt_state, layout.batch


def train_step_time(config, batch: int, seq_len: int, steps: int = 5) -> dict[str, float]:
    """Seconds per train.py step at (batch, seq_len) of a train.py config. The step of
    timed call s takes the pipeline's batch s and the keys of step s (dropout, random
    features), as step s of a training run does; call 0 is the warm-up."""
    config = at_shape(config, batch, seq_len)
    config_tools.check_config(config)
    with jax.default_prng_impl(config_tools.prng_impl(config)):
        dataset = builders.build_dataset(config)
        run, params, opt_state, batch_sh = jitted_train_step(config, dataset)
        batches = [shd.global_batch(dataset.batch(s, batch), batch_sh)
                   for s in range(steps + 1)]
        keys = [run.keys(s) for s in range(steps + 1)]
        compiled = run.train.lower(params, opt_state, batches[0], *keys[0]).compile()
        params, opt_state, m = jax.block_until_ready(
            compiled(params, opt_state, batches[0], *keys[0]))
        t0 = time.perf_counter()
        for s in range(1, steps + 1):
            params, opt_state, m = compiled(params, opt_state, batches[s], *keys[s])
        jax.block_until_ready(m)
    step_s = (time.perf_counter() - t0) / steps
    return {"step_s": step_s, "tokens_per_s": batch * seq_len / step_s,
            "loss": float(m["loss"])}


def model_vocab(model) -> int:
    cfg = getattr(model, "cfg", None) or getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "vocab_size"):
        raise AttributeError("the model exposes no cfg.vocab_size")
    return int(cfg.vocab_size)


def decode_time(model, batch: int, context: int, new_tokens: int) -> dict[str, float]:
    """Decode tokens/s after prefilling `context` random tokens, and the cache's bytes."""
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, model_vocab(model), (batch, context)).astype(np.int32)
    out = gen.generate(model, prompt, new_tokens, temperature=0.0)
    return {"tokens_per_s": out["tokens_per_s"], "step_s": out["decode_s"] / new_tokens,
            "prefill_s": out["prefill_s"], "state_bytes": out["state_bytes"]}


def measure(config, *, train_lengths: Sequence[int] = (), train_batch: int = 8,
            train_steps: int = 5, decode_contexts: Sequence[int] = (),
            decode_batch: int = 1, decode_tokens: int = 32, deadline: float | None = None,
            log=print) -> dict[str, Any]:
    """Train and decode throughput of the model of a train.py config;
    `{params, state_size, train: {T: ...}, decode: {ctx: ...}}`.

    Lengths past `deadline` (a time.time() value) are skipped and marked so.
    """
    model_cfg = builders.build_model_config(config, builders.build_dataset(config))
    make_model = builders.model_factory(model_cfg, config.train.seed)
    *_, shapes = model_state.describe(make_model)
    model = make_model()
    out: dict[str, Any] = {"params": model_state.num_params(shapes),
                           "state_size": int(model.state_size()), "train": {}, "decode": {}}
    # decode first: the decode-state comparison is the headline of the speed task
    jobs = [("decode", c) for c in decode_contexts] + [("train", t) for t in train_lengths]
    for kind, n in jobs:
        if deadline is not None and time.time() > deadline:
            out[kind][str(n)] = {"error": "skipped: sweep time budget spent"}
            continue
        try:
            if kind == "train":
                cell = train_step_time(config, train_batch, n, train_steps)
            else:
                cell = decode_time(model, decode_batch, n, decode_tokens)
        except Exception as e:  # noqa: BLE001 (an OOM at one length must not lose the rest)
            first = str(e).splitlines()[0][:200] if str(e) else ""
            cell = {"error": f"{type(e).__name__}: {first}"}
        out[kind][str(n)] = cell
        log(f"  {kind} T={n}: {cell}")
    return out
