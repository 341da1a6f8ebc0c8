"""The delta-rule mixers' input path as one GPU program each way: the depthwise causal
conv over time, SiLU, per-head L2 normalisation and a scale (fla's causal_conv1d with
its activation, and the l2norm fla moves into its kernels), for N stacked inputs (q, k, v).

    y_n[t] = scale_n * nrm_n(silu(sum_j w_n[j] x_n[t - back_j] [pos[t] >= back_j]))

with back_j = c - 1 - j, pos[t] the position of token t inside its document (a tap
never reaches into the previous document, nor before the sequence), and nrm_n the
per-head L2 normalisation x / sqrt(|x|^2 + eps) where normalize[n], else identity.

XLA made the forward a multi-output reduction and the backward three float32 passes
over (B, T, 3, C) (the conv weights' gradient as column reductions): about 0.4 ms of a
1.6 ms gated DeltaNet layer at B4 T2048 d1024 on an H200 (docs/benchmarks.md). Here
each program takes BT rows of one head of every input, reads x once (plus the
neighbouring row blocks the taps reach) and writes y once; the backward recomputes the
forward from x, writes dx and each program's partial sums of the weights' gradient.

Rows shifted by a tap are formed by products with 0/1 selection matrices on the tensor
cores (Triton has no row shift of a register tile): exact for 16-bit inputs and float32
products; float32 cotangents go through as a bfloat16 high part plus a bfloat16 low
part (relative error ~2^-16) on 16-bit runs, as IEEE float32 products on float32 runs.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.pallas import common, tiles


def _selection(rows: int, offset: int, dtype):
    """(rows, rows) 0/1: S[r, s] = 1 where s = r + offset."""
    r = lax.broadcasted_iota(jnp.int32, (rows, rows), 0)
    s = lax.broadcasted_iota(jnp.int32, (rows, rows), 1)
    return (s == r + offset).astype(dtype)


def _shifted(before, here, after, shift: int, exact_dtype, precision):
    """Rows r + shift of the row blocks [before; here; after] (each (BT, D)), for r in
    0..BT-1 of `here`; shift in (-BT, BT); `before` is read for shift < 0, `after` for
    shift > 0. Computed in float32 from products of exact_dtype operands."""
    if shift == 0:
        return here.astype(jnp.float32)
    bt = here.shape[0]
    other = before if shift < 0 else after
    offset_other = shift + bt if shift < 0 else shift - bt

    def product(block, offset):
        sel = _selection(bt, offset, exact_dtype)
        if block.dtype == exact_dtype:
            return tiles.mm(sel, block, precision=precision)
        # float32 values on a 16-bit run: a high and a low 16-bit part
        high = block.astype(exact_dtype)
        low = (block - high.astype(jnp.float32)).astype(exact_dtype)
        return tiles.mm(sel, high) + tiles.mm(sel, low)
    return product(here, shift) + product(other, offset_other)


def _pre(prev, here, pos, w, exact_dtype, precision):
    """The conv (before SiLU) of the rows of `here`, float32 (BT, D): prev the row block
    before it, pos (BT,) the rows' positions in their documents, w the taps' weights,
    each (D,) float32."""
    pre = jnp.zeros(here.shape, jnp.float32)
    for j, w_j in enumerate(w):
        back = len(w) - 1 - j
        tap = _shifted(prev, here, None, -back, exact_dtype, precision)
        pre = pre + jnp.where((pos >= back)[:, None], tap, 0.0) * w_j[None, :]
    return pre


def _weights(w_ref, n, taps):
    """Input n's taps' weights, each (D,) float32 (Triton slices refs, not values)."""
    return [w_ref[j, n, :].astype(jnp.float32) for j in range(taps)]


def _forward_values(pre, normalize: bool, scale: float, eps: float):
    """(silu(pre), its row norm factor or None, the output) in float32."""
    y = pre * jax.nn.sigmoid(pre)
    if not normalize:
        return y, None, y * scale
    r = lax.rsqrt(jnp.sum(y * y, axis=1, keepdims=True) + eps)
    return y, r, y * r * scale


def _dpre(pre, dout, normalize: bool, scale: float, eps: float):
    """The cotangent of pre from that of the output, float32."""
    sig = jax.nn.sigmoid(pre)
    y = pre * sig
    if normalize:
        r = lax.rsqrt(jnp.sum(y * y, axis=1, keepdims=True) + eps)
        dy = scale * (r * dout - (r * r * r) * y * jnp.sum(y * dout, axis=1, keepdims=True))
    else:
        dy = scale * dout
    return dy * sig * (1.0 + pre * (1.0 - sig))


def _fwd_kernel(pos_ref, prev_ref, x_ref, w_ref, *out_refs, taps, normalize, scale, eps):
    # x blocks (BT, N, D): every input's rows of one head; w (taps, N, D)
    pos = pos_ref[...]
    first = pl.program_id(1) == 0  # the block before the first is no input
    for n, out_ref in enumerate(out_refs):
        dt = x_ref.dtype
        here = x_ref[:, n, :]
        prev = jnp.where(first, jnp.zeros_like(here), prev_ref[:, n, :])
        pre = _pre(prev, here, pos, _weights(w_ref, n, taps), dt, common.dot_precision(dt))
        out_ref[...] = _forward_values(pre, normalize[n], scale[n], eps)[2].astype(
            out_ref.dtype)


def _bwd_kernel(pos_ref, pos_next_ref, prev_ref, x_ref, next_ref, w_ref, *refs, taps,
                normalize, scale, eps, blocks):
    # refs: the N output cotangents' blocks and those of the next row block, then dx
    # (BT, N, D) and the weights' partial gradient (taps, N, D) of this program
    n_in = len(normalize)
    douts, douts_next, (dx_ref, dw_ref) = refs[:n_in], refs[n_in:2 * n_in], refs[2 * n_in:]
    i = pl.program_id(1)
    pos, pos_next = pos_ref[...], pos_next_ref[...]
    last = i == blocks - 1  # no block after the last
    dt = x_ref.dtype
    prec = common.dot_precision(dt)
    for n in range(n_in):
        here = x_ref[:, n, :]
        prev = jnp.where(i == 0, jnp.zeros_like(here), prev_ref[:, n, :])
        after = jnp.where(last, jnp.zeros_like(here), next_ref[:, n, :])
        w = _weights(w_ref, n, taps)
        args = (normalize[n], scale[n], eps)
        dp = _dpre(_pre(prev, here, pos, w, dt, prec),
                   douts[n][...].astype(jnp.float32), *args)
        dp_next = _dpre(_pre(here, after, pos_next, w, dt, prec),
                        douts_next[n][...].astype(jnp.float32), *args)
        dp_next = jnp.where(last, 0.0, dp_next)
        dx = jnp.zeros(here.shape, jnp.float32)
        for j in range(taps):
            back = taps - 1 - j
            masked = jnp.where((pos >= back)[:, None], dp, 0.0)
            masked_next = jnp.where((pos_next >= back)[:, None], dp_next, 0.0)
            # x[s] fed tap j of output row s + back
            dx = dx + w[j][None, :] * _shifted(None, masked, masked_next, back, dt, prec)
            tap = _shifted(prev, here, None, -back, dt, prec)
            dw_ref[j, n, :] = jnp.sum(masked * tap, axis=0)
        dx_ref[:, n, :] = dx.astype(dx_ref.dtype)


def _block_t(t: int, block_t: int) -> int:
    return min(block_t, max(16, pl.next_power_of_2(t)))


def _layout(x, kernel, block_t):
    b, t, n_in, c = x.shape
    taps = pl.next_power_of_2(kernel.shape[0])
    bt = _block_t(t, block_t)
    tp = -(-t // bt) * bt
    return b, t, n_in, c, taps, bt, tp


def _padded_kernel(kernel, taps):
    """(taps, N, C): zero taps in front reach further back and add nothing."""
    return jnp.pad(kernel, ((taps - kernel.shape[0], 0), (0, 0), (0, 0)))


def _specs(bt, n_in, head_dim, taps, blocks):
    """BlockSpecs on the grid (batch, row block, head): the rows of x (B, Tp, N, C) at
    the row block before / this one / after, positions (B, Tp), per-input rows (B, Tp,
    C), the weights (taps, N, C)."""
    before = lambda i: jnp.maximum(i - 1, 0)  # noqa: E731
    after = lambda i: jnp.minimum(i + 1, blocks - 1)  # noqa: E731
    this = lambda i: i  # noqa: E731
    x = lambda at: pl.BlockSpec((None, bt, n_in, head_dim),  # noqa: E731
                                lambda b, i, h: (b, at(i), 0, h))
    pos = lambda at: pl.BlockSpec((None, bt), lambda b, i, h: (b, at(i)))  # noqa: E731
    rows = lambda at: pl.BlockSpec((None, bt, head_dim),  # noqa: E731
                                   lambda b, i, h: (b, at(i), h))
    weights = pl.BlockSpec((taps, n_in, head_dim), lambda b, i, h: (0, 0, h))
    return before, this, after, x, pos, rows, weights


def _params(num_warps):
    return common.compiler_params("gpu", num_warps=num_warps, num_stages=1)


def forward(x, kernel, pos, *, head_dim, normalize, scale, eps, block_t, num_warps):
    """The N outputs (B, T, C) in x's dtype; x (B, T, N, C), kernel (c, N, C), pos (B, T)
    int32."""
    b, t, n_in, c, taps, bt, tp = _layout(x, kernel, block_t)
    blocks = tp // bt
    before, this, _, xs, pos_s, rows, weights = _specs(bt, n_in, head_dim, taps, blocks)
    outs = pl.pallas_call(
        functools.partial(_fwd_kernel, taps=taps, normalize=normalize, scale=scale,
                          eps=eps),
        grid=(b, blocks, c // head_dim),
        in_specs=[pos_s(this), xs(before), xs(this), weights],
        out_specs=[rows(this)] * n_in,
        out_shape=[jax.ShapeDtypeStruct((b, tp, c), x.dtype)] * n_in,
        interpret=common.interpret(), compiler_params=_params(num_warps),
        name="short_conv_fwd")(common.pad_time(pos, tp), *[common.pad_time(x, tp)] * 2,
                               _padded_kernel(kernel, taps))
    return tuple(o[:, :t] for o in outs)


def backward(x, kernel, pos, douts, *, head_dim, normalize, scale, eps, block_t,
             num_warps):
    """(dx (B, T, N, C) in x's dtype, dkernel (c, N, C) float32)."""
    b, t, n_in, c, taps, bt, tp = _layout(x, kernel, block_t)
    blocks = tp // bt
    before, this, after, xs, pos_s, rows, weights = _specs(bt, n_in, head_dim, taps,
                                                           blocks)
    xp = common.pad_time(x, tp)
    posp = common.pad_time(pos, tp)
    douts = [common.pad_time(d.astype(x.dtype), tp) for d in douts]
    dx, dw = pl.pallas_call(
        functools.partial(_bwd_kernel, taps=taps, normalize=normalize, scale=scale,
                          eps=eps, blocks=blocks),
        grid=(b, blocks, c // head_dim),
        in_specs=[pos_s(this), pos_s(after), xs(before), xs(this), xs(after), weights]
        + [rows(this)] * n_in + [rows(after)] * n_in,
        out_specs=[xs(this),
                   pl.BlockSpec((None, None, taps, n_in, head_dim),
                                lambda b, i, h: (b, i, 0, 0, h))],
        out_shape=[jax.ShapeDtypeStruct((b, tp, n_in, c), x.dtype),
                   jax.ShapeDtypeStruct((b, blocks, taps, n_in, c), jnp.float32)],
        interpret=common.interpret(), compiler_params=_params(num_warps),
        name="short_conv_bwd")(posp, posp, xp, xp, xp, _padded_kernel(kernel, taps),
                               *douts, *douts)
    dkernel = jnp.sum(dw, axis=(0, 1))[taps - kernel.shape[0]:]
    return dx[:, :t], dkernel


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7, 8))
def conv_silu_norm(x, kernel, pos, head_dim, normalize, scale, eps, block_t, num_warps):
    """See the module docstring: x (B, T, N, C), kernel (c, N, C), pos (B, T) int32 (each
    token's position in its document); normalize / scale: N static bools / floats.
    Returns the N outputs (B, T, C) in x's dtype."""
    return forward(x, kernel, pos, head_dim=head_dim, normalize=normalize, scale=scale,
                   eps=eps, block_t=block_t, num_warps=num_warps)


def _vjp_fwd(x, kernel, pos, head_dim, normalize, scale, eps, block_t, num_warps):
    outs = forward(x, kernel, pos, head_dim=head_dim, normalize=normalize, scale=scale,
                   eps=eps, block_t=block_t, num_warps=num_warps)
    return outs, (x, kernel, pos)


def _vjp_bwd(head_dim, normalize, scale, eps, block_t, num_warps, saved, douts):
    x, kernel, pos = saved
    dx, dkernel = backward(x, kernel, pos, douts, head_dim=head_dim, normalize=normalize,
                           scale=scale, eps=eps, block_t=block_t, num_warps=num_warps)
    return dx, dkernel.astype(kernel.dtype), None


conv_silu_norm.defvjp(_vjp_fwd, _vjp_bwd)
