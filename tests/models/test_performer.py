"""FAVOR+ (the `performer` mixer): google-research's causal numerator and denominator in
float64 against kernels.ops, no overflow at any head dim and input scale, unbiasedness
of the stabilised features, causality, and feature redraw keyed by the step."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kernels import ops
from models import feature_maps as fm
from models.mixers import get_mixer
from tests.models.helpers import tiny_config


def google_causal_favor(qf, kf, v):
    """google-research fast_attention's causal FAVOR+, float64: the numerator is the
    prefix sum of phi(k_s) v_s^T read by phi(q_t), the denominator the prefix sum of
    phi(k_s) read by phi(q_t); output num / den. qf, kf (T, F), v (T, Dv)."""
    qf, kf, v = (np.asarray(a, np.float64) for a in (qf, kf, v))
    sums = np.cumsum(kf[:, :, None] * v[:, None, :], axis=0)   # (T, F, Dv)
    num = np.einsum("tf,tfv->tv", qf, sums)
    den = np.einsum("tf,tf->t", qf, np.cumsum(kf, axis=0))
    return num / den[:, None]


def features(x, omega, *, query, shift=None, eps=0.0):
    s = x.shape[-1] ** -0.25
    c = fm.key_shift(omega) if shift is None else shift
    return fm.favor_plus(x, omega, scale=s, query=query, eps=eps, shift=c)


@pytest.mark.parametrize("impl", ["chunk", "recurrent"])
def test_op_matches_google_research_causal_favor(impl):
    t, h, d, m = 24, 2, 16, 32
    kq, kk, kv, ko = jax.random.split(jax.random.key(0), 4)
    omega = fm.gaussian_projection(ko, m, d)
    q = jax.random.normal(kq, (1, t, h, d))
    k = jax.random.normal(kk, (1, t, h, d))
    v = jax.random.normal(kv, (1, t, h, d))
    qf, kf = features(q, omega, query=True), features(k, omega, query=False)
    out = ops.linear_attention(qf, kf, v, eps=0.0, impl=impl, chunk_size=8)
    for i in range(h):
        ref = google_causal_favor(qf[0, :, i], kf[0, :, i], v[0, :, i])
        np.testing.assert_allclose(out[0, :, i], ref, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("d", [32, 64, 128, 256])
def test_finite_outputs_and_gradients_at_large_scale(d):
    t, m, std = 16, 256, 10.0
    kq, kk, kv, ko = jax.random.split(jax.random.key(d), 4)
    omega = fm.gaussian_projection(ko, m, d)
    q = std * jax.random.normal(kq, (1, t, 2, d))
    k = std * jax.random.normal(kk, (1, t, 2, d))
    # The worst key: x * d^(-1/4) equal to the longest omega row reaches the bound
    # |omega_i|^2 / 2 (33 / 50 / 92 / ~160 at d = 32 ... 256), past exp's range at d >= 128.
    row = omega[jnp.argmax(jnp.sum(omega * omega, -1))]
    k = k.at[0, 3, 0].set(row * d ** 0.25)
    v = jax.random.normal(kv, (1, t, 2, d))

    def loss(q, k, v):
        o = ops.linear_attention(features(q, omega, query=True, eps=1e-4),
                                 features(k, omega, query=False, eps=1e-4), v,
                                 impl="chunk", chunk_size=8)
        return jnp.sum(o * o), o

    (_, o), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    assert bool(jnp.all(jnp.isfinite(o)))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
    raw = features(k[0, 3, 0], omega, query=False, shift=0.0)
    if d >= 128:  # what the shift prevents
        assert not bool(jnp.all(jnp.isfinite(raw)))


def test_stabilised_features_unbiased():
    # exp(c) phi_c(q) . phi_c(k) over independent omega draws against exp(q . k / sqrt(d)),
    # at d = 128 where the shift c is positive.
    d, m, draws = 128, 128, 400
    kq, kk = jax.random.split(jax.random.key(1))
    q = 0.3 * jax.random.normal(kq, (d,))
    k = 0.3 * jax.random.normal(kk, (d,))
    s = d ** -0.25

    def estimate(key):
        omega = fm.gaussian_projection(key, m, d)
        c = fm.key_shift(omega)
        pq = fm.favor_plus(q, omega, scale=s)
        pk = fm.favor_plus(k, omega, scale=s, shift=c)
        return jnp.exp(c) * (pq @ pk), c

    est, c = jax.jit(jax.vmap(estimate))(jax.random.split(jax.random.key(2), draws))
    assert float(jnp.min(c)) > 0
    est = np.asarray(est, np.float64)
    target = math.exp(float(q @ k) / math.sqrt(d))
    se = est.std(ddof=1) / math.sqrt(draws)
    assert abs(est.mean() - target) < 5 * se, (est.mean(), target, se)


def test_shift_cancels_in_the_output():
    # Where unstabilised features are finite, the shifted ones give the same output once
    # every eps (the features', the op's) carries the same factor exp(-c): then the shift
    # is an exact common factor of the numerator and the denominator.
    t, h, d, m = 16, 2, 128, 64
    kq, kk, kv, ko = jax.random.split(jax.random.key(3), 4)
    omega = fm.gaussian_projection(ko, m, d)
    c = fm.key_shift(omega)
    assert float(c) > 0
    q, k, v = (jax.random.normal(kk_, (1, t, h, d)) for kk_ in (kq, kk, kv))
    qf = features(q, omega, query=True, eps=1e-4)
    plain = ops.linear_attention(qf, features(k, omega, query=False, shift=0.0, eps=1e-4),
                                 v, eps=1e-6, impl="chunk", chunk_size=8)
    e = jnp.exp(-c)
    stab = ops.linear_attention(qf, features(k, omega, query=False, eps=1e-4 * e), v,
                                eps=1e-6 * e, impl="chunk", chunk_size=8)
    np.testing.assert_allclose(stab, plain, rtol=2e-5, atol=1e-6)


def test_no_shift_below_the_headroom():
    # Head dims up to 64 (max |omega_i|^2 / 2 < KEY_HEADROOM): c = 0, today's features.
    omega = fm.gaussian_projection(jax.random.key(4), 256, 64)
    assert float(fm.key_shift(omega)) == 0.0
    omega = fm.gaussian_projection(jax.random.key(4), 256, 256)
    bound = 0.5 * float(jnp.max(jnp.sum(omega * omega, -1)))
    assert float(fm.key_shift(omega)) == pytest.approx(bound - fm.KEY_HEADROOM)


def test_performer_layer_is_causal():
    cfg = tiny_config(mixer="performer")
    layer = get_mixer("performer")(cfg, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(5), (2, 12, cfg.d_model))
    t = 6
    x2 = x.at[:, t + 1:].add(10.0 * jax.random.normal(jax.random.key(6), x[:, t + 1:].shape))
    y, y2 = layer(x), layer(x2)
    np.testing.assert_allclose(y2[:, :t + 1], y[:, :t + 1], rtol=0, atol=1e-6)
    assert not np.allclose(y2[:, t + 1:], y[:, t + 1:])


def test_redraw_keyed_by_step():
    draw = lambda step, every: fm.redrawn_projection(7, step, 16, 8, every=every)
    np.testing.assert_array_equal(draw(10, 5), draw(14, 5))   # same block of 5 steps
    assert not np.allclose(draw(10, 5), draw(15, 5))          # the next block redraws
    np.testing.assert_array_equal(draw(3, 0), draw(999, 0))   # every = 0: one draw
    np.testing.assert_array_equal(draw(3, 1), draw(3, 1))     # a resume draws the same
    assert not np.allclose(draw(3, 1), draw(4, 1))
