"""Context (sequence) parallelism: one sequence split along time over the mesh axis
`sequence`, each device holding T / n consecutive tokens (device i the i-th piece).

The entry points take kernels.ops' arguments and return its results. Where no mesh with a
`sequence` axis of size > 1 is active (`sequence_mesh`), or for a case they do not split
(below), they call kernels.ops unchanged, so XLA's partitioner does the work; decoding
(one token, no mesh) never changes. Inside they are one `jax.shard_map` manual over
`sequence` only: the data, fsdp and tensor axes stay automatic.

Linear ops (linear attention with or without decay and normaliser; the gated delta rule)
----------------------------------------------------------------------------------------
Each device runs the op's own form (`impl`: the chunk form on CPU, Pallas on GPU/TPU) on
its piece from a zero state. Every linear op's state is affine in the state it starts
from, so the piece is summarised by its state map

    S_out = A S_in + B,     B = the piece's final state from zero,

with A = exp(sum of the piece's log-decays) (a number per (batch, head)) for linear
attention and A = prod_t alpha_t (I - beta_t k_t k_t^T) (a K x K matrix) for the delta
rule; both are 0 where a document starts inside the piece. The maps compose as
(A2, B2) o (A1, B1) = (A2 A1, A2 B1 + B2), an associative product, so the state entering
device i, (M_{i-1} o ... o M_0)(S_init), is an exclusive scan over the device axis:
`_exclusive_scan`, Hillis-Steele doubling by `ppermute`: round r sends each device's
running product to the device 2^r later (ceil(log2 n) rounds, then one shift by one).
Chosen over an all-gather of all n maps with a local prefix because every device then
sends and receives one map per round, ceil(log2 n) + 1 in all rather than n - 1, and
composes log2 n maps rather than up to n - 1 (for the delta rule each composition is a
K x K by K x (K + V) matmul per head); the rounds are as few as a tree's and the code
is the same for any n. Each device then corrects its outputs with its incoming state
S_in: o_t += (contribution of S_in to o_t), below; its final state is A S_in + B, and the
sequence's final state is the last device's.

Packed documents: the local op resets the state where the ids change inside the piece
(so A is 0 there and the tokens after it get no correction); across the device boundary
the state carries on only if the piece's first id equals the previous piece's last one
(one id sent by ppermute): S_in is multiplied by that 0/1 `cont` (A too, so that the
composed maps drop everything before a document that starts at the boundary). An
initial state belongs to the first document of the whole sequence, as in kernels.ops.

Linear attention's correction. With G_t = sum_{s<=t} g_s over the piece,
S_t = exp(G_t) S_in + (the zero-start state), so o_t += exp(G_t) S_in^T q_t for tokens
still in the piece's first document (0 after a reset); the normaliser is the same with
the column of ones appended to V (z is that column of S), and the division happens after
the correction. A = exp(G_T) (0 if the last token is past a reset).

The gated delta rule's correction (CHUNKWISE.md). In a chunk, U = U~ - W S_0 depends on
the chunk's incoming state S_0, so the output does not simply gain (Q * gamma) S_0:

    O   = (Q * gamma) S_0 + P U = O|_{S_0=0} + (Q * gamma - P W) S_0,
    S_C = gamma_C S_0 + Kd^T U  = S_C|_{S_0=0} + (gamma_C I - Kd^T W) S_0,

with P = (Q K^T) * D_incl, Kd = K * exp(G_C - G), W = T (K * gamma). Both are linear in
S_0, and so, chunk after chunk, is everything downstream: o_t = o_t|_{S_in=0} +
S_in^T q~_t and S_end = A S_in + B with q~_t = A_t^T q_t, A_t the product of the step
maps alpha_s (I - beta_s k_s k_s^T) up to t (the chunk form's effective query Q * gamma -
P W, carried across the chunks). These are what the same chunk machinery returns for the
value columns of an identity state: the delta rule acts on each value column of S
separately, so one call with V' = [V | 0] (V + K value columns) from S_0 = [0 | I] gives
outputs [o|_{S_in=0} | q~] and final state [B | A] (with V = 0 the UT transform gives
U~ = 0, hence U = -W I and O = Q * gamma - P W, as above). After the scan,
o = o|_{S_in=0} + q~ S_in: a (T/n x K) x (K x V) matmul per head. The extra K value
columns are the price (the chunk form's value-side work at V + K columns instead of V);
nothing per token is stored beyond q~.

Gradients: jax.grad through the shard_map is exact (ppermute's transpose is the reverse
ppermute, psum's is the identity on the replicated cotangent), and the local ops keep
their own VJPs (the chunk form's, the Pallas kernels'), so no custom VJP is needed here.

Short convolutions: each device sends its last c - 1 inputs (and their segment ids) to
the next one (`halo`), device 0 takes the caller's state; then the local conv is exact.

Softmax attention: keys, values and segment ids are all-gathered along the sequence
(O(T) keys per device: fine at the lengths this repository trains; ring attention would
keep O(T / n)), each device's queries attend to them under the causal mask offset by its
position. Sliding windows of w <= T / n + 1 tokens need only the previous device's last
w - 1 keys and values (`halo`); longer windows use the all-gather. Attention dropout is
not split (its mask would be drawn per device): those calls go to kernels.ops.

Not split, kernels.ops instead (exact, XLA partitions them): T not a multiple of the
number of devices, attention with dropout, a short conv with c - 1 > T / n.

On GPU/TPU the local op is the Pallas kernel for 16-bit inputs, with V + K value columns
for the delta rule (Dv + 1 with the normaliser), padded to the next tiled width: K = V =
128 runs at 256; past the widest tile (K + V > 256) impl="auto" takes the chunk form
there, impl="pallas" raises NotImplementedError.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from kernels import attention, ops
from kernels.common import masked_exp, run_ids

AXIS = "sequence"

_MESH: contextvars.ContextVar = contextvars.ContextVar("sequence_mesh", default=None)


@contextlib.contextmanager
def sequence_mesh(mesh):
    """Within this context the entry points split along `mesh`'s `sequence` axis. It is
    read when a function is traced. Entered outside jax.jit it also sets jax's mesh
    (`jax.set_mesh`), which jit's cache keys on, so a function jitted before it is traced
    again inside it; entered while tracing (training.runtime wraps its steps so that they
    trace inside it) it holds for that trace. A mesh set by `jax.set_mesh` alone splits
    the same way."""
    token = _MESH.set(mesh)
    try:
        outer = jax.set_mesh(mesh)
    except ValueError:  # inside a trace: jax's mesh context cannot be changed there
        outer = contextlib.nullcontext()
    try:
        with outer:
            yield mesh
    finally:
        _MESH.reset(token)


def active_mesh(mesh=None):
    """`mesh`, else the context's (sequence_mesh's, else jax.set_mesh's), if it has a
    `sequence` axis of more than one device; None otherwise."""
    if mesh is None:
        mesh = _MESH.get()
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or AXIS not in mesh.axis_names or mesh.shape[AXIS] == 1:
        return None
    return mesh


def _split_mesh(mesh, length):
    """The mesh to split over for a sequence of `length`, or None to leave it whole."""
    mesh = active_mesh(mesh)
    if mesh is None or length % mesh.shape[AXIS]:
        return None
    return mesh


def _shard_map(fn, mesh, in_specs, out_specs):
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                         axis_names=frozenset({AXIS}))


# ----------------------------------------------------------------------------- device-axis helpers
# Called inside the shard_map (manual over AXIS).

def _index_and_size():
    return jax.lax.axis_index(AXIS), jax.lax.axis_size(AXIS)


def _shift(x, by: int = 1):
    """x of device i - by on device i (zeros on the first `by` devices)."""
    n = jax.lax.axis_size(AXIS)
    return jax.lax.ppermute(x, AXIS, [(j, j + by) for j in range(n - by)])


def _varying(x):
    """x typed as differing between devices (a local op's carry that starts from a state
    made here, e.g. the zero state, must be, for shard_map's type check)."""
    return jax.lax.pcast(x, (AXIS,), to="varying")


def _select(pred, a, b):
    """where(pred, a, b) leaf by leaf; pred a scalar."""
    return jax.tree.map(lambda x, y: jnp.where(pred, x, y), a, b)


def _from_last(x):
    """The last device's x on every device (one masked psum: replicated, invariant)."""
    i, n = _index_and_size()
    return jax.tree.map(lambda a: jax.lax.psum(jnp.where(i == n - 1, a, jnp.zeros_like(a)),
                                               AXIS), x)


def _exclusive_scan(elem, compose, identity, need_first=True):
    """prod_{j<i} elem_j (later o earlier, compose(later, earlier)) on device i, identity on
    device 0: Hillis-Steele doubling with ppermute, ceil(log2 n) rounds and one shift.
    elem is a pair (A, B); need_first=False: the caller needs only B of the result (no
    initial state), so the last shift sends B alone and A comes back as identity's."""
    i, n = _index_and_size()
    cur, d = elem, 1
    while d < n:
        got = _shift(cur, d)
        cur = _select(i >= d, compose(cur, got), cur)
        d *= 2
    if not need_first:
        return identity[0], jnp.where(i >= 1, _shift(cur[1]), identity[1])
    return _select(i >= 1, _shift(cur), identity)


def _continues(seg):
    """(B,) bool: the piece's first token continues the document the previous piece ended
    in (True on device 0, whose incoming state is the caller's initial state); None for
    one document per row."""
    if seg is None:
        return None
    i, _ = _index_and_size()
    prev_last = _shift(seg[:, -1])
    return (i == 0) | (seg[:, 0] == prev_last)


def halo(x, width: int, fill, axis: int = 1):
    """The previous device's last `width` entries of x along `axis` (device 0: fill, an
    array of that shape). Inside the shard_map."""
    i, _ = _index_and_size()
    tail = jax.lax.slice_in_dim(x, x.shape[axis] - width, x.shape[axis], axis=axis)
    return jnp.where(i == 0, fill, _shift(tail))


# ----------------------------------------------------------------------------- linear attention

def linear_attention(q, k, v, *, normalize=True, eps=1e-6, log_decay=None, segment_ids=None,
                     initial_state=None, return_state=False, impl="auto", chunk_size=64,
                     pallas_tuning=None, mesh=None, taylor_qk=None):
    """kernels.ops.linear_attention, split along time over the `sequence` mesh axis
    (module docstring); the same arguments and results. mesh: the mesh to split over
    (None: the sequence_mesh context's). taylor_qk reaches the op where nothing is split
    (the split pieces run on the features alone, which is exact)."""
    call = functools.partial(ops.linear_attention, normalize=normalize, eps=eps,
                             impl=impl, chunk_size=chunk_size, pallas_tuning=pallas_tuning)
    t = q.shape[1]
    mesh = _split_mesh(mesh, t)
    if mesh is None:
        res = call(q, k, v, log_decay=log_decay, segment_ids=segment_ids,
                   initial_state=initial_state, return_state=True, taylor_qk=taylor_qk)
        return res if return_state else res[0]
    b, _, h, f = q.shape
    dv = v.shape[-1]
    out_dtype = jnp.result_type(q, k, v)
    decay = None if log_decay is None else jnp.asarray(log_decay)
    per_head = decay is not None and decay.shape == (h,)
    if decay is not None and not per_head and decay.shape != (b, t, h):
        raise ValueError(f"linear_attention: log_decay must have shape (heads,) = ({h},) "
                         f"or (batch, time, heads) = {(b, t, h)}, got {decay.shape}")
    if initial_state is not None and normalize:
        s0, z0 = initial_state
        initial_state = jnp.concatenate([jnp.asarray(s0, jnp.float32),
                                         jnp.asarray(z0, jnp.float32)[..., None]], -1)

    def local(q, k, v, decay, seg, s0):
        tl = q.shape[1]
        if normalize:  # the normaliser is the state of a value column of ones
            v = jnp.concatenate([v, jnp.ones(v.shape[:-1] + (1,), v.dtype)], -1)
        zero = _varying(jnp.zeros((b, h, f, v.shape[-1]), jnp.float32))
        o, s_zero = call(q, k, v, normalize=False, log_decay=decay, segment_ids=seg,
                         initial_state=zero, return_state=True)
        run = run_ids(seg, b, tl)
        first = (run == 0)[..., None]                                   # (B, tl, 1)
        if decay is None:
            gamma = jnp.broadcast_to(first, (b, tl, h)).astype(jnp.float32)
        else:
            g = jnp.broadcast_to(decay.astype(jnp.float32), (b, tl, h))
            gamma = masked_exp(first, jnp.cumsum(g, axis=1))            # (B, tl, H)
        a = gamma[:, -1]                                                # (B, H)
        cont = _continues(seg)
        if cont is not None:
            a = a * cont[:, None]
        a_in, s_in = _exclusive_scan(
            (a, s_zero), lambda later, earlier: (later[0] * earlier[0],
                                                 later[0][..., None, None] * earlier[1]
                                                 + later[1]),
            (jnp.ones_like(a), jnp.zeros_like(s_zero)), need_first=s0 is not None)
        if s0 is not None:  # the caller's state, through every earlier piece
            s_in = s_in + a_in[..., None, None] * s0
        if cont is not None:
            s_in = s_in * cont[:, None, None, None]
        corr = jnp.einsum("bthf,bhfd->bthd", q.astype(jnp.float32) * gamma[..., None],
                          s_in, precision=jax.lax.Precision.HIGHEST)
        o = o.astype(jnp.float32) + corr
        final = _from_last(a[..., None, None] * s_in + s_zero)
        if normalize:
            o = o[..., :dv] / (o[..., dv:] + eps)
        return o.astype(out_dtype), final

    seq = P(None, AXIS)
    specs = (seq, seq, seq, None if decay is None else (P() if per_head else seq),
             None if segment_ids is None else seq, None if initial_state is None else P())
    o, final = _shard_map(local, mesh, specs, (seq, P()))(q, k, v, decay, segment_ids,
                                                          initial_state)
    if normalize:
        final = (final[..., :dv], final[..., dv])
    return (o, final) if return_state else o


# ----------------------------------------------------------------------------- gated delta rule

def gated_delta_rule(q, k, v, log_alpha, beta, *, segment_ids=None, initial_state=None,
                     return_state=False, impl="auto", chunk_size=64, pallas_tuning=None,
                     mesh=None):
    """kernels.ops.gated_delta_rule, split along time over the `sequence` mesh axis
    (module docstring: the identity-state columns give each token's q~ = A_t^T q and
    the piece's transform A); the same arguments and results."""
    call = functools.partial(ops.gated_delta_rule, impl=impl, chunk_size=chunk_size,
                             pallas_tuning=pallas_tuning)
    t = q.shape[1]
    mesh = _split_mesh(mesh, t)
    if mesh is None:
        return call(q, k, v, log_alpha, beta, segment_ids=segment_ids,
                    initial_state=initial_state, return_state=return_state)
    b, _, h, kd = q.shape
    dv = v.shape[-1]
    out_dtype = jnp.result_type(q, k, v)

    def local(q, k, v, log_alpha, beta, seg, s0):
        # [V | 0] from [0 | I]: outputs [o from zero | q~], final state [B | A].
        v_ext = jnp.concatenate([v, jnp.zeros(v.shape[:-1] + (kd,), v.dtype)], -1)
        eye = jnp.broadcast_to(jnp.eye(kd, dtype=jnp.float32), (b, h, kd, kd))
        start = _varying(jnp.concatenate([jnp.zeros((b, h, kd, dv), jnp.float32), eye], -1))
        o_ext, s_ext = call(q, k, v_ext, log_alpha, beta, segment_ids=seg,
                            initial_state=start, return_state=True)
        o_zero, q_eff = o_ext[..., :dv], o_ext[..., dv:]
        s_zero, a = s_ext[..., :dv], s_ext[..., dv:]                 # B (B,H,K,V), A (B,H,K,K)
        cont = _continues(seg)
        if cont is not None:
            a = a * cont[:, None, None, None]

        def mm(x, y):
            return jnp.einsum("bhij,bhjd->bhid", x, y, precision=jax.lax.Precision.HIGHEST)

        def compose(later, earlier):
            return mm(later[0], earlier[0]), mm(later[0], earlier[1]) + later[1]
        a_in, s_in = _exclusive_scan((a, s_zero), compose,
                                     (jnp.broadcast_to(eye, a.shape), jnp.zeros_like(s_zero)),
                                     need_first=s0 is not None)
        if s0 is not None:
            s_in = s_in + mm(a_in, s0)
        if cont is not None:
            s_in = s_in * cont[:, None, None, None]
        corr = jnp.einsum("bthk,bhkd->bthd", q_eff.astype(jnp.float32), s_in,
                          precision=jax.lax.Precision.HIGHEST)
        o = (o_zero.astype(jnp.float32) + corr).astype(out_dtype)
        # a already carries cont, and s_in was multiplied by it: A (cont S) = (cont A) S.
        final = _from_last(mm(a, s_in) + s_zero)
        return o, final

    seq = P(None, AXIS)
    specs = (seq, seq, seq, seq, seq, None if segment_ids is None else seq,
             None if initial_state is None else P())
    o, final = _shard_map(local, mesh, specs, (seq, P()))(
        q, k, v, jnp.asarray(log_alpha), jnp.asarray(beta), segment_ids,
        None if initial_state is None else jnp.asarray(initial_state, jnp.float32))
    return (o, final) if return_state else o


# ----------------------------------------------------------------------------- softmax attention

def _gathered_attention(q, k, v, seg, *, causal, window, scale):
    """Inside the shard_map: local queries against the all-gathered keys and values, under
    the causal / window / segment mask at the piece's offset."""
    i, _ = _index_and_size()
    tl = q.shape[1]
    k_all = jax.lax.all_gather(k, AXIS, axis=1, tiled=True)
    v_all = jax.lax.all_gather(v, AXIS, axis=1, tiled=True)
    qpos = i * tl + jnp.arange(tl)[:, None]
    kpos = jnp.arange(k_all.shape[1])[None, :]
    keep = jnp.ones((tl, k_all.shape[1]), bool)
    if causal:
        keep &= kpos <= qpos
    if window is not None:
        keep &= (kpos > qpos - window) & (causal | (kpos < qpos + window))
    mask = keep[None, None, None]                                       # (1,1,1,tl,T)
    if seg is not None:
        seg_all = jax.lax.all_gather(seg, AXIS, axis=1, tiled=True)
        mask = mask & (seg[:, :, None] == seg_all[:, None, :])[:, None, None]
    # kernels.attention's float32 masked softmax, grouped-query (value dims may differ)
    qg = attention._group(q, k.shape[2]).astype(jnp.float32)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k_all.astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST) * scale
    o = attention._masked_softmax_read(scores, mask, "bkgts,bskd->btkgd", v_all)
    return attention._ungroup(o).astype(q.dtype)


def softmax_attention(q, k, v, *, segment_ids=None, causal=True, scale=None, window=None,
                      impl="auto", dropout_rate=0.0, dropout_rng=None, mesh=None,
                      mask_every_head=False, max_segments=0):
    """kernels.ops.softmax_attention with the keys and values all-gathered along the
    `sequence` mesh axis and each device's queries local; dropout goes to kernels.ops
    (max_segments too: the split form masks)."""
    kwargs = dict(segment_ids=segment_ids, causal=causal, scale=scale, window=window,
                  impl=impl, dropout_rate=dropout_rate, dropout_rng=dropout_rng,
                  mask_every_head=mask_every_head, max_segments=max_segments)
    mesh = _split_mesh(mesh, q.shape[1])
    if mesh is None or dropout_rate > 0.0 or k.shape[1] != q.shape[1]:
        return ops.softmax_attention(q, k, v, **kwargs)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    seq = P(None, AXIS)

    def local(q, k, v, seg):
        return _gathered_attention(q, k, v, seg, causal=causal, window=window, scale=scale)
    return _shard_map(local, mesh, (seq, seq, seq, None if segment_ids is None else seq),
                      seq)(q, k, v, segment_ids)


def sliding_window_attention(q, k, v, *, window, segment_ids=None, scale=None, impl="auto",
                             mesh=None, mask_every_head=False):
    """kernels.ops.sliding_window_attention split along the `sequence` mesh axis: each
    device takes the previous one's last window - 1 keys and values (ppermute) and runs
    the unsplit kernel on [those, its own]; windows longer than a piece + 1 all-gather."""
    t = q.shape[1]
    mesh = _split_mesh(mesh, t)
    if mesh is None:
        return ops.sliding_window_attention(q, k, v, window=window, segment_ids=segment_ids,
                                            scale=scale, impl=impl,
                                            mask_every_head=mask_every_head)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    tl = t // mesh.shape[AXIS]
    w = int(window)
    seq = P(None, AXIS)

    def local(q, k, v, seg):
        if w - 1 > tl:
            return _gathered_attention(q, k, v, seg, causal=True, window=w, scale=scale)
        if w == 1:
            return ops.sliding_window_attention(q, k, v, window=1, segment_ids=seg,
                                                scale=scale, impl=impl,
                                                mask_every_head=mask_every_head)
        i, _ = _index_and_size()
        b = q.shape[0]
        if seg is None:
            seg = jnp.zeros((b, tl), jnp.int32)
        seg = seg.astype(jnp.int32)
        # Device 0's halo is no document: an id below every id of the piece.
        hs = halo(seg, w - 1, jnp.full((b, w - 1), 0, jnp.int32)
                  + (jnp.min(seg) - 1))
        hk = halo(k, w - 1, jnp.zeros_like(k[:, :w - 1]))
        hv = halo(v, w - 1, jnp.zeros_like(v[:, :w - 1]))
        qx = jnp.concatenate([jnp.zeros_like(q[:, :w - 1]), q], 1)
        o = ops.sliding_window_attention(qx, jnp.concatenate([hk, k], 1),
                                         jnp.concatenate([hv, v], 1), window=w,
                                         segment_ids=jnp.concatenate([hs, seg], 1),
                                         scale=scale, impl=impl,
                                         mask_every_head=mask_every_head)
        return o[:, w - 1:]
    return _shard_map(local, mesh, (seq, seq, seq, None if segment_ids is None else seq),
                      seq)(q, k, v, segment_ids)


# ----------------------------------------------------------------------------- short convolutions

def short_conv(conv, x, segment_ids, state, *, mesh=None):
    """A causal conv of c taps split along the `sequence` mesh axis.

    conv(xp, segp) -> y: the conv of the T' = xp.shape[1] - (c - 1) last positions of xp
    (B, c - 1 + T', C), whose first c - 1 rows are the inputs before them, segp their
    segment ids (B, c - 1 + T') or None. state (B, c - 1, C): the inputs before the
    sequence (ids -1, models.layers.ShortConv's convention). Returns (y (B, T, C), the
    last c - 1 inputs of the sequence). Each device gets the previous device's last c - 1
    inputs and ids by ppermute; device 0 the state."""
    width = state.shape[1]
    b, t = x.shape[:2]
    mesh = _split_mesh(mesh, t)
    if width == 0 or mesh is None or width > t // mesh.shape[AXIS]:
        segp = None
        if segment_ids is not None:
            segp = jnp.concatenate([jnp.full((b, width), -1, segment_ids.dtype),
                                    segment_ids], 1)
        xp = jnp.concatenate([state.astype(x.dtype), x], 1)
        return conv(xp, segp), xp[:, xp.shape[1] - width:]
    seq = P(None, AXIS)

    def local(x, seg, state):
        xp = jnp.concatenate([halo(x, width, state.astype(x.dtype)), x], 1)
        segp = None
        if seg is not None:
            segp = jnp.concatenate([halo(seg, width, jnp.full((b, width), -1, seg.dtype)),
                                    seg], 1)
        return conv(xp, segp), _from_last(x[:, x.shape[1] - width:])
    return _shard_map(local, mesh, (seq, None if segment_ids is None else seq, P()),
                      (seq, P()))(x, segment_ids, state)
