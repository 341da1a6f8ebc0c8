"""The delta-rule mixers' input path as GPU programs (one forward, two backward): the
depthwise causal conv over time, SiLU, per-head L2 normalisation and a scale (fla's
causal_conv1d with its activation, and the l2norm fla moves into its kernels), for N
stacked inputs (q, k, v).

    y_n[t] = scale_n * nrm_n(silu(sum_j w_n[j] x_n[t - back_j] [pos[t] >= back_j]))

with back_j = c - 1 - j, pos[t] the position of token t inside its document (a tap
never reaches into the previous document, nor before the sequence), and nrm_n the
per-head L2 normalisation x / sqrt(|x|^2 + eps) where normalize[n], else identity.

XLA made the forward a multi-output reduction and the backward three float32 passes
over (B, T, 3, C) (the conv weights' gradient as column reductions): about 0.4 ms of a
1.6 ms gated DeltaNet layer at B4 T2048 d1024 on an H200 (docs/benchmarks.md). Here
each program takes BT rows of one head of every input and reads the rows its taps reach
straight from the sequence (zero-padded in time so that every read lies inside), as
fla's causal_conv1d does. The forward writes y once. The backward runs two programs:
the cotangent of the conv's output (float32, recomputing the conv from x), then dx and
each program's partial sums of the weights' gradient from it (a shifted read of that
cotangent per tap). A single backward program that recomputed the conv at every shifted
row needed every register and spilled.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.pallas import common


def _weights(w_ref, n, taps):
    """Input n's taps' weights, each (D,) float32 (Triton slices refs, not values)."""
    return [w_ref[j, n, :].astype(jnp.float32) for j in range(taps)]


def _rows(ref, start, bt, n=None):
    """Rows start .. start + bt - 1 of a time-padded block (of input n), float32."""
    if n is None:
        return ref[pl.ds(start, bt), :].astype(jnp.float32)
    return ref[pl.ds(start, bt), n, :].astype(jnp.float32)


def _pre(x_ref, pos_ref, n, w, start, bt):
    """The conv (before SiLU) of input n at the padded rows start .. start + bt - 1,
    float32 (BT, D): tap j reads the row back_j = taps - 1 - j earlier, where the row's
    document reaches that far (its position >= back_j)."""
    pos = pos_ref[pl.ds(start, bt)]
    pre = jnp.zeros((bt, x_ref.shape[-1]), jnp.float32)
    for j, w_j in enumerate(w):
        back = len(w) - 1 - j
        tap = _rows(x_ref, start - back, bt, n)
        pre = pre + jnp.where((pos >= back)[:, None], tap, 0.0) * w_j[None, :]
    return pre


def _forward_values(pre, normalize: bool, scale: float, eps: float):
    """The output silu(pre), row-normalised where asked, times scale; float32."""
    y = pre * jax.nn.sigmoid(pre)
    if not normalize:
        return y * scale
    return y * (lax.rsqrt(jnp.sum(y * y, axis=1, keepdims=True) + eps) * scale)


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


def _fwd_kernel(pos_ref, x_ref, w_ref, *out_refs, taps, pad, bt, normalize, scale, eps):
    # x (Tx, N, D) and pos (Tx,): the whole sequence of one batch row and head, with pad
    # zero rows in front; out (BT, D) each: this program's rows
    start = pl.program_id(1) * bt + pad
    for n, out_ref in enumerate(out_refs):
        pre = _pre(x_ref, pos_ref, n, _weights(w_ref, n, taps), start, bt)
        out_ref[...] = _forward_values(pre, normalize[n], scale[n], eps).astype(
            out_ref.dtype)


def _dpre_kernel(pos_ref, x_ref, w_ref, *refs, taps, pad, bt, normalize, scale, eps):
    # backward pass 1: refs are the N output cotangents (Tx, D), time-padded as x, then
    # dpre (BT, N, D) float32: the cotangent of the conv's output at this program's rows
    n_in = len(normalize)
    douts, dpre_ref = refs[:n_in], refs[n_in]
    start = pl.program_id(1) * bt + pad
    for n in range(n_in):
        pre = _pre(x_ref, pos_ref, n, _weights(w_ref, n, taps), start, bt)
        dpre_ref[:, n, :] = _dpre(pre, _rows(douts[n], start, bt), normalize[n], scale[n],
                                  eps)


def _bwd_kernel(pos_ref, x_ref, w_ref, dpre_ref, dx_ref, dw_ref, *, taps, pad, bt, n_in):
    # backward pass 2: dpre (Tp + BT, N, D) float32 of one batch row and head (not
    # padded in front); dx (BT, N, D) and this program's partial sums of the weights'
    # gradient (taps, N, D). x[s] fed tap j of output row s + back_j where that row's
    # document reaches back_j: dx[s] = sum_j w_j dpre[s + back_j] [pos[s + back_j] >=
    # back_j], dw_j = sum_s dpre[s] x[s - back_j] [pos[s] >= back_j]
    row = pl.program_id(1) * bt
    pos = pos_ref[pl.ds(row + pad, bt)]
    for n in range(n_in):
        w = _weights(w_ref, n, taps)
        here = _rows(dpre_ref, row, bt, n)
        dx = jnp.zeros(here.shape, jnp.float32)
        for j in range(taps):
            back = taps - 1 - j
            if back == 0:
                dx = dx + w[j][None, :] * here
            else:
                later = pos_ref[pl.ds(row + pad + back, bt)]
                dp = _rows(dpre_ref, row + back, bt, n)
                dx = dx + w[j][None, :] * jnp.where((later >= back)[:, None], dp, 0.0)
            tap = _rows(x_ref, row + pad - back, bt, n)
            dw_ref[j, n, :] = jnp.sum(jnp.where((pos >= back)[:, None], here, 0.0) * tap,
                                      axis=0)
        dx_ref[:, n, :] = dx.astype(dx_ref.dtype)


def _block_t(t: int, block_t: int) -> int:
    return min(block_t, max(16, pl.next_power_of_2(t)))


def _layout(x, kernel, block_t):
    """(b, t, n_in, c, taps, bt, tp, pad): taps a power of two, bt rows a program, tp the
    length rounded up to bt, pad = taps - 1 zero rows before and after the sequence."""
    b, t, n_in, c = x.shape
    taps = pl.next_power_of_2(kernel.shape[0])
    bt = _block_t(t, block_t)
    tp = -(-t // bt) * bt
    return b, t, n_in, c, taps, bt, tp, taps - 1


def _padded_kernel(kernel, taps):
    """(taps, N, C): zero taps in front reach further back and add nothing."""
    return jnp.pad(kernel, ((taps - kernel.shape[0], 0), (0, 0), (0, 0)))


def _time_padded(a, pad, total):
    """a (B, T, ...) with pad zero rows before it and zero rows after it up to total
    rows: every row a program reads lies inside."""
    widths = [(0, 0), (pad, total - pad - a.shape[1])] + [(0, 0)] * (a.ndim - 2)
    return jnp.pad(a, widths)


def _specs(tx, n_in, head_dim, taps):
    """BlockSpecs on the grid (batch, row block, head): the whole padded sequence of x
    (B, Tx, N, C), positions (B, Tx) and per-input rows (B, Tx, C) of one batch row and
    head (each program reads its rows out of them), the weights (taps, N, C)."""
    x = pl.BlockSpec((None, tx, n_in, head_dim), lambda b, i, h: (b, 0, 0, h))
    pos = pl.BlockSpec((None, tx), lambda b, i, h: (b, 0))
    rows = pl.BlockSpec((None, tx, head_dim), lambda b, i, h: (b, 0, h))
    weights = pl.BlockSpec((taps, n_in, head_dim), lambda b, i, h: (0, 0, h))
    return x, pos, rows, weights


def _params(num_warps):
    return common.compiler_params("gpu", num_warps=num_warps, num_stages=1)


def forward(x, kernel, pos, *, head_dim, normalize, scale, eps, block_t, num_warps):
    """The N outputs (B, T, C) in x's dtype; x (B, T, N, C), kernel (c, N, C), pos (B, T)
    int32."""
    b, t, n_in, c, taps, bt, tp, pad = _layout(x, kernel, block_t)
    tx = pad + tp  # each program reads up to pad rows before its own
    xs, pos_s, _, weights = _specs(tx, n_in, head_dim, taps)
    outs = pl.pallas_call(
        functools.partial(_fwd_kernel, taps=taps, pad=pad, bt=bt, normalize=normalize,
                          scale=scale, eps=eps),
        grid=(b, tp // bt, c // head_dim),
        in_specs=[pos_s, xs, weights],
        out_specs=[pl.BlockSpec((None, bt, head_dim), lambda b, i, h: (b, i, h))] * n_in,
        out_shape=[jax.ShapeDtypeStruct((b, tp, c), x.dtype)] * n_in,
        interpret=common.interpret(), compiler_params=_params(num_warps),
        name="short_conv_fwd")(_time_padded(pos, pad, tx), _time_padded(x, pad, tx),
                               _padded_kernel(kernel, taps))
    return tuple(o[:, :t] for o in outs)


def backward(x, kernel, pos, douts, *, head_dim, normalize, scale, eps, block_t,
             num_warps):
    """(dx (B, T, N, C) in x's dtype, dkernel (c, N, C) float32), in two programs: the
    cotangent of the conv's output (float32, one row block past the end, zeros there),
    then dx and the weights' partial gradients from it."""
    b, t, n_in, c, taps, bt, tp, pad = _layout(x, kernel, block_t)
    blocks = tp // bt
    tx = pad + tp + bt  # rows up to one block past the end are read as zeros
    xs, pos_s, rows, weights = _specs(tx, n_in, head_dim, taps)
    xp, posp = _time_padded(x, pad, tx), _time_padded(pos, pad, tx)
    w = _padded_kernel(kernel, taps)
    params = _params(num_warps)
    dpre = pl.pallas_call(
        functools.partial(_dpre_kernel, taps=taps, pad=pad, bt=bt, normalize=normalize,
                          scale=scale, eps=eps),
        grid=(b, blocks + 1, c // head_dim),
        in_specs=[pos_s, xs, weights] + [rows] * n_in,
        out_specs=pl.BlockSpec((None, bt, n_in, head_dim), lambda b, i, h: (b, i, 0, h)),
        out_shape=jax.ShapeDtypeStruct((b, tp + bt, n_in, c), jnp.float32),
        interpret=common.interpret(), compiler_params=params,
        name="short_conv_bwd_dpre")(
            posp, xp, w, *[_time_padded(d.astype(x.dtype), pad, tx) for d in douts])
    dx, dw = pl.pallas_call(
        functools.partial(_bwd_kernel, taps=taps, pad=pad, bt=bt, n_in=n_in),
        grid=(b, blocks, c // head_dim),
        in_specs=[pos_s, xs, weights,
                  pl.BlockSpec((None, tp + bt, n_in, head_dim), lambda b, i, h: (b, 0, 0, h))],
        out_specs=[pl.BlockSpec((None, bt, n_in, head_dim), lambda b, i, h: (b, i, 0, h)),
                   pl.BlockSpec((None, None, taps, n_in, head_dim),
                                lambda b, i, h: (b, i, 0, 0, h))],
        out_shape=[jax.ShapeDtypeStruct((b, tp, n_in, c), x.dtype),
                   jax.ShapeDtypeStruct((b, blocks, taps, n_in, c), jnp.float32)],
        interpret=common.interpret(), compiler_params=params,
        name="short_conv_bwd")(posp, xp, w, dpre)
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
