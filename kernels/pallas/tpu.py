"""The recurrence on the TPU (Mosaic): forward and backward, each one Pallas call on the
grid (batch*head, chunks), the chunk axis "arbitrary" (sequential) and the float32 state
in a VMEM scratch buffer between grid steps; the whole value dim per program. Block
shapes must match the arrays' last two dims there, so q, k go chunk-major and G as
(B*H, N, C, 1) columns. The backward visits the chunks last to first and leaves the
decay chain to elementwise XLA (chain_decay)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels.pallas import common, tiles
from kernels.pallas.plan import Config, dims


def _columns(x, chunk):
    """A (B, Tp, H) per-token array as (B*H, N, C, 1) columns (None stays None)."""
    if x is None:
        return None
    b, tp, h = x.shape
    return jnp.transpose(x, (0, 2, 1)).reshape(b * h, tp // chunk, chunk, 1)


def _layout(q, k, gam, chunk):
    """Chunk-major (B*H, Tp, K) q, k and G as (B*H, N, C, 1) columns."""
    b, _, h, _ = q.shape
    q, k = common.to_chunk_major(q, b, h), common.to_chunk_major(k, b, h)
    return q, k, _columns(gam, chunk)


def _in_specs(has_w, has_g, kdim, vdim, c, chunk_index, has_key=False):
    """BlockSpecs for [w] ut q k p gcl [gam] [gkey] on the grid (B*H, chunks)."""
    ci = chunk_index
    kspec = pl.BlockSpec((None, c, kdim), lambda i, j: (i, ci(j), 0))
    specs = ([kspec] if has_w else []) + [
        pl.BlockSpec((None, c, vdim), lambda i, j: (i, ci(j), 0)), kspec, kspec,
        pl.BlockSpec((None, c, c), lambda i, j: (i, ci(j), 0)),
        pl.BlockSpec((None, None, 1, 1), lambda i, j: (i, ci(j), 0, 0))]
    column = pl.BlockSpec((None, None, c, 1), lambda i, j: (i, ci(j), 0, 0))
    return specs + [column] * (int(has_g) + int(has_key))


def _fwd_kernel(*refs, has_w, has_g, has_key, save):
    (w_ref, ut_ref, q_ref, k_ref, p_ref, gcl_ref, g_ref, key_ref), rest = tiles.split_refs(
        refs, has_w, has_g, has_key)
    s0_ref, o_ref, st_ref, *rest = rest
    h_ref, s_scr = (rest[0], rest[1]) if save else (None, rest[0])
    n = pl.program_id(1)

    @pl.when(n == 0)
    def _():
        s_scr[...] = s0_ref[...]

    s = s_scr[...]
    if save:
        h_ref[...] = s.astype(h_ref.dtype)
    o, s = tiles.fwd_chunk(s, w_ref[...] if has_w else None, ut_ref[...], q_ref[...],
                           k_ref[...], p_ref[...], gcl_ref[...],
                           g_ref[...] if has_g else None,
                           key_ref[...] if has_key else None)
    o_ref[...] = o.astype(o_ref.dtype)
    s_scr[...] = s

    @pl.when(n == pl.num_programs(1) - 1)
    def _():
        st_ref[...] = s


def forward(w, ut, q, k, p, gcl, gam, gkey, s0, cfg: Config, save: bool):
    """(O (B, Tp, H, V), final state), and with save the chunk-start states
    (BH, N, K, V) in the input dtype; arguments as recurrence.chunk_recurrence."""
    c = cfg.chunk
    b, tp, h, kdim, vdim, n, has_w, has_g = dims(w, ut, q, gam, c)
    has_key = gkey is not None
    bh = b * h
    out_shapes = [jax.ShapeDtypeStruct((bh, tp, vdim), jnp.dtype(cfg.out_dtype)),
                  jax.ShapeDtypeStruct((bh, kdim, vdim), jnp.float32)]
    if save:
        out_shapes.append(jax.ShapeDtypeStruct((bh, n, kdim, vdim), ut.dtype))
    qx, kx, gx = _layout(q, k, gam, c)
    args = ([w] if has_w else []) + [ut, qx, kx, p, gcl] + ([gx] if has_g else []) + (
        [_columns(gkey, c)] if has_key else []) + [s0]
    vspec = pl.BlockSpec((None, c, vdim), lambda i, j: (i, j, 0))
    sspec = pl.BlockSpec((None, kdim, vdim), lambda i, j: (i, 0, 0))
    out_specs = [vspec, sspec]
    if save:
        out_specs.append(pl.BlockSpec((None, None, kdim, vdim), lambda i, j: (i, j, 0, 0)))
    o, *rest = pl.pallas_call(
        functools.partial(_fwd_kernel, has_w=has_w, has_g=has_g, has_key=has_key,
                          save=save),
        grid=(bh, n),
        in_specs=_in_specs(has_w, has_g, kdim, vdim, c, lambda j: j, has_key) + [sspec],
        out_specs=out_specs, out_shape=out_shapes,
        scratch_shapes=[common.pltpu.VMEM((kdim, vdim), jnp.float32)],
        interpret=common.interpret(), compiler_params=common.compiler_params("tpu"),
        name="linear_chunk_fwd")(*args)
    return (common.from_chunk_major(o, b, h), *rest)


def _bwd_kernel(*refs, has_w, has_g, has_key):
    (w_ref, ut_ref, q_ref, k_ref, p_ref, gcl_ref, g_ref, key_ref), rest = tiles.split_refs(
        refs, has_w, has_g, has_key)
    h_ref, do_ref, dst_ref, dut_ref, *rest = rest
    if has_w:
        dw_ref, *rest = rest
    dqg_ref, dkd_ref, dp_ref, dgcl_ref, ds0_ref, ds_scr = rest
    i = pl.program_id(1)

    @pl.when(i == 0)
    def _():
        ds_scr[...] = dst_ref[...]

    ds, du, dw, dqg, dkd, dp, dgcl = tiles.bwd_chunk(
        h_ref[...], ds_scr[...], w_ref[...] if has_w else None, ut_ref[...], q_ref[...],
        k_ref[...], p_ref[...], gcl_ref[...], g_ref[...] if has_g else None, do_ref[...],
        key_ref[...] if has_key else None)
    dut_ref[...] = du.astype(dut_ref.dtype)
    if has_w:
        dw_ref[...] = dw.astype(dw_ref.dtype)
    dqg_ref[...] = dqg.astype(dqg_ref.dtype)
    dkd_ref[...] = dkd.astype(dkd_ref.dtype)
    dp_ref[...] = dp.astype(dp_ref.dtype)
    dgcl_ref[...] = dgcl
    ds_scr[...] = ds

    @pl.when(i == pl.num_programs(1) - 1)
    def _():
        ds0_ref[...] = ds


def _backward_kernel_call(w, ut, q, k, p, gcl, gam, gkey, h, do, dst, cfg: Config):
    """(dw | None, dut, dqg, dkd, dp, dgcl, ds0) with dqg, dkd chunk-major (B*H, Tp, K),
    before the decay chain; do chunk-major (B*H, Tp, V)."""
    c = cfg.chunk
    b, tp, nh, kdim, vdim, n, has_w, has_g = dims(w, ut, q, gam, c)
    has_key = gkey is not None
    bh = b * nh
    f32 = jnp.float32
    out_shapes = [jax.ShapeDtypeStruct((bh, tp, vdim), f32)]
    if has_w:
        out_shapes.append(jax.ShapeDtypeStruct((bh, tp, kdim), f32))
    out_shapes += [jax.ShapeDtypeStruct((bh, tp, kdim), f32),
                   jax.ShapeDtypeStruct((bh, tp, kdim), f32),
                   jax.ShapeDtypeStruct((bh, tp, c), f32),
                   jax.ShapeDtypeStruct((bh, n, 1, 1), f32),
                   jax.ShapeDtypeStruct((bh, kdim, vdim), f32)]
    qx, kx, gx = _layout(q, k, gam, c)
    args = (([w] if has_w else []) + [ut, qx, kx, p, gcl] + ([gx] if has_g else [])
            + ([_columns(gkey, c)] if has_key else []) + [h, do, dst])
    rev = lambda j: n - 1 - j  # noqa: E731  (chunks visited last to first)
    vspec = pl.BlockSpec((None, c, vdim), lambda i, j: (i, rev(j), 0))
    sspec = pl.BlockSpec((None, kdim, vdim), lambda i, j: (i, 0, 0))
    in_specs = _in_specs(has_w, has_g, kdim, vdim, c, rev, has_key) + [
        pl.BlockSpec((None, None, kdim, vdim), lambda i, j: (i, rev(j), 0, 0)),
        vspec, sspec]
    kpart = pl.BlockSpec((None, c, kdim), lambda i, j: (i, rev(j), 0))
    out_specs = [vspec] + ([kpart] if has_w else []) + [
        kpart, kpart,
        pl.BlockSpec((None, c, c), lambda i, j: (i, rev(j), 0)),
        pl.BlockSpec((None, None, 1, 1), lambda i, j: (i, rev(j), 0, 0)),
        sspec]
    outs = pl.pallas_call(
        functools.partial(_bwd_kernel, has_w=has_w, has_g=has_g, has_key=has_key),
        grid=(bh, n), in_specs=in_specs, out_specs=out_specs, out_shape=out_shapes,
        scratch_shapes=[common.pltpu.VMEM((kdim, vdim), jnp.float32)],
        interpret=common.interpret(), compiler_params=common.compiler_params("tpu"),
        name="linear_chunk_bwd")(*args)
    dut, *outs = outs
    dw = outs.pop(0) if has_w else None
    dqg, dkd, dp, dgcl, ds0 = outs
    return dw, dut, dqg, dkd, dp, dgcl, ds0


def _chain_decay(dqg, dkd, dgcl, q, k, gcl, gam, gkey, chunk):
    """From the kernel's gradients w.r.t. Qg = Q exp(G), Kd = K exp(G_C - G) (or
    K exp(gkey)) (chunk-major float32) to those w.r.t. q, k (B, Tp, H, K), G (B, Tp, H),
    gkey and G_C (added to dgcl): elementwise XLA, fused with the layout change back to
    the inputs' (B, Tp, H, K)."""
    b, tp, h, _ = q.shape
    back = lambda x: common.from_chunk_major(x, b, h)  # noqa: E731
    if gam is None:
        return back(dqg), back(dkd), None, None, dgcl
    n = tp // chunk
    g = jnp.transpose(gam, (0, 2, 1)).reshape(b * h, n, chunk)
    e_q = jnp.exp(g).reshape(b * h, tp, 1)
    log_key = (gcl.reshape(b * h, n, 1) - g if gkey is None
               else jnp.transpose(gkey, (0, 2, 1)).reshape(b * h, n, chunk))
    e_k = jnp.exp(log_key).reshape(b * h, tp, 1)
    dq, dk = dqg * e_q, dkd * e_k                               # chunk-major
    f32 = jnp.float32
    # d/dG of Qg is Qg, of Kd is -Kd; d/dG_C of Kd is Kd (with gkey: d/dgkey of Kd is Kd)
    tq = jnp.sum(dq * common.to_chunk_major(q.astype(f32), b, h), axis=-1)
    tk = jnp.sum(dk * common.to_chunk_major(k.astype(f32), b, h), axis=-1)
    per_token = lambda x: jnp.transpose(x.reshape(b, h, tp), (0, 2, 1))  # noqa: E731
    if gkey is not None:
        return back(dq), back(dk), per_token(tq), per_token(tk), dgcl
    dgcl = dgcl + jnp.sum(tk.reshape(b * h, n, chunk), axis=-1).reshape(gcl.shape)
    return back(dq), back(dk), per_token(tq - tk), None, dgcl


def backward(w, ut, q, k, p, gcl, gam, gkey, h, do, dst, cfg: Config):
    """The TPU backward, with bwd_gpu.backward's returns:
    (dw | None, dut, dq, dk, dp, dgcl, dgam | None, dgkey | None, ds0)."""
    do = common.to_chunk_major(do, q.shape[0], q.shape[2])
    dw, dut, dqg, dkd, dp, dgcl, ds0 = _backward_kernel_call(
        w, ut, q, k, p, gcl, gam, gkey, h, do, dst, cfg)
    dq, dk, dgam, dgkey, dgcl = _chain_decay(dqg, dkd, dgcl, q, k, gcl, gam, gkey,
                                             cfg.chunk)
    return dw, dut, dq, dk, dp, dgcl, dgam, dgkey, ds0
