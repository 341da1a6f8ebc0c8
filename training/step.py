"""The train and eval steps: pure functions of (params, optimizer state, batch, keys).

Both train.py's loop and eval/speed.py build their step here, so the speed table times the
step that training runs. The functions are not jitted: the caller jits them with its own
shardings and donation.

A batch is a dict of [batch, seq] arrays: "inputs", "targets", "segment_ids" and "mask"
(1 where a target token counts toward the loss).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from models import auxiliary
from training import model_state
from training import sharding as shd


# Past this many logits (tokens x vocabulary) in a batch, the loss forms them a few
# positions at a time and the backward pass forms them again: the batch's float32 logits,
# their softmax and their gradient (B x T x V floats each) then never exist at once. Below
# it one pass is faster and the memory small.
LOSS_CHUNK_LOGITS = 1 << 26


def token_losses(logits, targets):
    """(cross-entropy, 1.0 where the argmax is the target) per token, float32."""
    logits = logits.astype(jnp.float32)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return nll, correct


def _masked_sums(logits, targets, mask):
    """(sum of masked cross-entropies, number of masked tokens, number correct)."""
    nll, correct = token_losses(logits, targets)
    return jnp.sum(nll * mask), jnp.sum(mask), jnp.sum(correct * mask)


def loss_sums(model, batch, *, deterministic: bool, packed: bool = True,
              chunk_logits: int = LOSS_CHUNK_LOGITS, targets_per_row: int | None = None):
    """(sum of masked token cross-entropies, number of masked tokens, number correct).
    packed: the data's rows may hold several documents (data.Dataset.packed); if not,
    the model gets no segment ids (every linear op then runs its unsegmented kernel).
    targets_per_row: at most this many positions of a row have mask != 0
    (data.Dataset.targets_per_row; None: any number): the logits are then formed only
    at those positions, which is exact (a position of mask 0 adds nothing to any sum)
    and for MQAR (16 queries in 256 positions) cuts the head and the softmax over the
    vocabulary 16-fold.
    A model with `hidden` and `logits` (models.LanguageModel) whose batch would hold more
    than chunk_logits logits has them formed in pieces of the time axis
    (_chunked_sums)."""
    inputs, targets = batch["inputs"], batch["targets"]
    segment_ids = batch["segment_ids"] if packed else None
    mask = batch["mask"].astype(jnp.float32)
    vocab = getattr(getattr(model, "cfg", None), "vocab_size", None)
    if vocab is None or not hasattr(model, "hidden"):
        logits = model(inputs, segment_ids=segment_ids, deterministic=deterministic)
        return _masked_sums(logits, targets, mask)
    # model(inputs) is model.logits(model.hidden(inputs)): the same ops either way
    x = model.hidden(inputs, segment_ids=segment_ids, deterministic=deterministic)
    if targets_per_row is not None and targets_per_row < targets.shape[1]:
        x, targets, mask = target_positions(x, targets, mask, targets_per_row)
    if targets.size * vocab <= chunk_logits:
        return _masked_sums(model.logits(x), targets, mask)
    width = max(1, chunk_logits // (targets.shape[0] * vocab))
    nll_sum, correct_sum = _chunked_sums(model.logits, x, targets, mask, width)
    return nll_sum, jnp.sum(mask), correct_sum


def target_positions(x, targets, mask, k: int):
    """(x, targets, mask) at the first k positions of each row with mask != 0, in order,
    then positions of mask 0 where a row has fewer: x (B, T, ...) -> (B, k, ...). Exact
    for every sum over mask only when no row has more than k such positions."""
    order = jnp.argsort(mask == 0, axis=1, stable=True)[:, :k]

    def take(a):
        index = order.reshape(order.shape + (1,) * (a.ndim - 2))
        return jnp.take_along_axis(a, index, axis=1)
    return take(x), take(targets), take(mask)


def _chunked_sums(logits_of, x, targets, mask, width: int):
    """(sum of masked cross-entropies, number correct) over pieces of `width` positions
    of the time axis, each piece's logits formed under jax.checkpoint (the backward pass
    keeps only x). Pieces cut the time axis, not the batch, so the batch keeps its
    sharding; padded positions have mask 0."""
    b, t = targets.shape
    pieces = -(-t // width)

    def split(a):  # (B, T, ...) -> (pieces, B, width, ...)
        a = jnp.pad(a, [(0, 0), (0, pieces * width - t)] + [(0, 0)] * (a.ndim - 2))
        return jnp.swapaxes(a.reshape((b, pieces, width) + a.shape[2:]), 0, 1)

    @jax.checkpoint
    def piece(args):
        xp, tp, mp = args
        nll, correct = token_losses(logits_of(xp), tp)
        return jnp.sum(nll * mp), jnp.sum(correct * mp)

    nll, correct = jax.lax.map(piece, (split(x), split(targets), split(mask)))
    return jnp.sum(nll), jnp.sum(correct)


@dataclasses.dataclass(frozen=True)
class Rows:
    """What the loss needs to know of the data's rows (data.Dataset's properties).

    packed: a row may hold several documents; the model is given the batch's segment_ids
      only then (every linear op runs its unsegmented kernel otherwise).
    targets_per_row: at most this many positions of a row carry loss (None: any number);
      the logits are then formed only there (loss_sums).
    """
    packed: bool = True
    targets_per_row: int | None = None

    @classmethod
    def of(cls, dataset) -> "Rows":
        return cls(bool(dataset.packed), dataset.targets_per_row)


def make_train_step(parts: model_state.ModelParts, tx, grad_accum: int, mesh,
                    rows: Rows = Rows()):
    """One optimizer update, as a pure function to jit.

    Args:
      parts: the model's fixed structure (model_state.ModelParts) that rebuilds it around
        a flat {name: array} params dict.
      tx: the optax GradientTransformation (optim.make_optimizer's first result).
      grad_accum: microbatches per step; the batch's leading dimension must divide by it.
        The gradient equals that of the whole batch at once.
      mesh: the jax.sharding.Mesh; microbatches stay split over its batch axes.
      rows: the data's Rows (Rows.of(dataset)).

    Returns:
      step(params, opt_state, batch, rng, feature_rng) -> (params, opt_state, metrics),
      where rng is the step's key (dropout is keyed by it and the microbatch index),
      feature_rng the key of the step's random features (Performer's redraw;
      runtime.Steps.feature_key: one per redraw period) and metrics is
      {"loss": mean masked cross-entropy, "grad_norm": global gradient norm, "finite":
      True when loss, gradients and new parameters are all finite}. The gradient is that
      of the mean cross-entropy plus the auxiliary losses the layers sow while training
      (models.auxiliary; e.g. model.hedgehog_distill), which "loss" leaves out.
    """

    def summed(p, batch, rng, feature_rng):
        # The model is merged inside its own jit (inlined by XLA): NNX lets a model mutate
        # Variables (RNG counters, remat's write-back) only in the trace that created them.
        rest = model_state.rekey(parts.rest, rng, feature_rng)
        model = parts.merge(p, rest)

        def sums(model):
            return loss_sums(model, batch, deterministic=False, packed=rows.packed,
                             targets_per_row=rows.targets_per_row)
        if not getattr(getattr(model, "cfg", None), "has_auxiliary_loss", False):
            s, n, c = sums(model)
            return s, (n, c, s)
        (s, n, c), sown = nnx.capture(sums, nnx.Intermediate)(model)
        # The layers' auxiliary losses (models.auxiliary; Hedgehog's distillation) are
        # means, so they enter the summed objective times the token count n: after the
        # division by the step's count the gradient is that of mean CE + aux.
        return s + auxiliary.total(sown) * n, (n, c, s)
    summed_grad = jax.value_and_grad(jax.jit(summed), has_aux=True)

    def grads_of(params, batch, rng, feature_rng):
        (_, (n, _, s)), g = summed_grad(params, batch, rng, feature_rng)
        return s, n, g

    def step(params, opt_state, batch, rng, feature_rng):
        if grad_accum == 1:
            loss_sum, count, grads = grads_of(params, batch, rng, feature_rng)
        else:
            # Microbatch i takes rows i, i+A, i+2A...: every device keeps a share of each.
            def split(x):
                x = x.reshape((x.shape[0] // grad_accum, grad_accum) + x.shape[1:])
                x = x.swapaxes(0, 1)
                return jax.lax.with_sharding_constraint(
                    x, jax.sharding.NamedSharding(mesh, shd.batch_spec(mesh, (None,))))
            micro = jax.tree.map(split, batch)
            zeros = jax.tree.map(jnp.zeros_like, params)

            def body(carry, xs):
                s_acc, n_acc, g_acc = carry
                mb, i = xs
                # Dropout differs per microbatch; the random features do not: every
                # microbatch of a step uses the step's draw, so the gradient is that of
                # one big batch with those features, whatever grad_accum is.
                s, n, g = grads_of(params, mb, jax.random.fold_in(rng, i), feature_rng)
                return (s_acc + s, n_acc + n, jax.tree.map(jnp.add, g_acc, g)), None
            (loss_sum, count, grads), _ = jax.lax.scan(
                body, (jnp.zeros(()), jnp.zeros(()), zeros),
                (micro, jnp.arange(grad_accum)))
        # Sums over all masked tokens, then one division: the gradient of one big batch.
        count = jnp.maximum(count, 1.0)
        grads = jax.tree.map(lambda g: g / count, grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        loss, grad_norm = loss_sum / count, optax.global_norm(grads)
        # A checkpoint is only written after a step whose loss, gradients and new parameters
        # are all finite (one cheap reduction), so a NaN is never saved.
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.all(jnp.stack(
            [jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(params)]))
        return params, opt_state, {"loss": loss, "grad_norm": grad_norm, "finite": finite}

    return step


def make_eval_step(parts: model_state.ModelParts, rows: Rows = Rows()):
    """step(params, batch) -> loss_sums of the model at `params`, without dropout, on data
    of these Rows."""
    def step(params, batch):
        return loss_sums(parts.merge(params), batch, deterministic=True, packed=rows.packed,
                         targets_per_row=rows.targets_per_row)
    return step
