"""Chunkwise forms of decayed linear attention and the gated delta rule (pure JAX).

The algebra is in the design notes (CHUNKWISE): within a chunk of C tokens, with
L[t, s] = sum of log-decays in (s, t] and G_t = sum up to t,

  linear attention:  O = (Q * e^G) S_0 + ((Q K^T) * e^L) V
                     S_C = e^{G_C} S_0 + (K * e^{G_C - G})^T V
  gated delta rule:  (I + A) [U~, W] = diag(beta) [V, K * e^G],
                     A[t, s] = beta_t e^{L[t,s]} k_t.k_s  (s < t),   U = U~ - W S_0
                     O = (Q * e^G) S_0 + ((Q K^T) * e^L) U,  S_C as above with U for V.

Three phases, so that only the small state recurrence runs sequentially:
  1. prepare (all chunks at once): decay factors, and for the delta rule the UT transform
     (a triangular solve per chunk) giving U~ and W;
  2. a lax.scan over chunks carrying the float32 state S (C x F x Dv work per step),
     emitting the state entering each chunk (and U for the delta rule);
  3. outputs (all chunks at once) from those states.
Past REMAT_TOKENS tokens, phases 1 and 3 run under jax.checkpoint: the backward pass keeps
their inputs and the chunk-boundary states, never a per-token state or the C x C
decay/score matrices, and recomputes the rest chunk-parallel. Shorter sequences keep them
(little memory) and compute the decay terms once for both phases.

Segments: a "run" index per token (kernels.common.run_ids). Pairs (t, s) in different runs
are masked out of L; S_0 reaches only tokens still in the run that was open before the
chunk; S_C keeps S_0 only if the chunk's last token is still in that run.

Arrays here are head-major and chunked, (B, H, N, C, dim), in the compute dtype (float32).
The "parallel" forms are the same code with one chunk holding the whole sequence.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels.common import einsum, masked_exp, pad_axis, segsum, suffix_sum_exclusive


# ----------------------------------------------------------------------------- geometry

def _decay_terms(g, run, prev_run, dtype=jnp.float32):
    """Decay factors of every chunk.

    g: (B,H,N,C) log-decays, or None for no decay; run: (B,N,C) run index; prev_run: (B,N)
    run open before the chunk. Returns
      decay (B,H,N,C,C): e^{L[t,s]} on same-run pairs s <= t, else 0;
      gamma (B,H,N,C): e^{G_t} for tokens still in S_0's run, else 0 (weight of S_0);
      key_weight (B,H,N,C): e^{G_C - G_s} for tokens in the chunk's last run, else 0;
      gamma_end (B,H,N): e^{G_C} if the last token is still in S_0's run, else 0.
    With g None the same masks as 0/1 in dtype, with a head axis of 1 (they broadcast):
    no cumsum or exp of zeros for XLA to constant-fold at great cost on long sequences.
    """
    c = run.shape[-1]
    causal = jnp.tril(jnp.ones((c, c), bool))
    same = (run[..., :, None] == run[..., None, :]) & causal  # (B,N,C,C)
    from_state = (run == prev_run[..., None])[:, None]  # (B,1,N,C)
    in_last = (run == run[..., -1:])[:, None]
    if g is None:
        return tuple(m.astype(dtype) for m in (same[:, None], from_state, in_last,
                                               from_state[..., -1]))
    decay = masked_exp(same[:, None], segsum(g))

    g_incl = jnp.cumsum(g, axis=-1)
    gamma = masked_exp(from_state, g_incl)
    key_weight = masked_exp(in_last, suffix_sum_exclusive(g))
    gamma_end = masked_exp(from_state[..., -1], g_incl[..., -1])
    return decay, gamma, key_weight, gamma_end


def _substitute(a, rhs, *, reverse: bool):
    """x with x_i = rhs_i - a[i, :] x, row by row (forward, or backward when reverse).

    a must be zero wherever row i would read a row not yet solved (strictly lower for the
    forward order, strictly upper for the reverse one). Plain XLA ops rather than LAPACK's
    trsm: on small CPU machines XLA's thread pool can deadlock inside that custom call.
    """
    c = a.shape[-1]

    def row(step, x):
        i = c - 1 - step if reverse else step
        xi = rhs[..., i, :] - einsum("...j,...jd->...d", a[..., i, :], x)
        return x.at[..., i, :].set(xi)
    return jax.lax.fori_loop(0, c, row, rhs)


def _strictly_lower_part(x):
    c = x.shape[-1]
    return jnp.where(jnp.tril(jnp.ones((c, c), bool), -1), x, 0.0)


@jax.custom_vjp
def _solve_by_substitution(a, rhs):
    """Solve (I + a) x = rhs for strictly lower triangular a (..., C, C), row by row."""
    return _substitute(a, rhs, reverse=False)


def _solve_by_substitution_fwd(a, rhs):
    x = _solve_by_substitution(a, rhs)
    return x, (a, x)


def _solve_by_substitution_bwd(res, dx):
    # x = (I + a)^-1 rhs  =>  d_rhs = (I + a)^-T dx,  d_a = -strict_lower(d_rhs x^T).
    a, x = res
    d_rhs = _substitute(jnp.swapaxes(a, -1, -2), dx, reverse=True)
    return _strictly_lower_part(-einsum("...id,...jd->...ij", d_rhs, x)), d_rhs


_solve_by_substitution.defvjp(_solve_by_substitution_fwd, _solve_by_substitution_bwd)


# The diagonal blocks _unit_lower_inverse starts from: inverted by substitution written
# out elementwise (one fused pass over all blocks), so that the recursive halving runs
# only the levels above them. Each level is a few small ops in a row on the step's
# critical path: on a 2-core CPU the levels from 1 x 1 blocks cost more than the matmuls
# in them (docs/benchmarks.md, session 24).
BASE_BLOCK = 8


def _small_unit_lower_inverse(blocks):
    """(I + a)^-1 of every m x m strictly lower a in blocks (..., m, m), row by row:
    x[i][j] = -a[i][j] - sum over j < k < i of a[i][k] x[k][j], as elementwise ops over
    the leading axes (m (m - 1) (m - 2) / 6 multiply-adds, m = BASE_BLOCK: 56). The same
    recurrence as _substitute, unrolled: no loop, so XLA fuses it into one pass."""
    m = blocks.shape[-1]
    a = [[blocks[..., i, j] for j in range(m)] for i in range(m)]
    one, zero = jnp.ones_like(a[0][0]), jnp.zeros_like(a[0][0])
    x = [[one if i == j else zero for j in range(m)] for i in range(m)]
    for i in range(1, m):
        for j in range(i):
            entry = -a[i][j]
            for k in range(j + 1, i):
                entry = entry - a[i][k] * x[k][j]
            x[i][j] = entry
    return jnp.stack([jnp.stack(row, axis=-1) for row in x], axis=-2)


def _unit_lower_inverse(a, base: int = BASE_BLOCK):
    """(I + a)^-1 for strictly lower triangular a (..., C, C), by recursive halving.

    With X = I + a split in halves [[P, 0], [Q, R]], X^-1 = [[P^-1, 0], [-R^-1 Q P^-1,
    R^-1]]. Every diagonal block of one size is inverted at once from the two halves below
    it, so C = 2^n takes n - log2(base) levels of two batched matmuls each, starting from
    the base x base diagonal blocks inverted elementwise (_small_unit_lower_inverse). The
    recursive triangular inverse is as accurate as substitution (tests: keys nearly
    parallel too), where the power series (I - a)(I + a^2)... is not. a is padded with
    zeros to a power of two (at least base), which leaves its C x C block unchanged.
    """
    c = a.shape[-1]
    size = max(1 << max(c - 1, 0).bit_length(), base)
    ap = pad_axis(pad_axis(a, size, -1), size, -2)
    lead = ap.shape[:-2]
    inv = _small_unit_lower_inverse(_diagonal_blocks(ap, base))  # (..., size/base, b, b)
    half = base
    while half < size:
        n = size // (2 * half)  # diagonal blocks of 2 * half rows
        q = _diagonal_blocks(ap, 2 * half)[..., half:, :half]
        pairs = inv.reshape(lead + (n, 2, half, half))
        p_inv, r_inv = pairs[..., 0, :, :], pairs[..., 1, :, :]
        off = -einsum("...ij,...jk->...ik", r_inv,
                      einsum("...ij,...jk->...ik", q, p_inv))
        top = jnp.concatenate([p_inv, jnp.zeros_like(p_inv)], axis=-1)
        inv = jnp.concatenate([top, jnp.concatenate([off, r_inv], axis=-1)], axis=-2)
        half *= 2
    return inv[..., 0, :c, :c]


def _diagonal_blocks(x, m: int):
    """The C/m diagonal m x m blocks of x (..., C, C) as (..., C/m, m, m), by a pad,
    reshapes and slices: block b's row i starts at flat index b m (C + 1) + i C, so rows
    of m (C + 1) hold one block each (its m rows of C, then the gap to the next). Linear
    in C^2, where a masked sum over the blocks costs C/m times that (most of a small
    model's step on the CPU), and no gather (whose gradient is a scatter)."""
    c = x.shape[-1]
    n = c // m
    lead = x.shape[:-2]
    flat = pad_axis(x.reshape(lead + (c * c,)), n * m * (c + 1), -1)
    rows = flat.reshape(lead + (n, m * (c + 1)))[..., :m * c]
    return rows.reshape(lead + (n, m, c))[..., :m]


@jax.custom_vjp
def _solve_by_inverse(a, rhs):
    """Solve (I + a) x = rhs for strictly lower triangular a (..., C, C) as T rhs with
    T = (I + a)^-1 (_unit_lower_inverse). The backward pass needs no solve: d_rhs = T^T dx."""
    return einsum("...ij,...jd->...id", _unit_lower_inverse(a), rhs)


def _solve_by_inverse_fwd(a, rhs):
    t = _unit_lower_inverse(a)
    x = einsum("...ij,...jd->...id", t, rhs)
    return x, (t, x)


def _solve_by_inverse_bwd(res, dx):
    t, x = res
    d_rhs = einsum("...ji,...jd->...id", t, dx)
    return _strictly_lower_part(-einsum("...id,...jd->...ij", d_rhs, x)), d_rhs


_solve_by_inverse.defvjp(_solve_by_inverse_fwd, _solve_by_inverse_bwd)

# Chunks of up to this many tokens solve through the explicit inverse (C^3 / 3 work per
# chunk, about the substitution's C^2 (F + Dv) / 2 at C = 64 with F = Dv = 32, in
# log2(C) matmul steps instead of C sequential rows, and no solve in the backward pass);
# longer ones (the parallel form of a long sequence) row by row, whose work grows as C^2
# only.
INVERSE_MAX_CHUNK = 128


def _solve_unit_lower(a, rhs, inverse_max_chunk=INVERSE_MAX_CHUNK):
    """Solve (I + a) x = rhs for strictly lower triangular a (..., C, C), in float32.

    Plain XLA ops rather than LAPACK's trsm: on small CPU machines XLA's thread pool can
    deadlock inside that custom call."""
    if a.shape[-1] <= inverse_max_chunk:
        return _solve_by_inverse(a, rhs)
    return _solve_by_substitution(a, rhs)


# ----------------------------------------------------------------------------- phases

def _linear_prepare(k, v, terms):
    """Each chunk's own contribution to the state, (K * e^{G_C - G})^T V, and e^{G_C}."""
    _, _, key_weight, gamma_end = terms
    write = einsum("...cf,...cd->...fd", k * key_weight[..., None], v)
    return write, gamma_end


def _delta_prepare(k, v, beta, terms, with_state=True):
    """The UT transform of every chunk: U~ = T V, W = T (K * e^G), T = (I + A)^-1 diag(beta);
    plus the key weights for the state update. W only multiplies the state entering the
    chunk: with_state=False (a single chunk from the zero state) leaves it out (None)."""
    decay, gamma, key_weight, gamma_end = terms
    c = k.shape[-2]
    strict = jnp.tril(jnp.ones((c, c), bool), -1)
    kk = einsum("...tf,...sf->...ts", k, k)
    a = jnp.where(strict, beta[..., :, None] * decay * kk, 0.0)
    if not with_state:
        u_tilde = _solve_unit_lower(a, beta[..., None] * v)
        return u_tilde, None, k * key_weight[..., None], gamma_end
    rhs = beta[..., None] * jnp.concatenate([v, k * gamma[..., None]], axis=-1)
    sol = _solve_unit_lower(a, rhs)
    dv = v.shape[-1]
    return sol[..., :dv], sol[..., dv:], k * key_weight[..., None], gamma_end


def _outputs(q, k, values, states, terms):
    """O = (Q * e^G) S_0 + ((Q K^T) * e^L) values, for every chunk at once.

    states: (B,H,N,F,Dv), the state entering each chunk ((B,H,F,Dv) for a single chunk),
    or None for a single chunk from the zero state (no state term)."""
    decay, gamma, _, _ = terms
    scores = einsum("...tf,...sf->...ts", q, k) * decay
    o = einsum("...ts,...sd->...td", scores, values)
    if states is None:
        return o
    return einsum("...tf,...fd->...td", q * gamma[..., None], states) + o


def _with_terms(phase, dtype):
    """phase(*arrays, terms) as a function of (*arrays, g, run, prev_run), under
    jax.checkpoint: the backward pass keeps the phase's inputs only and recomputes the
    decay terms and the C x C matrices chunk-parallel."""
    def f(*args):
        *arrays, g, run, prev_run = args
        return phase(*arrays, _decay_terms(g, run, prev_run, dtype))
    return jax.checkpoint(f)


def _phases(prepare, remat, g, run, prev_run, prepare_dtype, output_dtype):
    """(prepare, outputs) as functions of their arrays alone: each recomputing its decay
    terms under jax.checkpoint (remat), or both sharing one computation of them."""
    if remat:
        def run_prepare(*arrays):
            return _with_terms(prepare, prepare_dtype)(*arrays, g, run, prev_run)

        def run_outputs(*arrays):
            return _with_terms(_outputs, output_dtype)(*arrays, g, run, prev_run)
        return run_prepare, run_outputs
    terms = _decay_terms(g, run, prev_run, output_dtype)
    return (lambda *arrays: prepare(*arrays, terms),
            lambda *arrays: _outputs(*arrays, terms))


def _chunk_axis_first(x):
    return jnp.moveaxis(x, 2, 0)  # (B,H,N,...) -> (N,B,H,...)


def _chunk_axis_back(x):
    return jnp.moveaxis(x, 0, 2)


def _scan_chunks(step, state, xs, single):
    """lax.scan of step over the chunk axis of xs ((B,H,N,...) arrays), under
    jax.checkpoint; a single chunk (xs without a chunk axis) is the step itself."""
    if single:
        return step(state, xs)
    final, ys = jax.lax.scan(jax.checkpoint(step), state,
                             tuple(_chunk_axis_first(x) for x in xs))
    return final, jax.tree.map(_chunk_axis_back, ys)


def _linear_states(state, write, gamma_end):
    """S_{n+1} = e^{G_C} S_n + write_n. Returns (states entering each chunk, final); state
    None: a single chunk from the zero state (states None)."""
    if state is None:
        return None, write

    def step(s, x):
        w, ge = x
        return ge[..., None, None] * s + w, s

    final, states = _scan_chunks(step, state, (write, gamma_end), write.ndim == 4)
    return states, final


def _delta_states(state, u_tilde, w, weighted_k, gamma_end):
    """U_n = U~_n - W_n S_n; S_{n+1} = e^{G_C} S_n + (K e^{G_C - G})^T U_n.

    Returns (states entering each chunk, U, final state); state None: a single chunk from
    the zero state (states None, w unused, U = U~)."""
    if state is None:
        return None, u_tilde, einsum("...sf,...sd->...fd", weighted_k, u_tilde)

    def step(s, x):
        ut, w_n, kw, ge = x
        u = ut - einsum("bhtf,bhfd->bhtd", w_n, s)
        new = ge[..., None, None] * s + einsum("bhsf,bhsd->bhfd", kw, u)
        return new, (s, u)

    final, (states, u) = _scan_chunks(step, state, (u_tilde, w, weighted_k, gamma_end),
                                      gamma_end.ndim == 2)
    return states, u, final


# ----------------------------------------------------------------------------- layout

def _pad_split(x, axis, pieces, size, mode="constant"):
    """Pad axis `axis` of x to pieces * size and split it into (pieces, size)."""
    x = pad_axis(x, pieces * size, axis, mode)
    return x.reshape(x.shape[:axis] + (pieces, size) + x.shape[axis + 1:])


def _to_chunks(per_token, run, chunk_size):
    """Pad the time axis to whole chunks and split it: (B,H,T,...) -> (B,H,N,C,...).

    Padding tokens change nothing: zero keys/values/beta, log-decay 0, and the last run
    index, so the final state is the state after the last real token. Also returns the run
    index (B,N,C) and the run open before each chunk, (B,N): run 0 (the one an initial
    state belongs to) for chunk 0.

    A sequence of one chunk keeps no chunk axis: (B,H,C,...), run (B,C), prev_run (B,).
    The phases are written for any leading axes, and XLA's CPU reductions over an array
    with an axis of size 1 run several times slower (x8 for the delta rule's beta and
    gamma gradients at B32 H2 C64).
    """
    b, t = run.shape
    c = min(chunk_size, t)
    n = -(-t // c)
    if n == 1:
        return list(per_token), run, jnp.zeros((b,), run.dtype)
    chunks = [None if x is None else _pad_split(x, 2, n, c) for x in per_token]
    run_c = _pad_split(run, 1, n, c, mode="edge")  # (B,N,C)
    prev_run = jnp.concatenate([jnp.zeros((b, 1), run.dtype), run_c[:, :-1, -1]], axis=1)
    return chunks, run_c, prev_run


def _from_chunks(o, t):
    """(B,H,N,C,D) or (B,H,C,D) -> (B,H,T,D)."""
    o = o.reshape(o.shape[:2] + (-1,) + o.shape[-1:])
    return o[:, :, :t]


# ----------------------------------------------------------------------------- entry points

# Sequences of up to this many tokens (padded to whole chunks) run without jax.checkpoint:
# the backward pass then keeps the C x C matrices of every chunk (a few times C floats per
# token and head) instead of recomputing them, which for short sequences is little memory
# and saves the recompute (a third of the fwd+bwd work of the delta rule at T = C = 64).
# Longer ones recompute, so the backward never keeps per-token states or C x C matrices
# of a long sequence.
REMAT_TOKENS = 256


def _remat(remat, run_c):
    """remat as given, or (None) by size: past REMAT_TOKENS padded tokens."""
    return run_c[0].size > REMAT_TOKENS if remat is None else remat


def zero_state(k, v):
    """The zero state S (B,H,F,Dv) of head-major keys (B,H,T,F) and values (B,H,T,Dv)."""
    return jnp.zeros(k.shape[:2] + (k.shape[-1], v.shape[-1]), k.dtype)


def _zero_state_unless_single(state, single, k, v):
    """None (the zero state, known statically) stays None for a single chunk, whose forms
    then drop the state's terms; the scan over several chunks carries zeros."""
    return zero_state(k, v) if state is None and not single else state


def linear_attention_chunk(q, k, v, g, run, state, chunk_size, remat=None):
    """Head-major inputs (B,H,T,.), g (B,H,T) or None (no decay), run (B,T), state
    (B,H,F,Dv) or None (zeros). remat: recompute the chunk-parallel phases in the backward
    pass (None: by size, REMAT_TOKENS).

    Returns (o (B,H,T,Dv), final state). The normaliser is the caller's column of ones."""
    t = q.shape[2]
    (qc, kc, vc, gc), run_c, prev_run = _to_chunks([q, k, v, g], run, chunk_size)
    state = _zero_state_unless_single(state, run_c.ndim == 2, k, v)
    prepare, outputs = _phases(_linear_prepare, _remat(remat, run_c), gc, run_c, prev_run,
                               k.dtype, q.dtype)
    write, gamma_end = prepare(kc, vc)
    states, final = _linear_states(state, write, gamma_end)
    o = outputs(qc, kc, vc, states)
    return _from_chunks(o, t), final


def gated_delta_chunk(q, k, v, g, beta, run, state, chunk_size, remat=None):
    """Head-major inputs (B,H,T,.), g and beta (B,H,T), run (B,T), state (B,H,K,V) or
    None (zeros). remat: as linear_attention_chunk's."""
    t = q.shape[2]
    (qc, kc, vc, gc, bc), run_c, prev_run = _to_chunks([q, k, v, g, beta], run, chunk_size)
    state = _zero_state_unless_single(state, run_c.ndim == 2, k, v)
    prepare = functools.partial(_delta_prepare, with_state=state is not None)
    prepare, outputs = _phases(prepare, _remat(remat, run_c), gc, run_c, prev_run,
                               jnp.float32, q.dtype)
    u_tilde, w, weighted_k, gamma_end = prepare(kc, vc, bc)
    states, u, final = _delta_states(state, u_tilde, w, weighted_k, gamma_end)
    o = outputs(qc, kc, u, states)
    return _from_chunks(o, t), final


def linear_attention_parallel(q, k, v, g, run, state):
    """Masked quadratic form: the whole sequence as one chunk (T x T decay matrix)."""
    return linear_attention_chunk(q, k, v, g, run, state, q.shape[2])


def gated_delta_parallel(q, k, v, g, beta, run, state):
    """Quadratic form: one T x T triangular solve for the whole sequence."""
    return gated_delta_chunk(q, k, v, g, beta, run, state, q.shape[2])


# Past this many tokens the chunk forms run segment by segment (in_segments). They hold
# per-chunk tensors of the whole sequence (the (B,H,N,F,D) chunk-start states, the
# chunk-major copies of the inputs), several times its K x V state bytes per chunk: a
# Based prefill of B64 T32768 (then 273 Taylor features) asked the H200 for 354 GiB.
SEGMENT_TOKENS = 4096


def in_segments(chunk_form, per_token, run, state, segment):
    """chunk_form (linear_attention_chunk / gated_delta_chunk with the chunk size bound)
    run over `segment`-token pieces one after another (lax.scan carrying the state), so
    its per-chunk tensors exist for one segment at a time. Exact: each segment starts
    from the state the previous one ended in. per_token: the (B,H,T,...) inputs (None
    allowed), run (B,T), state (B,H,F,Dv) or None (zeros). Padding tokens change nothing (zeros, the last run index).

    Run indices are made relative to the run open before each segment, so the carried
    state continues that run (index 0, the run an initial state belongs to) and a new
    run inside the segment starts from zero as in the whole-sequence form."""
    b, h, t = next(x for x in per_token if x is not None).shape[:3]
    n = -(-t // segment)
    if state is None:  # the scan carries the zero state
        state = zero_state(per_token[1], per_token[2])

    def split(x, axis, mode="constant"):   # (..., T, ...) -> (N, ..., segment, ...)
        return jnp.moveaxis(_pad_split(x, axis, n, segment, mode), axis, 0)

    runs = split(run, 1, mode="edge")                                    # (N, B, seg)
    open_before = jnp.concatenate([jnp.zeros((1, b), run.dtype), runs[:-1, :, -1]], axis=0)
    xs = ([None if x is None else split(x, 2) for x in per_token],
          runs - open_before[..., None])

    def step(s, piece):
        inputs, r = piece
        o, s = chunk_form(*inputs, r, s)
        return s, o

    final, o = jax.lax.scan(step, state, xs)                             # o (N,B,H,seg,D)
    o = jnp.moveaxis(o, 0, 2).reshape(b, h, n * segment, o.shape[-1])
    return o[:, :, :t], final
