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
the cotangent of the conv's output (recomputing the conv from x; stored in float32, or
with dpre_dtype="input" in x's dtype, which halves the bytes of the two programs'
largest array) and each program's partial sums of the weights' gradient (from the taps'
rows the conv reads), then dx from that cotangent alone (a shifted read of it per tap).
A single backward program that recomputed the conv at every shifted row needed every
register and spilled.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

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


def _taps(x_ref, pos_ref, n, taps, start, bt):
    """What each tap of input n reads at the padded rows start .. start + bt - 1, float32
    (BT, D) each, in tap order: tap j the row back_j = taps - 1 - j earlier where the
    row's document reaches that far (its position >= back_j), else 0. A generator, so
    that a caller summing them holds one read at a time (the forward's registers)."""
    pos = pos_ref[pl.ds(start, bt)]
    for j in range(taps):
        back = taps - 1 - j
        yield jnp.where((pos >= back)[:, None], _rows(x_ref, start - back, bt, n), 0.0)


def _pre(taps, w):
    """The conv (before SiLU) from _taps' reads and the taps' weights, float32 (BT, D)."""
    pre = None
    for tap, w_j in zip(taps, w):
        term = tap * w_j[None, :]
        pre = term if pre is None else pre + term
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
    # x (Tx, N, D) and pos (Tx,): the whole sequence of one batch row and head, time-padded
    # (pad zero rows in front, _Layout.tx); out (BT, D) each: this program's rows
    start = pl.program_id(1) * bt + pad
    for n, out_ref in enumerate(out_refs):
        pre = _pre(_taps(x_ref, pos_ref, n, taps, start, bt), _weights(w_ref, n, taps))
        out_ref[...] = _forward_values(pre, normalize[n], scale[n], eps).astype(
            out_ref.dtype)


def _dpre_kernel(pos_ref, x_ref, w_ref, *refs, taps, pad, bt, normalize, scale, eps,
                 blocks):
    # backward pass 1: refs are the N output cotangents, then dpre (BT, N, D): the
    # cotangent of the conv's output at this program's rows, and this program's partial
    # sums of the weights' gradient (taps, N, D) float32, dw_j = sum_s dpre[s] x[s -
    # back_j] [pos[s] >= back_j], from the taps' rows the conv reads anyway. A cotangent
    # is either this program's rows (BT, D) of the unpadded one (blocks > 0: the length
    # is a multiple of BT; the program one block past the end reads the last block and
    # takes zeros), or the whole sequence (Tx, D) time-padded as x (blocks = 0).
    n_in = len(normalize)
    douts, dpre_ref, dw_ref = refs[:n_in], refs[n_in], refs[n_in + 1]
    start = pl.program_id(1) * bt + pad
    for n in range(n_in):
        reads = list(_taps(x_ref, pos_ref, n, taps, start, bt))  # the conv's and dw's
        pre = _pre(reads, _weights(w_ref, n, taps))
        if blocks:
            dout = jnp.where(pl.program_id(1) < blocks, douts[n][...].astype(jnp.float32),
                             0.0)
        else:
            dout = _rows(douts[n], start, bt)
        dpre = _dpre(pre, dout, normalize[n], scale[n], eps)
        dpre_ref[:, n, :] = dpre.astype(dpre_ref.dtype)
        for j, tap in enumerate(reads):  # the masked reads: dw_j's [pos[s] >= back_j]
            dw_ref[j, n, :] = jnp.sum(dpre * tap, axis=0)


def _bwd_kernel(pos_ref, w_ref, dpre_ref, dx_ref, *, taps, pad, bt, n_in):
    # backward pass 2: dpre (Tp + BT, N, D) of one batch row and head (not padded in
    # front); dx (BT, N, D). x[s] fed tap j of output row s + back_j where that row's
    # document reaches back_j: dx[s] = sum_j w_j dpre[s + back_j] [pos[s + back_j] >=
    # back_j]
    row = pl.program_id(1) * bt
    for n in range(n_in):
        w = _weights(w_ref, n, taps)
        dx = w[taps - 1][None, :] * _rows(dpre_ref, row, bt, n)  # back 0: its own row
        for j in range(taps - 1):
            back = taps - 1 - j
            later = pos_ref[pl.ds(row + pad + back, bt)]
            dp = _rows(dpre_ref, row + back, bt, n)
            dx = dx + w[j][None, :] * jnp.where((later >= back)[:, None], dp, 0.0)
        dx_ref[:, n, :] = dx.astype(dx_ref.dtype)


def _block_t(t: int, block_t: int) -> int:
    return min(block_t, max(16, pl.next_power_of_2(t)))


class _Layout(NamedTuple):
    """Sizes of one call: taps a power of two, bt rows a program, tp the length rounded
    up to bt, pad = taps - 1 zero rows before the sequence."""
    b: int
    t: int
    n_in: int
    c: int
    taps: int
    bt: int
    tp: int
    pad: int

    @property
    def tx(self) -> int:
        """Rows of the time-padded inputs: every row a program reads (up to pad before
        its own; the backward's cotangent programs one row block past the end)."""
        return self.pad + self.tp + self.bt


def _layout(shape, kernel, block_t) -> _Layout:
    """The layout of x of `shape` (B, T, N, C) with kernel (c, N, C)."""
    b, t, n_in, c = shape
    taps = pl.next_power_of_2(kernel.shape[0])
    bt = _block_t(t, block_t)
    return _Layout(b, t, n_in, c, taps, bt, -(-t // bt) * bt, taps - 1)


def _padded_kernel(kernel, taps):
    """(taps, N, C): zero taps in front reach further back and add nothing."""
    return jnp.pad(kernel, ((taps - kernel.shape[0], 0), (0, 0), (0, 0)))


def _time_padded(a, lay: _Layout):
    """a (B, T, ...) with lay.pad zero rows before it and zero rows after it up to lay.tx
    rows: every row a program reads lies inside."""
    widths = [(0, 0), (lay.pad, lay.tx - lay.pad - a.shape[1])] + [(0, 0)] * (a.ndim - 2)
    return jnp.pad(a, widths)


def _specs(lay: _Layout, head_dim):
    """BlockSpecs on the grid (batch, row block, head): the whole padded sequence of x
    (B, Tx, N, C), positions (B, Tx) and per-input rows (B, Tx, C) of one batch row and
    head (each program reads its rows out of them), the weights (taps, N, C)."""
    x = pl.BlockSpec((None, lay.tx, lay.n_in, head_dim), lambda b, i, h: (b, 0, 0, h))
    pos = pl.BlockSpec((None, lay.tx), lambda b, i, h: (b, 0))
    rows = pl.BlockSpec((None, lay.tx, head_dim), lambda b, i, h: (b, 0, h))
    weights = pl.BlockSpec((lay.taps, lay.n_in, head_dim), lambda b, i, h: (0, 0, h))
    return x, pos, rows, weights


def _params(num_warps):
    return common.compiler_params("gpu", num_warps=num_warps, num_stages=1)


def _forward(xp, posp, w, lay: _Layout, *, head_dim, normalize, scale, eps, num_warps):
    """The N outputs (B, T, C) in x's dtype from the time-padded x (B, Tx, N, C) and
    positions (B, Tx) and the padded weights (taps, N, C)."""
    xs, pos_s, _, weights = _specs(lay, head_dim)
    outs = pl.pallas_call(
        functools.partial(_fwd_kernel, taps=lay.taps, pad=lay.pad, bt=lay.bt,
                          normalize=normalize, scale=scale, eps=eps),
        grid=(lay.b, lay.tp // lay.bt, lay.c // head_dim),
        in_specs=[pos_s, xs, weights],
        out_specs=[pl.BlockSpec((None, lay.bt, head_dim), lambda b, i, h: (b, i, h))]
        * lay.n_in,
        out_shape=[jax.ShapeDtypeStruct((lay.b, lay.tp, lay.c), xp.dtype)] * lay.n_in,
        interpret=common.interpret(), compiler_params=_params(num_warps),
        name="short_conv_fwd")(posp, xp, w)
    return tuple(o[:, :lay.t] for o in outs)


def _backward(xp, posp, w, lay: _Layout, douts, *, head_dim, normalize, scale, eps,
              num_warps, dpre_dtype):
    """(dx (B, T, N, C) in x's dtype, the padded weights' gradient (taps, N, C) float32),
    in two programs: the cotangent of the conv's output (in dpre_dtype, one row block
    past the end, zeros there) with the weights' partial gradients, then dx from it."""
    b, t, n_in, c, taps, bt, tp, pad = lay
    blocks = tp // bt
    xs, pos_s, rows, weights = _specs(lay, head_dim)
    params = _params(num_warps)
    # a length of whole row blocks: each program reads its own rows of the cotangents,
    # no padded copies (the dpre kernel's `blocks`; 0: the time-padded form)
    dout_blocks = blocks if t == tp else 0
    if dout_blocks:
        last = blocks - 1
        rows = pl.BlockSpec((None, bt, head_dim),
                            lambda b, i, h: (b, jnp.minimum(i, last), h))
        douts = [d.astype(xp.dtype) for d in douts]
    else:
        douts = [_time_padded(d.astype(xp.dtype), lay) for d in douts]
    dpre, dw = pl.pallas_call(
        functools.partial(_dpre_kernel, taps=taps, pad=pad, bt=bt, normalize=normalize,
                          scale=scale, eps=eps, blocks=dout_blocks),
        grid=(b, blocks + 1, c // head_dim),
        in_specs=[pos_s, xs, weights] + [rows] * n_in,
        out_specs=[pl.BlockSpec((None, bt, n_in, head_dim), lambda b, i, h: (b, i, 0, h)),
                   pl.BlockSpec((None, None, taps, n_in, head_dim),
                                lambda b, i, h: (b, i, 0, 0, h))],
        out_shape=[jax.ShapeDtypeStruct((b, tp + bt, n_in, c), dpre_dtype),
                   jax.ShapeDtypeStruct((b, blocks + 1, taps, n_in, c), jnp.float32)],
        interpret=common.interpret(), compiler_params=params,
        name="short_conv_bwd_dpre")(posp, xp, w, *douts)
    dx = pl.pallas_call(
        functools.partial(_bwd_kernel, taps=taps, pad=pad, bt=bt, n_in=n_in),
        grid=(b, blocks, c // head_dim),
        in_specs=[pos_s, weights,
                  pl.BlockSpec((None, tp + bt, n_in, head_dim), lambda b, i, h: (b, 0, 0, h))],
        out_specs=pl.BlockSpec((None, bt, n_in, head_dim), lambda b, i, h: (b, i, 0, h)),
        out_shape=jax.ShapeDtypeStruct((b, tp, n_in, c), xp.dtype),
        interpret=common.interpret(), compiler_params=params,
        name="short_conv_bwd")(posp, w, dpre)
    return dx[:, :lay.t], jnp.sum(dw, axis=(0, 1))


def _padded_inputs(x, kernel, pos, block_t):
    """(x, positions and weights padded for the programs, the layout)."""
    lay = _layout(x.shape, kernel, block_t)
    return _time_padded(x, lay), _time_padded(pos, lay), _padded_kernel(kernel, lay.taps), lay


DPRE_DTYPES = ("float32", "input")


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7, 8, 9))
def conv_silu_norm(x, kernel, pos, head_dim, normalize, scale, eps, block_t, num_warps,
                   dpre_dtype="float32"):
    """See the module docstring: x (B, T, N, C), kernel (c, N, C), pos (B, T) int32 (each
    token's position in its document); normalize / scale: N static bools / floats;
    dpre_dtype: the backward's stored cotangent, "float32" or "input" (x's dtype).
    Returns the N outputs (B, T, C) in x's dtype."""
    return _vjp_fwd(x, kernel, pos, head_dim, normalize, scale, eps, block_t, num_warps,
                    dpre_dtype)[0]


def _vjp_fwd(x, kernel, pos, head_dim, normalize, scale, eps, block_t, num_warps,
             dpre_dtype):
    if dpre_dtype not in DPRE_DTYPES:
        raise ValueError(f"conv_silu_norm: dpre_dtype must be one of {DPRE_DTYPES}, "
                         f"got {dpre_dtype!r}")
    # the padded inputs are the residuals: the backward reads the same rows, padded once
    xp, posp, w, lay = _padded_inputs(x, kernel, pos, block_t)
    outs = _forward(xp, posp, w, lay, head_dim=head_dim, normalize=normalize, scale=scale,
                    eps=eps, num_warps=num_warps)
    return outs, (xp, posp, kernel)


def _vjp_bwd(head_dim, normalize, scale, eps, block_t, num_warps, dpre_dtype, saved,
             douts):
    xp, posp, kernel = saved
    t = douts[0].shape[1]  # the padded inputs keep every size but the length
    lay = _layout((xp.shape[0], t) + xp.shape[2:], kernel, block_t)
    dx, dw = _backward(xp, posp, _padded_kernel(kernel, lay.taps), lay, douts,
                       head_dim=head_dim, normalize=normalize, scale=scale, eps=eps,
                       num_warps=num_warps,
                       dpre_dtype=jnp.float32 if dpre_dtype == "float32" else xp.dtype)
    return dx, dw[lay.taps - kernel.shape[0]:].astype(kernel.dtype), None


conv_silu_norm.defvjp(_vjp_fwd, _vjp_bwd)
