"""The recurrence's forward on the GPU (Triton), in two forms.

Without a gradient, one sequential kernel per (batch, head, value block) walks the chunks
in a fori_loop with the float32 state in registers: O = Qg S + P U and
S' = e^G_C S + Kd^T U, four matmuls a chunk.

Under a gradient (the custom VJP's forward), two calls: a sequential state pass that
writes each chunk-start state and U = Ut - W S (two matmuls a chunk on the loop's critical
path, one for linear attention, where U = V), then an output pass parallel over
(batch, head, chunk), O = Qg S + P U. The backward needs the chunk-start states anyway
and reads U instead of recomputing it, so under a gradient the split costs nothing extra
and shortens the sequential loop; without one, writing the states is pure cost and the
one loop is faster.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.pallas import common, tiles
from kernels.pallas.plan import Config, dims, sequential_params


def walk(s0_ref, bounds_ref, st_ref, step, carry, *, num_chunks, pieces):
    """The sequential loop of one program: step(n, s) handles chunk n, writing its
    outputs, and returns the next state; carry(n, s) only returns it. One piece: every
    chunk from the initial state. Several (packed documents): this program's piece from
    a zero state (the initial state where it starts at chunk 0), the piece's first chunk
    carried without writes (the piece before writes it) but in the first piece; the
    final state stored by the piece that writes the last chunk."""
    if pieces == 1:
        st_ref[...] = lax.fori_loop(0, num_chunks, step, s0_ref[...])
        return
    lo, first, hi = common.piece_walk(bounds_ref, pieces)
    s0 = s0_ref[...]
    s = lax.fori_loop(lo, first, carry, jnp.where(lo == 0, s0, jnp.zeros_like(s0)))
    s = lax.fori_loop(first, hi + 1, step, s)

    @pl.when((hi == num_chunks - 1) & (first <= hi))
    def _store_final():
        st_ref[...] = s


def _loop_kernel(*refs, has_w, has_g, has_key, chunk, num_chunks, pieces):
    (w_ref, ut_ref, q_ref, k_ref, p_ref, gcl_ref, g_ref, key_ref), rest = tiles.split_refs(
        refs, has_w, has_g, has_key)
    s0_ref = rest.pop(0)
    bounds_ref = rest.pop(0) if pieces > 1 else None
    o_ref, st_ref = rest
    prec = common.dot_precision(ut_ref.dtype)

    def weights(rows):
        gam = g_ref[rows][:, None] if has_g else None
        gkey = key_ref[rows][:, None] if has_key else None
        return w_ref[rows, :] if has_w else None, gam, gkey

    def body(n, s):
        rows = pl.ds(n * chunk, chunk)
        w, gam, gkey = weights(rows)
        o, s = tiles.fwd_chunk(s, w, ut_ref[rows, :], q_ref[rows, :], k_ref[rows, :],
                               p_ref[rows, :], gcl_ref[n], gam, gkey)
        o_ref[rows, :] = o.astype(o_ref.dtype)
        return s

    def carry(n, s):
        rows = pl.ds(n * chunk, chunk)
        w, gam, gkey = weights(rows)
        return tiles.state_step(s, ut_ref[rows, :], w, k_ref[rows, :], gam, gcl_ref[n],
                                prec, gkey)[2]

    walk(s0_ref, bounds_ref, st_ref, body, carry, num_chunks=num_chunks, pieces=pieces)


def forward(w, ut, q, k, p, gcl, gam, gkey, s0, bounds, cfg: Config):
    """(O (B, Tp, H, V) in cfg.out_dtype, final state (BH, K, V) float32) by one
    sequential kernel; arguments as recurrence.chunk_recurrence."""
    c, bv = cfg.chunk, cfg.block_v
    b, tp, h, kdim, vdim, n, has_w, has_g = dims(w, ut, q, gam, c)
    has_key = gkey is not None
    spec = common.sequence_specs(h, tp, n)
    args = ([w] if has_w else []) + [ut, q, k, p, gcl] + ([gam] if has_g else []) + (
        [gkey] if has_key else []) + [s0]
    grid, bounds_specs, bounds_args = common.sequential_grid(b, h, vdim // bv, bounds, cfg.pieces)
    return pl.pallas_call(
        functools.partial(_loop_kernel, has_w=has_w, has_g=has_g, has_key=has_key, chunk=c,
                          num_chunks=n, pieces=cfg.pieces),
        grid=grid,
        in_specs=(common.recurrence_in_specs(spec, has_w, has_g, kdim, bv, c,
                                             has_key=has_key)
                  + [spec.state(kdim, bv)] + bounds_specs),
        out_specs=[spec.token_block(bv), spec.state(kdim, bv)],
        out_shape=[jax.ShapeDtypeStruct((b, tp, h, vdim), jnp.dtype(cfg.out_dtype)),
                   jax.ShapeDtypeStruct((b * h, kdim, vdim), jnp.float32)],
        interpret=common.interpret(),
        compiler_params=sequential_params(kdim, bv, cfg.tuning),
        name="linear_chunk_fwd")(*args, *bounds_args)


def _state_kernel(*refs, has_w, has_g, has_key, chunk, num_chunks, pieces):
    """State pass (sequential): h[n] = S, U = Ut - W S, S' = e^G_C S + Kd^T U."""
    refs = list(refs)
    w_ref = refs.pop(0) if has_w else None
    ut_ref, k_ref, gcl_ref = refs[:3]
    refs = refs[3:]
    g_ref = refs.pop(0) if has_g else None
    key_ref = refs.pop(0) if has_key else None
    s0_ref = refs.pop(0)
    bounds_ref = refs.pop(0) if pieces > 1 else None
    st_ref, h_ref, *rest = refs
    u_ref = rest[0] if has_w else None
    prec = common.dot_precision(ut_ref.dtype)

    def step(n, s):
        rows = pl.ds(n * chunk, chunk)
        gam = g_ref[rows][:, None] if has_g else None
        gkey = key_ref[rows][:, None] if has_key else None
        return rows, tiles.state_step(s, ut_ref[rows, :],
                                      w_ref[rows, :] if has_w else None, k_ref[rows, :],
                                      gam, gcl_ref[n], prec, gkey)

    def body(n, s):
        rows, (sc, uc, s) = step(n, s)
        h_ref[n] = sc
        if has_w:
            u_ref[rows, :] = uc
        return s

    walk(s0_ref, bounds_ref, st_ref, body, lambda n, s: step(n, s)[1][2],
         num_chunks=num_chunks, pieces=pieces)


def _output_kernel(*refs, has_g, block_cols):
    """Output pass: one program per (batch, head, chunk), O = Qg S + P U."""
    refs = list(refs)
    q_ref, p_ref = refs[:2]
    refs = refs[2:]
    g_ref = refs.pop(0) if has_g else None
    h_ref, u_ref, o_ref = refs
    prec = common.dot_precision(u_ref.dtype)
    gam = g_ref[...][:, None] if has_g else None
    qg = tiles.q_decayed(q_ref[...], gam)
    p = p_ref[...]
    for j in range(u_ref.shape[-1] // block_cols):   # static: value columns in blocks
        cols = pl.ds(j * block_cols, block_cols)
        o = (tiles.mm(qg, h_ref[:, cols], precision=prec)
             + tiles.mm(p, u_ref[:, cols], precision=prec))
        o_ref[:, cols] = o.astype(o_ref.dtype)


def forward_saving(w, ut, q, k, p, gcl, gam, gkey, s0, bounds, cfg: Config):
    """forward's (O, final state) and what the backward reads: the chunk-start states
    (BH, N, K, V) in the input dtype and U = Ut - W S (BH, Tp, V), or None for linear
    attention (U = Ut); by a state pass and an output pass."""
    c, bv = cfg.chunk, cfg.block_v
    b, tp, nh, kdim, vdim, n, has_w, has_g = dims(w, ut, q, gam, c)
    has_key = gkey is not None
    dt = ut.dtype
    seq = common.sequence_specs(nh, tp, n)
    out_specs = [seq.state(kdim, bv), seq.states(kdim, bv)]
    out_shape = [jax.ShapeDtypeStruct((b * nh, kdim, vdim), jnp.float32),
                 jax.ShapeDtypeStruct((b * nh, n, kdim, vdim), dt)]
    if has_w:
        out_specs.append(seq.rows_block(bv))
        out_shape.append(jax.ShapeDtypeStruct((b * nh, tp, vdim), dt))
    args = ([w] if has_w else []) + [ut, k, gcl] + ([gam] if has_g else []) + (
        [gkey] if has_key else []) + [s0]
    grid, bounds_specs, bounds_args = common.sequential_grid(b, nh, vdim // bv, bounds, cfg.pieces)
    st, h, *rest = pl.pallas_call(
        functools.partial(_state_kernel, has_w=has_w, has_g=has_g, has_key=has_key,
                          chunk=c, num_chunks=n, pieces=cfg.pieces),
        grid=grid,
        in_specs=common.recurrence_in_specs(seq, has_w, has_g, kdim, bv, c, with_qp=False,
                                            has_key=has_key)
        + [seq.state(kdim, bv)] + bounds_specs,
        out_specs=out_specs, out_shape=out_shape, interpret=common.interpret(),
        compiler_params=sequential_params(kdim, bv, cfg.tuning),
        name="linear_chunk_fwd_states")(*args, *bounds_args)
    u = rest[0] if has_w else ut

    spec = common.chunk_specs(nh, c)
    in_specs = ([spec.token(kdim), spec.rows(c)] + ([spec.per_token] if has_g else [])
                + [spec.state(kdim, vdim), spec.rows(vdim)])
    o = pl.pallas_call(
        functools.partial(_output_kernel, has_g=has_g, block_cols=min(vdim, 64)),
        grid=(b, nh, n), in_specs=in_specs, out_specs=spec.token(vdim),
        out_shape=jax.ShapeDtypeStruct((b, tp, nh, vdim), jnp.dtype(cfg.out_dtype)),
        interpret=common.interpret(),
        compiler_params=common.compiler_params("gpu", num_warps=cfg.tuning.output_warps,
                                               num_stages=1),
        name="linear_chunk_fwd_output")(q, p, *([gam] if has_g else []), h, u)
    return o, st, h, rest[0] if has_w else None
