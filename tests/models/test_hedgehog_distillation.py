"""Hedgehog's attention distillation (cfg.hedgehog_distill): the layer's loss against a
float64 NumPy transcription of its definition (both maps, packed documents, inputs large
enough that float32 features underflow), and the train step's gradient against that of
the next-token loss plus the weighted layer losses written out by hand, with the logged
loss still the next-token one."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from models import LanguageModel
from models.mixers import get_mixer
from tests.models.helpers import tiny_config
from training import model_state
from training import step as step_fns

T = 12
SEGMENTS = np.array([[0] * 5 + [1] * 7, [0] * 12], np.int32)


def reference_loss(q, k, w_q, b_q, w_k, b_k, form, segments, floor=0.0):
    """float64: mean over (batch, head, query) of -sum_s A_ts log B_ts, A the causal
    same-document softmax of q k / sqrt(D), B the normalised phi(q) . phi(k). floor: the
    layer's rule for a pair whose features, each divided by its token's largest, sum
    to less than it (counted as the floor)."""
    q, k = q.astype(np.float64), k.astype(np.float64)
    a_q = np.einsum("bthd,hde->bthe", q, w_q) + b_q
    a_k = np.einsum("bthd,hde->bthe", k, w_k) + b_k

    def phi(a):
        if form == "exp":
            return np.concatenate([np.exp(a), np.exp(-a)], -1)
        z = np.concatenate([2 * a, -2 * a], -1)
        z = np.exp(z - z.max(-1, keepdims=True))
        return z / z.sum(-1, keepdims=True)
    t = q.shape[1]
    causal = np.tril(np.ones((t, t), bool))
    visible = causal[None] & (segments[:, :, None] == segments[:, None, :])
    visible = visible[:, None]                                           # (B, 1, T, S)
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    scores = np.where(visible, scores, -np.inf)
    target = np.exp(scores - scores.max(-1, keepdims=True))
    target /= target.sum(-1, keepdims=True)
    f_q, f_k = phi(a_q), phi(a_k)
    top_q, top_k = f_q.max(-1), f_k.max(-1)                                  # (B, T, H)
    shifted = np.einsum("bthf,bshf->bhts", f_q / top_q[..., None], f_k / top_k[..., None])
    scale = np.einsum("bth,bsh->bhts", top_q, top_k)
    dots = np.where(visible, np.maximum(shifted, floor) * scale, 0.0)
    weights = dots / dots.sum(-1, keepdims=True)
    logs = np.where(visible, np.log(np.where(visible, weights, 1.0)), 0.0)
    return float(np.mean(-(target * logs).sum(-1)))


def _map_weights(mixer, rng):
    """Random maps (not the identity init), so W and b both matter."""
    for fmap in (mixer.feature_map_q, mixer.feature_map_k):
        shape = fmap.kernel[...].shape
        fmap.kernel[...] = jnp.eye(shape[-1]) + 0.3 * rng.standard_normal(shape)
        fmap.bias[...] = 0.2 * rng.standard_normal(shape[:2])


@pytest.mark.parametrize("form,scale,floored", [
    ("softmax", 1.0, False), ("softmax", 5.0, False), ("exp", 1.0, False),
    ("exp", 12.0, False), ("softmax", 20.0, True), ("exp", 30.0, True)])
def test_the_layers_loss_is_its_definition(form, scale, floored):
    # exp 12: features span e^-40 ... e^40, past float32's range, and the log-space form
    # still gives float64's loss; softmax 20, exp 30: some pairs' shifted sums fall under
    # the 1e-30 floor and count as the floor (there the exact loss differs)
    cfg = tiny_config(mixer="hedgehog", hedgehog_map=form)
    mixer = get_mixer("hedgehog")(cfg, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(3)
    _map_weights(mixer, rng)
    shape = (2, T, cfg.num_heads, cfg.resolved_head_dim)
    q = (scale * rng.standard_normal(shape)).astype(np.float32)
    k = (scale * rng.standard_normal(shape)).astype(np.float32)
    got = float(mixer.distillation_loss(jnp.asarray(q), jnp.asarray(k), SEGMENTS))
    maps = [np.asarray(a[...], np.float64) for a in (
        mixer.feature_map_q.kernel, mixer.feature_map_q.bias, mixer.feature_map_k.kernel,
        mixer.feature_map_k.bias)]
    want = reference_loss(q, k, *maps, form, SEGMENTS, floor=1e-30)
    assert got == pytest.approx(want, rel=1e-4)
    exact = reference_loss(q, k, *maps, form, SEGMENTS)
    assert (abs(exact - want) > 1e-3 * want) == floored
    grads = nnx.grad(lambda m: m.distillation_loss(jnp.asarray(q), jnp.asarray(k),
                                                   SEGMENTS))(mixer)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


def _parts(cfg):
    """(ModelParts, flat params) of a LanguageModel of cfg, as training builds them."""
    def make():
        return LanguageModel(cfg, rngs=nnx.Rngs(0))
    graphdef, template, _, names, logical, shapes = model_state.describe(make)
    _, params, rest = nnx.split(make(), nnx.Param, ...)
    parts = model_state.ModelParts(graphdef, template, rest, names, logical, shapes)
    return parts, model_state.flat_params(params)


@pytest.mark.parametrize("remat", [False, True])
def test_the_train_step_adds_the_weighted_layer_losses(remat):
    weight = 0.7
    cfg = tiny_config(mixer="hedgehog", num_layers=2, hedgehog_distill=weight, remat=remat)
    parts, params = _parts(cfg)
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, T + 1))
    batch = {"inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
             "targets": jnp.asarray(tokens[:, 1:], jnp.int32),
             "mask": jnp.ones((2, T), jnp.float32), "segment_ids": jnp.asarray(SEGMENTS)}
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    # plain SGD at lr 1: the update is minus the gradient of the step's objective
    train = step_fns.make_train_step(parts, optax.sgd(1.0), 1, mesh)
    key = jax.random.key(0)
    new, _, metrics = jax.jit(train)(dict(params), optax.sgd(1.0).init(params), batch,
                                     key, key)

    def by_hand(p):
        """mean next-token CE + weight x each hedgehog layer's loss on its own input."""
        model = parts.merge(p)
        s, n, _ = step_fns.loss_sums(model, batch, deterministic=True)
        x, layers = model._embed(batch["inputs"]), 0.0
        for block in model.blocks:
            h = block.mixer_norm(x)
            pre, _ = block.mixer._projections(h, segment_ids=batch["segment_ids"],
                                              conv_state=None)
            layers = layers + block.mixer.distillation_loss(pre["q"], pre["k"],
                                                            batch["segment_ids"])
            x = block(x, segment_ids=batch["segment_ids"])
        return s / n + weight * layers, s / n
    (_, nll), grads = jax.value_and_grad(by_hand, has_aux=True)(params)
    assert float(metrics["loss"]) == pytest.approx(float(nll), rel=1e-5)
    for name in params:
        np.testing.assert_allclose(np.asarray(params[name] - new[name]),
                                   np.asarray(grads[name]), rtol=2e-4, atol=1e-6,
                                   err_msg=name)
    # the maps learn from the distillation: their gradient differs from the CE's alone
    ce_only = jax.grad(lambda p: by_hand(p)[1])(params)
    map_names = [n for n in params if "feature_map" in n]
    assert map_names and any(
        float(jnp.max(jnp.abs(grads[n] - ce_only[n]))) > 1e-4 for n in map_names)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="hedgehog_distill"):
        tiny_config(mixer="hedgehog", hedgehog_distill=-1.0)
    with pytest.raises(ValueError, match="scan_layers=False"):
        tiny_config(mixer="hedgehog", hedgehog_distill=1.0, scan_layers=True)
