"""kernels.chunk's short-sequence paths against the general ones and float64 NumPy:
the recursive explicit inverse of the UT transform (and its VJP), segsum's shifted-add
sums with non-finite log-decays and their gradient, the backward pass without
jax.checkpoint, and a single chunk run with no chunk axis and no scan.
"""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from kernels import chunk
from kernels.common import run_ids, segsum
from tests.kernels.jaxprs import equations

B, H, F, DV = 2, 2, 6, 5


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def strictly_lower(rng, c, lead=(B, H)):
    """A strictly lower a as the delta rule builds it: beta_t * decay * k_t.k_s."""
    k = rng.standard_normal(lead + (c, F))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    beta = rng.uniform(0.05, 1.0, lead + (c, 1))
    decay = np.exp(-np.abs(np.arange(c)[:, None] - np.arange(c)[None, :]) * 0.05)
    return np.tril(beta * decay * (k @ np.swapaxes(k, -1, -2)), -1)


@pytest.mark.parametrize("base", [1, 4, chunk.BASE_BLOCK])
@pytest.mark.parametrize("c", [1, 2, 5, 16, 37, 64, 100])
def test_unit_lower_inverse_is_numpys(c, base):
    """From base x base diagonal blocks inverted elementwise; base 1 is the plain
    recursive halving."""
    a = strictly_lower(np.random.default_rng(c), c)
    want = np.linalg.inv(np.eye(c) + a)
    # jitted as the chunk forms run it: one program, not each level's ops one by one
    inverse = jax.jit(chunk._unit_lower_inverse, static_argnums=1)
    got = inverse(jnp.asarray(a, jnp.float32), base)
    assert rel(got, want) < 1e-5
    with jax.enable_x64(True):
        got64 = inverse(jnp.asarray(a, jnp.float64), base)
        assert got64.dtype == jnp.float64
        assert rel(got64, want) < 1e-12


@pytest.mark.parametrize("c,m", [(1, 1), (4, 1), (4, 2), (8, 4), (64, 2), (64, 32),
                                 (64, 64)])
def test_diagonal_blocks_are_numpys(c, m):
    x = np.random.default_rng(c + m).standard_normal((3, c, c))
    want = np.stack([x[:, b * m:(b + 1) * m, b * m:(b + 1) * m] for b in range(c // m)], 1)
    got = chunk._diagonal_blocks(jnp.asarray(x, jnp.float32), m)
    np.testing.assert_array_equal(np.asarray(got), want.astype(np.float32))


@pytest.mark.parametrize("c,f", [(16, 1), (32, 2), (64, 2), (64, 4)])
def test_unit_lower_inverse_with_nearly_parallel_keys(c, f):
    """Keys in 1-4 dimensions with beta near 1 make (I + a)^-1's entries large and mixed
    in sign; there the power series (I - a)(I + a^2)(I + a^4)... loses up to 1e-2 in
    float32, while row-by-row substitution and the recursive inverse stay near 1e-7."""
    rng = np.random.default_rng(c + f)
    k = rng.standard_normal((B, H, c, f))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    a = np.tril(0.999 * (k @ np.swapaxes(k, -1, -2)), -1)
    want = np.linalg.inv(np.eye(c) + a)
    a32 = jnp.asarray(a, jnp.float32)
    err = np.abs(np.asarray(chunk._unit_lower_inverse(a32), np.float64) - want).max()
    eye = jnp.broadcast_to(jnp.eye(c, dtype=jnp.float32), a32.shape)
    by_rows = np.asarray(chunk._solve_by_substitution(a32, eye), np.float64)
    assert err <= 2 * np.abs(by_rows - want).max() + 1e-7
    assert err / np.abs(want).max() < 1e-6


@pytest.mark.parametrize("c", [7, 37, 64])
def test_solve_by_inverse_and_its_vjp_equal_the_substitution(c):
    """Both solves of (I + a) x = rhs against NumPy; the inverse's VJP (d_rhs = T^T dx,
    no solve) against the row-by-row one and against float64 finite structure."""
    rng = np.random.default_rng(c)
    a = strictly_lower(rng, c)
    rhs = rng.standard_normal((B, H, c, 2 * DV))
    ct = rng.standard_normal((B, H, c, 2 * DV))
    want = np.linalg.solve(np.eye(c) + a, rhs)
    a32, rhs32 = jnp.asarray(a, jnp.float32), jnp.asarray(rhs, jnp.float32)

    def grads(solve):
        return jax.jit(jax.grad(lambda a, r: jnp.sum(solve(a, r) * ct), argnums=(0, 1)))(
            a32, rhs32)

    by_inverse = chunk._solve_by_inverse
    assert rel(by_inverse(a32, rhs32), want) < 1e-5
    assert rel(chunk._solve_by_substitution(a32, rhs32), want) < 1e-5
    # d_rhs = (I + a)^-T ct, d_a = -strict_lower(d_rhs x^T), in float64
    d_rhs = np.linalg.solve(np.swapaxes(np.eye(c) + a, -1, -2), ct)
    d_a = np.tril(-d_rhs @ np.swapaxes(want, -1, -2), -1)
    for got in (grads(by_inverse), grads(chunk._solve_by_substitution)):
        assert rel(got[0], d_a) < 1e-5 and rel(got[1], d_rhs) < 1e-5
        assert np.all(np.asarray(got[0])[..., np.triu_indices(c)[0], np.triu_indices(c)[1]]
                      == 0)


def test_solve_unit_lower_takes_the_substitution_past_the_inverse_limit():
    rng = np.random.default_rng(5)
    a = jnp.asarray(strictly_lower(rng, 20), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((B, H, 20, 3)), jnp.float32)

    def prims(limit):
        jaxpr = jax.make_jaxpr(lambda a, r: chunk._solve_unit_lower(a, r, limit))(a, rhs)
        return {e.primitive.name for e in equations(jaxpr.jaxpr)}
    assert not prims(64) & {"scan", "while"}    # the inverse: no loop
    assert prims(16) & {"scan", "while"}        # row by row
    np.testing.assert_allclose(chunk._solve_unit_lower(a, rhs, 64),
                               chunk._solve_unit_lower(a, rhs, 16), rtol=1e-5, atol=1e-5)


def np_segsum(g):
    """Direct float64 sums over (s, t], -inf and NaN propagating as in a plain sum."""
    g = np.asarray(g, np.float64)
    c = g.shape[-1]
    out = np.zeros(g.shape + (c,))
    for t in range(c):
        for s in range(t):
            out[..., t, s] = g[..., s + 1:t + 1].sum(-1)
    return out


def test_segsum_is_the_direct_sum_with_hard_resets():
    rng = np.random.default_rng(0)
    g = -rng.uniform(0.0, 3.0, (B, H, 37))
    g[0, 0, 5] = -np.inf
    g[0, 0, 20] = -np.inf
    g[1, 1, 0] = -np.inf                 # on the first position (never inside a span)
    g[1, 0, 36] = -np.inf                # the last
    g[0, 1, 3] = -1e4                    # very negative but finite: others stay accurate
    got = np.asarray(segsum(jnp.asarray(g, jnp.float32)), np.float64)
    want = np_segsum(g)
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=1e-4)
    # exp(L) near the diagonal after a -1e4 term: as accurate as the small sums
    np.testing.assert_allclose(np.exp(got[0, 1, 10:, 5:9]), np.exp(want[0, 1, 10:, 5:9]),
                               rtol=1e-5)
    # no NaN in the gradient of exp(L) through the reset (masked pairs give 0)
    dg = jax.grad(lambda x: jnp.sum(jnp.exp(segsum(x))))(jnp.asarray(g, jnp.float32))
    assert np.all(np.isfinite(dg))
    with jax.enable_x64(True):
        got64 = np.asarray(segsum(jnp.asarray(g, jnp.float64)))
        np.testing.assert_allclose(got64[fin], want[fin], rtol=1e-12, atol=1e-9)


def test_segsum_gradient_is_the_sum_over_spans_holding_each_term():
    # d/dg_r of sum(W * L) = sum of W[t, s] over the spans (s, t] holding r: s < r <= t.
    rng = np.random.default_rng(1)
    g = -rng.uniform(0.0, 2.0, (B, H, 37))
    w = rng.standard_normal(g.shape + (37,))
    got = jax.grad(lambda x: jnp.sum(jnp.asarray(w, jnp.float32) * segsum(x)))(
        jnp.asarray(g, jnp.float32))
    t, s = np.indices((37, 37))
    want = np.stack([np.where((s < r) & (r <= t), w, 0.0).sum((-1, -2))
                     for r in range(37)], axis=-1)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-4)


def test_segsum_propagates_nan_only_to_spans_holding_it():
    g = -np.linspace(0.1, 1.0, 9)
    g[4] = np.nan
    got = np.asarray(segsum(jnp.asarray(g, jnp.float32)))
    t, s = np.tril_indices(9, -1)
    spans = (s < 4) & (4 <= t)
    assert np.all(np.isnan(got[t[spans], s[spans]]))
    assert np.all(np.isfinite(got[t[~spans], s[~spans]]))


def inputs(t, seed, *, reset=True):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, B, H, t, F))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((B, H, t, DV))
    g = -rng.uniform(0.0, 0.7, (B, H, t))
    if reset:
        g[0, 1, t // 3] = -np.inf        # a hard reset inside a chunk
    beta = rng.uniform(0.05, 1.0, (B, H, t))
    s0 = rng.standard_normal((B, H, F, DV))
    seg = np.ones((B, t), np.int32)
    seg[0, t // 4:] = 2                  # packed documents
    seg[0, t // 2:] = 3
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return (f32(q), f32(k), f32(v), f32(g), f32(beta)), run_ids(jnp.asarray(seg), B, t), f32(s0)


def outputs_and_grads(form, arrays, run, s0, chunk_size, remat):
    rng = np.random.default_rng(1)
    co = jnp.asarray(rng.standard_normal(arrays[0].shape[:3] + (DV,)), jnp.float32)
    cs = jnp.asarray(rng.standard_normal(s0.shape), jnp.float32)

    def loss(*xs):
        o, s = form(*xs[:-1], run, xs[-1], chunk_size, remat=remat)
        return jnp.sum(o * co) + jnp.sum(s * cs), (o, s)
    (_, (o, s)), g = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(arrays) + 1)),
                                                has_aux=True))(*arrays, s0)
    return [o, s, *g]


@pytest.mark.parametrize("op", ["gdr", "la"])
@pytest.mark.parametrize("t,cs", [(37, 64), (64, 64), (37, 16), (45, 8)])
def test_no_checkpoint_equals_the_checkpointed_form(op, t, cs):
    """remat=False (the default up to chunk.REMAT_TOKENS tokens) against remat=True:
    outputs, final state and every gradient (initial state included), with packed
    documents, a hard reset, chunks that do not divide T, and a single chunk."""
    arrays, run, s0 = inputs(t, seed=t + cs)
    if op == "gdr":
        form = chunk.gated_delta_chunk
    else:
        form, arrays = chunk.linear_attention_chunk, arrays[:4]
    plain = outputs_and_grads(form, arrays, run, s0, cs, remat=False)
    remat = outputs_and_grads(form, arrays, run, s0, cs, remat=True)
    for a, b in zip(plain, remat):
        assert np.all(np.isfinite(np.asarray(a)))
        assert rel(a, b) < 1e-5


def prims_of(form, t, cs, remat):
    """Names of the primitives of the forward trace, one entry per equation."""
    arrays, run, s0 = inputs(t, seed=0)
    if form is chunk.linear_attention_chunk:
        arrays = arrays[:4]
    jaxpr = jax.make_jaxpr(lambda *xs: form(*xs, run, s0, cs, remat=remat))(*arrays)
    return [e.primitive.name for e in equations(jaxpr.jaxpr)]


@pytest.mark.parametrize("form", [chunk.gated_delta_chunk, chunk.linear_attention_chunk])
def test_remat_by_size(form, monkeypatch):
    """Up to REMAT_TOKENS tokens no phase runs under jax.checkpoint (remat2) and a single
    chunk has no scan; several chunks scan (a checkpointed step); past REMAT_TOKENS, or
    with remat=True, both phases are checkpointed as well."""
    assert chunk.REMAT_TOKENS >= 64
    one = prims_of(form, 64, 64, None)
    assert "remat2" not in one and "scan" not in one
    several = prims_of(form, 40, 16, None)
    assert several.count("scan") == 1 and several.count("remat2") == 1
    assert prims_of(form, 40, 16, True).count("remat2") == 3
    assert prims_of(form, 64, 64, True).count("remat2") == 2
    monkeypatch.setattr(chunk, "REMAT_TOKENS", 32)
    assert prims_of(form, 40, 16, None).count("remat2") == 3


@pytest.mark.parametrize("op", ["gdr", "la"])
@pytest.mark.parametrize("t,cs", [(37, 64), (64, 64), (45, 8)])
def test_no_initial_state_equals_zeros(op, t, cs):
    """state=None (the zero state known statically: a single chunk drops the state's
    terms, the delta rule its W) against an explicit zero state: outputs, final state and
    the inputs' gradients, one chunk and several, packed documents and a hard reset."""
    arrays, run, s0 = inputs(t, seed=3 * t + cs)
    if op == "gdr":
        form = chunk.gated_delta_chunk
    else:
        form, arrays = chunk.linear_attention_chunk, arrays[:4]
    co = jnp.asarray(np.random.default_rng(t).standard_normal((B, H, t, DV)), jnp.float32)
    cs_ = jnp.asarray(np.random.default_rng(cs).standard_normal(s0.shape), jnp.float32)

    def run_with(state):
        def loss(*xs):
            o, s = form(*xs, run, state, cs)
            return jnp.sum(o * co) + jnp.sum(s * cs_), (o, s)
        (_, (o, s)), g = jax.jit(jax.value_and_grad(
            loss, argnums=tuple(range(len(arrays))), has_aux=True))(*arrays)
        return [o, s, *g]

    for a, b in zip(run_with(None), run_with(jnp.zeros_like(s0))):
        assert rel(a, b) < 1e-6
