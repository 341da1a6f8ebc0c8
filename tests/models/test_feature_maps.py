"""Feature maps against hand-worked examples and known identities (seed 000)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import feature_maps as fm


def test_taylor_seed_example():
    # Seed 000: q = (1, 2), k = (3, 1): s = 5, outer products (1,2,2,4).(9,3,3,1) = 25.
    q, k = jnp.array([1.0, 2.0]), jnp.array([3.0, 1.0])
    r2 = math.sqrt(2)
    np.testing.assert_allclose(fm.taylor(q), [1, 1, 2, 1 / r2, 2 / r2, 2 / r2, 4 / r2],
                               rtol=1e-6)
    assert float(fm.taylor(q) @ fm.taylor(k)) == pytest.approx(1 + 5 + 25 / 2, rel=1e-6)


def test_taylor_kernel_identity_float64():
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(5, 16)), rng.normal(size=(7, 16))
    with jax.enable_x64(True):
        fq, fk = np.asarray(fm.taylor(jnp.asarray(q))), np.asarray(fm.taylor(jnp.asarray(k)))
    assert fq.shape == (5, fm.taylor_dim(16)) == (5, 273)
    s = q @ k.T
    np.testing.assert_allclose(fq @ fk.T, 1 + s + s ** 2 / 2, rtol=1e-12)


def test_taylor_with_based_temperature_gives_scaled_score():
    # Based scales q, k by d^(-1/4) first, so the kernel is 1 + s + s^2/2, s = q.k / sqrt(d).
    rng = np.random.default_rng(1)
    d = 16
    q, k = rng.normal(size=d), rng.normal(size=d)
    with jax.enable_x64(True):
        got = float(fm.taylor(jnp.asarray(q) * d ** -0.25) @ fm.taylor(jnp.asarray(k) * d ** -0.25))
    s = q @ k / math.sqrt(d)
    assert got == pytest.approx(1 + s + s * s / 2, rel=1e-12)


def test_taylor_symmetric_worked_example():
    # q = (1, 2): [1, q1, q2, q1^2/sqrt2, q1 q2, q2^2/sqrt2]; with k = (3, 1) the kernel is
    # 1 + 5 + 25/2, as for the full map (seed 000's example).
    q, k = jnp.array([1.0, 2.0]), jnp.array([3.0, 1.0])
    r2 = math.sqrt(2)
    np.testing.assert_allclose(fm.taylor_symmetric(q), [1, 1, 2, 1 / r2, 2, 4 / r2],
                               rtol=1e-6)
    assert float(fm.taylor_symmetric(q) @ fm.taylor_symmetric(k)) == pytest.approx(
        1 + 5 + 25 / 2, rel=1e-6)


def test_taylor_symmetric_equals_full_kernel_float64():
    rng = np.random.default_rng(2)
    q, k = rng.normal(size=(3, 5, 16)), rng.normal(size=(3, 7, 16))
    with jax.enable_x64(True):
        sq, sk = (np.asarray(fm.taylor_symmetric(jnp.asarray(a))) for a in (q, k))
        fq, fk = (np.asarray(fm.taylor(jnp.asarray(a))) for a in (q, k))
    assert sq.shape == (3, 5, fm.taylor_symmetric_dim(16)) == (3, 5, 153)
    s = np.einsum("bid,bjd->bij", q, k)
    np.testing.assert_allclose(np.einsum("bif,bjf->bij", sq, sk), 1 + s + s ** 2 / 2,
                               rtol=1e-12)
    np.testing.assert_allclose(np.einsum("bif,bjf->bij", sq, sk),
                               np.einsum("bif,bjf->bij", fq, fk), rtol=1e-12)


def _estimates(q, k, omegas):
    """phi(q).phi(k) for each omega draw, omegas (N, m, d)."""
    f = jax.jit(jax.vmap(lambda om: fm.favor_plus(q, om) @ fm.favor_plus(k, om)))
    return np.asarray(f(omegas), np.float64)


def test_favor_plus_unbiased_iid_and_orthogonal():
    q = jnp.array([0.3, -0.2, 0.5, 0.1])
    k = jnp.array([0.4, 0.1, -0.3, 0.6])
    truth = math.exp(float(q @ k))
    n, m, d = 4000, 8, 4
    keys = jax.random.split(jax.random.key(0), n)
    for orthogonal in (False, True):
        draw = jax.jit(jax.vmap(lambda key: fm.gaussian_projection(key, m, d,
                                                                    orthogonal=orthogonal)))
        omegas = draw(keys)
        est = _estimates(q, k, omegas)
        se = est.std(ddof=1) / math.sqrt(n)
        assert abs(est.mean() - truth) < 4 * se, (orthogonal, est.mean(), truth, se)


def test_favor_plus_relative_variance_iid():
    # Var / mean^2 = (exp(|q+k|^2) - 1) / m for iid Gaussian omega (seed 000, Performer Lemma 2).
    q = jnp.array([0.3, -0.2, 0.5, 0.1])
    k = jnp.array([0.4, 0.1, -0.3, 0.6])
    n, m = 20000, 16
    omegas = jax.random.normal(jax.random.key(1), (n, m, 4))
    est = _estimates(q, k, omegas)
    predicted = (math.exp(float(jnp.sum((q + k) ** 2))) - 1) / m
    measured = est.var(ddof=1) / math.exp(float(q @ k)) ** 2
    assert measured == pytest.approx(predicted, rel=0.15)


def test_orthogonal_blocks_are_orthogonal_with_chi_norms():
    d, m = 8, 4096
    w = np.asarray(fm.gaussian_projection(jax.random.key(2), m, d), np.float64)
    assert w.shape == (m, d)
    units = w / np.linalg.norm(w, axis=1, keepdims=True)
    for start in (0, d, 17 * d):  # rows inside one block are exactly orthogonal
        block = units[start:start + d]
        np.testing.assert_allclose(block @ block.T, np.eye(d), atol=1e-5)
    # Norms are chi(d): E|w|^2 = d and Var|w|^2 = 2d.
    sq = np.sum(w * w, axis=1)
    assert sq.mean() == pytest.approx(d, rel=4 * math.sqrt(2 * d / m) / d)
    assert sq.var() == pytest.approx(2 * d, rel=0.15)


def test_favor_plus_query_stabiliser_cancels_and_is_per_token():
    rng = np.random.default_rng(3)
    omega = fm.gaussian_projection(jax.random.key(3), 32, 8)
    x = jnp.asarray(rng.normal(size=(5, 8)) * 2.0, jnp.float32)
    plain = fm.favor_plus(x, omega, scale=8 ** -0.25)
    stab = fm.favor_plus(x, omega, scale=8 ** -0.25, query=True)
    ratio = np.asarray(stab / plain)  # one constant per token, so it cancels when normalised
    np.testing.assert_allclose(ratio, ratio[:, :1] * np.ones_like(ratio), rtol=1e-4)
    np.testing.assert_allclose(np.max(np.asarray(stab), axis=-1), 1 / math.sqrt(32), rtol=1e-6)
    # Per token: token 0's features ignore the other tokens entirely.
    np.testing.assert_allclose(fm.favor_plus(x[:1], omega, query=True),
                               fm.favor_plus(x, omega, query=True)[:1], rtol=1e-5)


def _fla_hedgehog_float64(x, w, b):
    """fla/modules/feature_map.py HedgehogFeatureMap.forward, transcribed per head:
    x = layer(x); torch.cat([2*x, -2*x], dim=-1).softmax(-1)."""
    a = np.einsum("...hd,hde->...he", x, w) + b
    e = np.concatenate([2 * a, -2 * a], -1)
    e = np.exp(e - e.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_hedgehog_map_matches_fla_float64():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 3, 2, 5)) * 3  # (B, T, H, D)
    phi = fm.HedgehogFeatureMap(num_heads=2, head_dim=5)
    # Identity init, zero bias (fla's eye_ / zeros_).
    np.testing.assert_array_equal(phi.kernel[...], np.broadcast_to(np.eye(5), (2, 5, 5)))
    np.testing.assert_array_equal(phi.bias[...], np.zeros((2, 5)))
    w = np.asarray(phi.kernel[...]) + 0.3 * rng.normal(size=(2, 5, 5))
    b = 0.5 * rng.normal(size=(2, 5))
    phi.kernel[...], phi.bias[...] = jnp.asarray(w), jnp.asarray(b)
    with jax.enable_x64(True):
        got = np.asarray(phi(jnp.asarray(x)))
        logs = np.asarray(phi.log_features(jnp.asarray(x)))
    ref = _fla_hedgehog_float64(x, w, b)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-12)  # W, b stored float32
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-12)
    # The paper's exp form takes [a, -a] as its log-features.
    a = np.einsum("...hd,hde->...he", x, np.asarray(phi.kernel[...], np.float64)) \
        + np.asarray(phi.bias[...], np.float64)
    np.testing.assert_allclose(logs, np.concatenate([a, -a], -1), rtol=1e-12)


def test_dpfp_hand_example():
    x = jnp.array([1.0, 2.0, -3.0])
    # r = (1, 2, 0, 0, 0, 3); roll 1 = (3, 1, 2, 0, 0, 0); roll 2 = (0, 3, 1, 2, 0, 0).
    np.testing.assert_allclose(fm.dpfp(x, nu=1), [3, 2, 0, 0, 0, 0])
    np.testing.assert_allclose(fm.dpfp(x, nu=2), [3, 2, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0])
    assert fm.dpfp(jnp.ones((4, 7)), nu=3).shape == (4, 2 * 7 * 3)


def test_simple_maps():
    x = jnp.array([-1.0, 0.0, 2.0])
    np.testing.assert_allclose(fm.elu_plus_one(x), [math.exp(-1), 1, 3], rtol=1e-6)
    np.testing.assert_allclose(fm.relu(x), [0, 0, 2])
    np.testing.assert_allclose(fm.identity(x), x)


@pytest.mark.parametrize("method", ["orthonormal_columns",
                                    "orthonormal_columns_gram_schmidt",
                                    "orthonormal_columns_householder"])
@pytest.mark.parametrize("shape", [(1, 4, 4), (3, 32, 32), (2, 128, 128)])
def test_orthonormal_columns_is_numpys_qr_with_positive_diagonal(shape, method):
    # Both platforms' methods (the GPU's Householder form runs on CPU here too).
    # The Q of a float64 LAPACK QR, signs fixed so that diag(R) > 0 (the unique such Q).
    g = np.random.default_rng(shape[-1]).normal(size=shape)
    q64, r64 = np.linalg.qr(g)
    q64 = q64 * np.sign(np.diagonal(r64, axis1=-2, axis2=-1))[..., None, :]
    q = np.asarray(getattr(fm, method)(jnp.asarray(g, jnp.float32)), np.float64)
    np.testing.assert_allclose(q, q64, atol=2e-5)
    eye = np.broadcast_to(np.eye(shape[-1]), shape)
    np.testing.assert_allclose(np.swapaxes(q, -1, -2) @ q, eye, atol=2e-6)


def test_orthonormal_columns_method_by_platform():
    """Lowered for CPU, Performer's redraw is Gram-Schmidt in plain ops (no LAPACK call,
    which deadlocked training on 2-core machines); lowered for CUDA, one Householder QR
    in cuSOLVER and no loop (d dependent steps of small kernels each, on a GPU)."""
    draw = jax.jit(lambda key: fm.gaussian_projection(key, 64, 16))
    traced = draw.trace(jax.random.key(0))
    cpu = traced.lower(lowering_platforms=("cpu",)).as_text()
    assert "stablehlo.while" in cpu and "custom_call" not in cpu
    cuda = traced.lower(lowering_platforms=("cuda",)).as_text()
    assert "cusolver_geqrf" in cuda and "stablehlo.while" not in cuda
