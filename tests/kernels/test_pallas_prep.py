"""intra.PREP_KERNELS: the GDN preparation as two or three kernels (intra_split.py)
computes what the one-kernel preparation (intra.py) does, and its inverse X is
(I + A)^-1 against a float64 NumPy reference. Interpret mode on CPU (the kernels are GPU
programs)."""
import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels.pallas import common, intra, intra_split
from kernels.pallas.intra_split import gdn_intra_split
from tests.kernels import reference
from tests.kernels.jaxprs import equations

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


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("kernels", [2, 3])
@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)])
@pytest.mark.parametrize("edges", [False, True])
def test_split_preparation_equals_the_one_kernel(dtype, tol, edges, kernels, monkeypatch):
    args = prep_inputs(3, dtype, edges)
    monkeypatch.setattr(intra, "PREP_KERNELS", 1)
    one = intra.gdn_intra(*args, chunk=C, with_inverse=True)
    split = gdn_intra_split(*args, chunk=C, with_inverse=True, kernels=kernels)
    names = ["w", "ut", "p", "gcl", "inverse"]
    assert len(one) == len(split) == 5
    for name, a, b in zip(names, split, one):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert rel(a, b) <= tol, (name, rel(a, b))
    # without the inverse (X then in the input dtype) the outputs are bit for bit the same
    lean = gdn_intra_split(*args, chunk=C, with_inverse=False, kernels=kernels)
    assert len(lean) == 4
    for a, b in zip(lean, split):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("diag", intra.DIAG_INVERSE_CHOICES)
@pytest.mark.parametrize("kernels", [2, 3])
def test_split_inverse_is_the_float64_inverse(kernels, diag, monkeypatch):
    monkeypatch.setattr(intra, "DIAG_INVERSE", diag)
    q, k, v, big_g, beta = prep_inputs(4, jnp.float32)
    x = np.asarray(gdn_intra_split(q, k, v, big_g, beta, chunk=C, kernels=kernels)[-1],
                   np.float64)
    x = x.reshape(B, H, TP // C, C, C)
    want = np.linalg.inv(np.eye(C) + reference.chunk_ut_matrix(k, big_g, beta, C))
    np.testing.assert_allclose(x, want, atol=1e-5)


def prep_kernel_names(*args):
    """The Pallas calls of gdn_intra, traced afresh (a new function: no trace cache)."""
    def prep(*a):
        return intra.gdn_intra(*a, chunk=C, with_inverse=False)
    eqns = equations(jax.make_jaxpr(prep)(*args).jaxpr)
    return sorted(str(e.params.get("name")) for e in eqns if e.primitive.name == "pallas_call")


def test_switch_routes_gdn_intra(monkeypatch):
    args = prep_inputs(5, jnp.float32)
    monkeypatch.setattr(intra, "PREP_KERNELS", 1)
    assert prep_kernel_names(*args) == ["gdn_chunk_prep"]
    monkeypatch.setattr(intra, "PREP_KERNELS", 2)
    assert prep_kernel_names(*args) == ["gdn_chunk_prep_kkt_solve", "gdn_chunk_prep_wu"]
    monkeypatch.setattr(intra, "PREP_KERNELS", 3)
    assert prep_kernel_names(*args) == ["gdn_chunk_prep_kkt", "gdn_chunk_prep_solve",
                                        "gdn_chunk_prep_wu"]
    monkeypatch.setattr(intra, "PREP_KERNELS", 4)
    with pytest.raises(ValueError, match="PREP_KERNELS"):
        prep_kernel_names(*args)


def test_diagonal_inverses_agree_with_float64():
    """Both 16 x 16 unit-lower inverses (intra.DIAG_INVERSE) against NumPy's, on a block
    with entries as large as the preparation's (|beta k.k| <= 1, many rows)."""
    rng = np.random.default_rng(7)
    n = np.tril(rng.uniform(-1.0, 1.0, (intra.BS, intra.BS)), -1)
    want = np.linalg.inv(np.eye(intra.BS) + n)
    for fn in (intra._unit_lower_inverse, intra._unit_lower_inverse_rows):
        got = np.asarray(fn(jnp.asarray(n, jnp.float32)), np.float64)
        assert rel(got, want) <= 1e-5, (fn.__name__, rel(got, want))


@pytest.mark.parametrize("attr,bad", [("DIAG_INVERSE", "cholesky"),
                                      ("SOLVE_PRECISION", "tf32")])
def test_bad_solve_switch_is_refused(attr, bad, monkeypatch):
    monkeypatch.setattr(intra, attr, bad)
    with pytest.raises(ValueError, match=f"intra.{attr} .env KERNELS_PALLAS_{attr}. is"):
        gdn_intra_split(*prep_inputs(6, jnp.bfloat16), chunk=C)


@pytest.mark.parametrize("dtype,setting,want", [
    (jnp.bfloat16, "high", "TF32"), (jnp.bfloat16, "highest", "IEEE"),
    (jnp.float32, "high", "IEEE")])
def test_solve_products_lower_to_the_chosen_triton_precision(dtype, setting, want,
                                                             monkeypatch):
    """intra.SOLVE_PRECISION: the solve's float32 products lower (Pallas' Triton lowering,
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
    monkeypatch.setattr(intra, "SOLVE_PRECISION", setting)
    monkeypatch.setattr(intra, "DIAG_INVERSE", "power")
    q = jnp.ones((1, 64, 1, 64), dtype)
    g = jnp.zeros((1, 64, 1), jnp.float32)

    def solve_only(a):  # the solve kernel alone: every dot in it is a solve product
        spec = common.chunk_specs(1, 64)
        return pl.pallas_call(
            functools.partial(intra_split._solve_kernel, chunk=64, dtype=dtype),
            grid=(1, 1, 1), in_specs=[spec.rows(64)], out_specs=spec.rows(64),
            out_shape=jax.ShapeDtypeStruct((1, 64, 64), jnp.float32),
            compiler_params=common.compiler_params("gpu", num_warps=1, num_stages=1))(a)

    a = jnp.zeros((1, 64, 64), jnp.float32)
    jax.jit(solve_only).trace(a).lower(lowering_platforms=("cuda",))
    # four diagonal power-series inverses (6 products each) and 16 below the diagonal
    assert len(seen) == 4 * 6 + 16
    assert {s.split(".")[-1].upper() for s in seen} == {want}, seen
    # and in the whole three-kernel preparation the solve's are its only IEEE dots for
    # bf16 inputs (its bf16 dots lower with Triton's default, TF32, which bf16 ignores)
    seen.clear()
    jax.jit(lambda *x: gdn_intra_split(*x, chunk=64, with_inverse=False)).trace(
        q, q, q, g, g).lower(lowering_platforms=("cuda",))
    ieee = sum(s.split(".")[-1].upper() == "IEEE" for s in seen)
    assert ieee == (len(seen) if dtype == jnp.float32 else 40 if want == "IEEE" else 0)
