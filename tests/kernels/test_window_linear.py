"""kernels.window_linear: LoLCATs' hybrid attention in its three forms against each other
and against identities (float32 on CPU)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import window_linear as wl

B, T, H, D, F = 2, 29, 3, 8, 16


def _inputs(seed=0):
    ks = jax.random.split(jax.random.key(seed), 6)
    q = jax.random.normal(ks[0], (B, T, H, D))
    k = jax.random.normal(ks[1], (B, T, H, D))
    fq = jax.nn.softmax(jax.random.normal(ks[2], (B, T, H, F)), -1)
    fk = jax.nn.softmax(jax.random.normal(ks[3], (B, T, H, F)), -1)
    v = jax.random.normal(ks[4], (B, T, H, D))
    gamma = jax.nn.sigmoid(jax.random.normal(ks[5], (H,)))
    return q, k, fq, fk, v, gamma


SEGMENTS = np.array([[0] * 11 + [1] * 13 + [2] * 5, [0] * 29])


@pytest.mark.parametrize("window", [1, 5, 8, 40])
@pytest.mark.parametrize("packed", [False, True])
def test_blocked_equals_quadratic_with_gradients(window, packed):
    seg = jnp.asarray(SEGMENTS) if packed else None
    args = _inputs()
    cot = jax.random.normal(jax.random.key(9), (B, T, H, D))

    def loss(form, *a):
        return jnp.sum(form(*a, window=window, segment_ids=seg) * cot)

    blocked = lambda *a, **kw: wl.hybrid_blocked(*a, impl="chunk", chunk_size=8, **kw)
    # each form jitted (one program; eagerly, every op of the chunk form compiles alone)
    np.testing.assert_allclose(
        jax.jit(lambda *a: blocked(*a, window=window, segment_ids=seg))(*args),
        wl.hybrid_quadratic(*args, window=window, segment_ids=seg), rtol=1e-5, atol=1e-5)
    g_blocked = jax.jit(jax.grad(lambda *a: loss(blocked, *a), argnums=range(6)))(*args)
    g_quad = jax.jit(jax.grad(lambda *a: loss(wl.hybrid_quadratic, *a),
                              argnums=range(6)))(*args)
    for a, b in zip(g_blocked, g_quad):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_window_covering_the_sequence_is_softmax_attention():
    """No key is old enough for the linear part, and gamma cancels: causal softmax."""
    q, k, fq, fk, v, gamma = _inputs(1)
    qn, kn, vn = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.einsum("bthd,bshd->bhts", qn, kn) / np.sqrt(D)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    ref = np.einsum("bhts,bshd->bthd", a / a.sum(-1, keepdims=True), vn)
    for form in (wl.hybrid_quadratic, wl.hybrid_blocked):
        got = jax.jit(functools.partial(form, window=T))(q, k, fq, fk, v, gamma)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_segments_are_documents_alone():
    args = _inputs(2)
    seg = jnp.asarray(SEGMENTS)
    packed = jax.jit(functools.partial(wl.hybrid_blocked, window=5, segment_ids=seg,
                                       impl="chunk", chunk_size=8))(*args)
    for lo, hi in [(0, 11), (11, 24), (24, 29)]:
        alone = wl.hybrid_quadratic(*(x[:1, lo:hi] if x.ndim > 1 else x for x in args),
                                    window=5)
        np.testing.assert_allclose(packed[:1, lo:hi], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [1, 4, 40])
def test_steps_equal_quadratic(window):
    """The decode form: keys leave the window into the linear state through phi_k."""
    q, k, _, _, v, gamma = _inputs(3)
    w_map = jax.random.normal(jax.random.key(4), (H, D, F))
    phi = lambda x: jax.nn.softmax(jnp.einsum("...hd,hdf->...hf", x, w_map), -1)
    want = wl.hybrid_quadratic(q, k, phi(q), phi(k), v, gamma, window=window)
    state = wl.init_state(B, H, D, D, F, window, jnp.float32)
    got = []
    for t in range(T):
        y, state = wl.hybrid_step(q[:, t], k[:, t], phi(q[:, t]), v[:, t], gamma, state, phi)
        got.append(y)
    np.testing.assert_allclose(jnp.stack(got, 1), want, rtol=1e-5, atol=1e-5)
