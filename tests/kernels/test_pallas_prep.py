"""The gated delta rule's GPU preparation (kernels.pallas.gdn_prep: the K K^T + UT-solve
kernel, then W, Ut and P) against a float64 NumPy preparation written from its
definition, and its inverse X against NumPy's inverse. Interpret mode on CPU (the kernels
are GPU programs)."""
import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from kernels.pallas import Tuning, DEFAULT_TUNING, common, tiles
from kernels.pallas.gdn_prep import gdn_prep
from tests.kernels import reference

C = 16
B, TP, H, K, V = 2, 48, 2, 32, 16


def prep_inputs(seed, dtype, edges=False):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, TP, H, K))
    k = rng.standard_normal((B, TP, H, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((B, TP, H, V))
    g = np.log(rng.uniform(0.7, 1.0, (B, TP, H)))
    beta = rng.uniform(0.0, 1.0, (B, TP, H))
    if edges:       # no decay and beta exactly 0 / 1 in places
        g[:, ::3] = 0.0
        beta[:, ::2] = 1.0
        beta[:, 1::4] = 0.0
    big_g = np.cumsum(g.reshape(B, TP // C, C, H), axis=2).reshape(B, TP, H)
    return (*(jnp.asarray(x, dtype) for x in (q, k, v)),
            jnp.asarray(big_g, jnp.float32), jnp.asarray(beta, jnp.float32))


def np_prep(q, k, v, big_g, beta):
    """(w, ut, p, gcl, X) in gdn_prep's layouts, float64: X = (I + A)^-1,
    W = X diag(beta exp(G)) K, Ut = X diag(beta) V, P = (Q K^T) * D, G_C = G_{C-1}."""
    n = TP // C

    def heads(x):   # (B, Tp, H, ...) -> (B, H, N, C, ...)
        x = np.moveaxis(np.asarray(x, np.float64), 2, 1)
        return x.reshape(B, H, n, C, *x.shape[3:])
    qc, kc, vc, gc, bc = (heads(x) for x in (q, k, v, big_g, beta))
    x = np.linalg.inv(np.eye(C) + reference.chunk_ut_matrix(k, big_g, beta, C))
    w = x @ (kc * (bc * np.exp(gc))[..., None])
    ut = x @ (vc * bc[..., None])
    dmat = np.tril(np.exp(gc[..., :, None] - gc[..., None, :]))
    p = (qc @ np.swapaxes(kc, -1, -2)) * dmat
    flat = lambda a: a.reshape(B * H, TP, a.shape[-1])  # noqa: E731
    return flat(w), flat(ut), flat(p), gc[..., -1].reshape(B * H, n, 1, 1), flat(x)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
@pytest.mark.parametrize("edges", [False, True])
def test_preparation_matches_float64(dtype, tol, edges):
    args = prep_inputs(3, dtype, edges)
    got = gdn_prep(*args, chunk=C, tuning=DEFAULT_TUNING, with_inverse=True)
    # the reference from the inputs as the kernel sees them (bf16-rounded q, k, v)
    want = np_prep(*(np.asarray(a, np.float32) for a in args))
    names = ["w", "ut", "p", "gcl", "inverse"]
    assert len(got) == 5
    for name, a, b in zip(names, got, want):
        assert a.shape == b.shape, name
        assert rel(a, b) <= tol, (name, rel(a, b))
    assert got[4].dtype == jnp.float32 and got[0].dtype == dtype
    # without the inverse (X then in the input dtype) the outputs are bit for bit the same
    lean = gdn_prep(*args, chunk=C, tuning=DEFAULT_TUNING, with_inverse=False)
    assert len(lean) == 4
    for a, b in zip(lean, got):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_inverse_is_the_float64_inverse():
    q, k, v, big_g, beta = prep_inputs(4, jnp.float32)
    x = np.asarray(gdn_prep(q, k, v, big_g, beta, chunk=C, tuning=DEFAULT_TUNING)[-1],
                   np.float64)
    x = x.reshape(B, H, TP // C, C, C)
    want = np.linalg.inv(np.eye(C) + reference.chunk_ut_matrix(k, big_g, beta, C))
    np.testing.assert_allclose(x, want, atol=1e-5)


def test_diagonal_inverse_agrees_with_float64():
    """The 16 x 16 unit-lower inverse (power series) against NumPy's, on a block with
    entries as large as the preparation's (|beta k.k| <= 1, many rows)."""
    rng = np.random.default_rng(7)
    n = np.tril(rng.uniform(-1.0, 1.0, (tiles.BS, tiles.BS)), -1)
    want = np.linalg.inv(np.eye(tiles.BS) + n)
    got = np.asarray(tiles.unit_lower_inverse(jnp.asarray(n, jnp.float32)), np.float64)
    assert rel(got, want) <= 1e-5


@pytest.mark.parametrize("field,bad", [("solve_precision", "tf32"), ("wu_warps", 0),
                                       ("seq_stages", 2.5), ("block_v", -16)])
def test_bad_tuning_is_refused(field, bad):
    with pytest.raises(ValueError, match=f"Tuning.{field}"):
        Tuning(**{field: bad})


def test_tuning_is_hashable_and_keys_the_trace():
    """A Tuning is a static argument: equal settings hash equal, others differ."""
    assert hash(Tuning()) == hash(DEFAULT_TUNING) and Tuning() == DEFAULT_TUNING
    assert Tuning(wu_warps=4) != DEFAULT_TUNING


@pytest.mark.parametrize("dtype,setting,want", [
    (jnp.bfloat16, "high", "TF32"), (jnp.bfloat16, "highest", "IEEE"),
    (jnp.float32, "high", "IEEE")])
def test_solve_products_lower_to_the_chosen_triton_precision(dtype, setting, want,
                                                             monkeypatch):
    """Tuning.solve_precision: the solve's float32 products lower (Pallas' Triton lowering,
    run on CPU) to TF32 tensor-core dots for bf16 inputs by default, to IEEE float32 dots
    for float32 inputs always and for bf16 ones under "highest". (The preparation's bf16
    dots lower with Triton's default, also recorded as TF32, which bf16 operands ignore.)"""
    from jax._src.pallas.triton import lowering
    seen = []
    real_dot = lowering.tt_dialect.dot

    def recording_dot(*args, input_precision=None, **kwargs):
        seen.append(None if input_precision is None else str(input_precision))
        return real_dot(*args, input_precision=input_precision, **kwargs)

    monkeypatch.setattr(lowering.tt_dialect, "dot", recording_dot)
    monkeypatch.setattr(common, "interpret", lambda: False)
    q = jnp.ones((1, 64, 1, 64), dtype)
    g = jnp.zeros((1, 64, 1), jnp.float32)
    prep = functools.partial(gdn_prep, chunk=64, with_inverse=False,
                             tuning=Tuning(solve_precision=setting))
    jax.jit(prep).trace(q, q, q, g, g).lower(lowering_platforms=("cuda",))
    # the solve: four diagonal power-series inverses (6 products each) and 16 products
    # below the diagonal; the rest are the K K^T blocks and W, Ut, P in the input dtype
    solve = 4 * 6 + 16
    kinds = [s.split(".")[-1].upper() for s in seen]
    ieee = kinds.count("IEEE")
    assert ieee == (len(seen) if dtype == jnp.float32 else solve if want == "IEEE" else 0)
    if want == "TF32":
        assert kinds.count("TF32") >= solve
