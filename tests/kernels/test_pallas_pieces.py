"""Packed documents with the sequential GPU kernels split into pieces
(kernels.pallas.documents.piece_bounds): outputs, final states and gradients of every
input equal the float64 references and the unsplit kernels, for pieces of 1, 2 and 3
chunks, so piece bounds fall at document starts inside chunks, at chunk starts, inside a
document spanning several pieces, and in a row that is one document (every piece but
the last then walks one chunk). The "gpu" program in interpret mode on CPU."""
import dataclasses
import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import kernels.pallas as kp
from kernels.pallas import common, documents
from tests.kernels import reference, test_pallas
from tests.kernels.test_pallas_segments import (check_gdn_against_float64, grads64,
                                                 rel, starts_of)

C = 16
B, T, H, K, V = 3, 150, 2, 16, 16      # 10 chunks, the last one padded
PIECE_CHUNKS = (1, 2, 3)
NATIVE_GPU = jax.default_backend() in ("cpu", "gpu")
pytestmark = pytest.mark.skipif(not NATIVE_GPU, reason="the piece split is the GPU's")


def segment_ids():
    # row 0: documents of 1-40 tokens, starts at chunk starts (16, 48) and inside chunks;
    # row 1: a document over chunks 1-7 (pieces of 1-3 chunks all start inside it);
    # row 2: one document
    lengths = [7, 9, 20, 12, 1, 15, 40, 3, 43]
    row0 = np.repeat(np.arange(len(lengths)), lengths)
    row1 = np.array([4] * 20 + [5] * 100 + [6] * 30)
    row2 = np.full(T, 2)
    return np.stack([row0, row1, row2]).astype(np.int32)


def tuning(piece_chunks):
    return dataclasses.replace(kp.DEFAULT_TUNING, piece_chunks=piece_chunks)


def test_piece_bounds_are_document_start_chunks():
    seg = segment_ids()
    runs, _ = documents.chunk_runs(seg, B, T, 160, C)
    bounds = np.asarray(documents.piece_bounds(runs, C, 4, 3))
    # pieces start at tokens 48, 96, 144: row 0's documents holding them start at
    # 48 (chunk 3), 64 (chunk 4; the 40-token one is 64..103) and 107 (chunk 6)
    assert bounds.shape == (B, 8)
    assert bounds[0].tolist() == [0, 3, 4, 6, 9, 9, 9, 9]
    assert bounds[1].tolist() == [0, 1, 1, 7, 9, 9, 9, 9]
    assert bounds[2].tolist() == [0, 0, 0, 0, 9, 9, 9, 9]


@pytest.mark.parametrize("piece_chunks", PIECE_CHUNKS)
def test_gdn_pieces_match_float64(piece_chunks):
    seg = segment_ids()
    check_gdn_against_float64(seg, test_pallas.gdn_inputs(11, B, T, H, K, V), dict(
        segment_ids=seg, chunk_size=C, variant="gpu", tuning=tuning(piece_chunks)),
        seed=12)


@pytest.mark.parametrize("piece_chunks", PIECE_CHUNKS)
def test_linear_pieces_match_float64(piece_chunks):
    seg = segment_ids()
    q, k, v, ld, g, s0, z0 = test_pallas.linear_inputs(13, T, "tokens", True, B, H, K, V)
    kw = dict(normalize=True, eps=1e-6, segment_ids=seg, chunk_size=C, variant="gpu",
              tuning=tuning(piece_chunks))
    o, (st, z) = jax.jit(functools.partial(kp.linear_attention, return_state=True, **kw))(
        q, k, v, log_decay=ld, initial_state=(s0, z0))
    ro, rs, rz = reference.linear_attention(q, k, v, normalize=True, eps=1e-6,
                                            log_decay=ld, segment_ids=seg,
                                            initial_state=(s0, z0))
    assert rel(o, ro) <= 1e-5 and rel(st, rs) <= 1e-5 and rel(z, rz) <= 1e-5

    co, cs = (np.random.default_rng(14).standard_normal(x.shape) for x in (ro, rs))

    def loss(outs, dtype):
        out, s = outs
        return jnp.sum(out * co.astype(dtype)) + jnp.sum(s * cs.astype(dtype))

    def mine(q, k, v, g, s0):
        out, (s, _) = kp.linear_attention(q, k, v, log_decay=g, initial_state=(s0, z0),
                                          return_state=True, **kw)
        return out, s

    got = jax.jit(jax.grad(lambda *a: loss(mine(*a), np.float32),
                           argnums=tuple(range(5))))(q, k, v, g, s0)

    def ref_fn(q, k, v, gg, s0):
        z = jnp.asarray(z0, s0.dtype)
        out, s, _ = test_pallas.jax_linear64(q, k, v, gg, s0, z, True, 1e-6, starts_of(seg))
        return out, s
    ref = grads64(loss, ref_fn, (q, k, v, g, s0))
    for name, a, r in zip(["dq", "dk", "dv", "dlog_decay", "ds0"], got, ref):
        assert rel(a, r) <= 1e-5, (name, rel(a, r))


def test_pieces_equal_the_unsplit_kernels():
    """Split and unsplit GPU programs agree to float32 rounding, forward and backward,
    without a gradient (the one-loop forward) and under one (state + output passes)."""
    seg = segment_ids()
    q, k, v, g, beta, s0 = test_pallas.gdn_inputs(15, B, T, H, K, V)

    def run(piece_chunks):
        kw = dict(segment_ids=seg, chunk_size=C, variant="gpu", initial_state=s0,
                  return_state=True, tuning=tuning(piece_chunks))
        fwd = kp.gated_delta_rule(q, k, v, g, beta, **kw)
        grads = jax.grad(lambda *a: sum(jnp.sum(x ** 2) for x in kp.gated_delta_rule(
            *a, **kw)), argnums=(0, 1, 2, 3, 4))(q, k, v, g, beta)
        return [*fwd, *grads]

    for a, b in zip(run(2), run(0)):
        assert rel(a, b) <= 1e-6


@pytest.mark.parametrize("op", ["gdn", "linear"])
def test_split_programs_lower_to_triton(op, monkeypatch):
    """The split kernels (dynamic loop bounds read from the piece bounds, stores under
    pl.when) pass Pallas' Triton lowering, forward and gradient (see
    tests/kernels/test_pallas_gpu_lowering.py for why this is checked on CPU)."""
    monkeypatch.setattr(common, "interpret", lambda: False)
    b, t, h, d = 1, 256, 2, 64
    seg = jnp.asarray(np.repeat(np.arange(4), 64)[None], jnp.int32)
    kw = dict(segment_ids=seg, chunk_size=64, variant="gpu", tuning=tuning(1))

    def fn(q, k, v, g, beta):
        if op == "gdn":
            return kp.gated_delta_rule(q, k, v, g, beta, **kw)
        return kp.linear_attention(q, k, v, normalize=False, log_decay=g, **kw)

    x = jax.random.normal(jax.random.PRNGKey(0), (b, t, h, d), jnp.bfloat16)
    g = jnp.full((b, t, h), -0.01, jnp.float32)
    beta = jnp.full((b, t, h), 0.5, jnp.float32)
    grad = jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32)), argnums=(0, 1, 2))
    for f in (fn, grad):
        text = jax.jit(f).trace(x, x, x, g, beta).lower(
            lowering_platforms=("cuda",)).as_text()
        assert "linear_chunk" in text


def test_rows_split_only_where_the_grid_is_short():
    """The split pays where full-width value blocks leave the grid short of
    seq_programs programs (each piece walks one chunk more than it writes): measured on
    the H200 (docs/benchmarks.md, session 10) it took B1 T32768 H16 D128 from 1.50 to
    0.83 ms, and B4 T8192 (64 rows x 2 value blocks, a full grid) 6% slower backward."""
    from kernels.pallas import plan
    d = kp.DEFAULT_TUNING
    assert plan.pieces(512, "gpu", True, 16, 128, 128, d) == 32       # 1 x 32768, 16 heads
    assert plan.pieces(128, "gpu", True, 32, 128, 128, d) == 8        # 2 x 8192
    assert plan.pieces(128, "gpu", True, 64, 128, 128, d) == 1        # 4 x 8192: full
    assert plan.pieces(512, "gpu", False, 16, 128, 128, d) == 1       # one document a row
    assert plan.pieces(512, "tpu", True, 16, 128, 128, d) == 1
    assert plan.pieces(512, "gpu", True, 16, 128, 128, tuning(0)) == 1
