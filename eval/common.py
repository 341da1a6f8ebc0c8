"""Helpers shared by the eval CLIs: loading a run, a jitted forward pass, CLI plumbing.

Everything here works on any `LanguageModel` that keeps the models/ contract
(docs/INTERFACES.md); nothing depends on which mixer the model uses.
"""
from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from training.step import token_losses


STEP_HELP = ("Which checkpoint: 'latest' (the newest that passes its checks), 'best' "
             "(the kept step with the lowest eval loss) or a step number.")


def parse_step(text: str | int | None) -> int | str | None:
    """The --step flag: None for 'latest', 'best', or a step number; else a clear error."""
    if text is None or isinstance(text, int):
        return text
    text = str(text).strip().lower()
    if text in ("", "latest"):
        return None
    if text == "best":
        return "best"
    if text.isdigit():
        return int(text)
    raise ValueError(f"--step={text!r}: use 'latest', 'best' or a step number")


def load_run(workdir: str, step: int | str | None = None, *, data: bool = True):
    """(model, config, dataset, step) of a trained run at `step` (parse_step's values);
    a clear error if it is missing. The tokenizer is the one saved with the run;
    data=False reads no corpus (`dataset` then has only tokenizer and vocab_size)."""
    if not os.path.isdir(workdir):
        raise FileNotFoundError(
            f"workdir {workdir!r} does not exist: pass the --workdir a train.py run wrote "
            "(python train.py --config=configs/NAME.py --workdir=DIR)")
    from training.checkpoint import load_for_eval  # downstream of training, by design

    return load_for_eval(workdir, parse_step(step), data=data)


def make_logits_fn(model: nnx.Module) -> Callable[..., jax.Array]:
    """A jitted `(inputs, segment_ids=None) -> logits` float32 for a fixed (eval-mode)
    model; segment_ids None: each row is one sequence.

    The model is split once into (graphdef, state) and merged inside the traced
    function, so jit sees a pure function of arrays (DESIGN: split state explicitly).
    Models of one architecture (equal graphdefs: a sweep's lrs and seeds, measured one
    after another) share one jitted forward and so its compilation; the graphdef is
    looked up once per model, not per call (hashing it takes about a millisecond at 8
    layers).
    """
    graphdef, state = nnx.split(model)
    forward = _forward_of(graphdef)

    def logits_fn(inputs, segment_ids=None):
        # None: each row one sequence, run as training runs unpacked rows (no segment
        # masks: cuDNN's causal kernel for softmax, the unsegmented linear kernels)
        if segment_ids is not None:
            segment_ids = jnp.asarray(segment_ids, jnp.int32)
        return forward(state, jnp.asarray(inputs, jnp.int32), segment_ids)

    return logits_fn


@functools.lru_cache(maxsize=8)
def _forward_of(graphdef):
    """The jitted float32 forward of the models with this graphdef."""

    @jax.jit
    def forward(state, inputs, segment_ids):
        m = nnx.merge(graphdef, state)
        return m(inputs, segment_ids=segment_ids, deterministic=True).astype(jnp.float32)

    return forward


def token_stats_fn(logits_fn: Callable[..., jax.Array], packed: bool = True):
    """`(batch) -> (nll, correct)` per position, float32 / bool NumPy arrays (B, T).

    nll is -log softmax(logits)[target]; correct is argmax(logits) == target.
    packed: rows may hold several documents (the dataset's `packed`), so the batch's
    segment_ids reach the model; False: they do not, as in training's loss (each row one
    example: the same values through the unsegmented kernels).
    """

    def stats(batch: Mapping[str, np.ndarray]):
        seg = batch.get("segment_ids") if packed else None
        logits = logits_fn(batch["inputs"], seg)
        nll, correct = _token_stats(logits, jnp.asarray(batch["targets"], jnp.int32))
        return np.asarray(nll, np.float64), np.asarray(correct) > 0

    return stats


def rows_packed(dataset) -> bool:
    """The dataset's `packed` (data.base.Dataset); True where it has none (a run loaded
    without its corpus: batches then say what they hold by their segment_ids)."""
    return bool(getattr(dataset, "packed", True))


# Evaluation scores each token as the training loss does (float32 cross-entropy, argmax).
_token_stats = jax.jit(token_losses)


def user_errors(main):
    """Wraps a CLI main: a mistake the user can fix (missing workdir, wrong task, bad
    flag value) exits with one line naming it instead of a traceback."""
    import functools

    @functools.wraps(main)
    def wrapped(argv):
        from absl import logging
        logging.set_verbosity(logging.WARNING)  # orbax logs every file it reads at INFO
        try:
            return main(argv)
        except (ValueError, FileNotFoundError) as e:
            sys.exit(f"error: {e}")

    return wrapped


def print_json(record: Mapping[str, Any]) -> None:
    """Prints one JSON line to stdout (the CLIs' machine-readable result, last)."""
    sys.stdout.flush()
    print(json.dumps(record, sort_keys=False), flush=True)


def write_json(path: str, record: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, path)  # atomic: a killed process never leaves half a file
