"""The one dispatcher for the sequence-mixing ops (see docs/INTERFACES.md).

Public layout (batch, time, heads, dim). Linear ops keep states and sums in float32 whatever
the input dtype and return outputs in the input dtype. `impl` picks the form:
  "parallel"  masked quadratic (O(T^2), the simplest oracle)
  "recurrent" token-by-token lax.scan (never builds T x T)
  "chunk"     pure-JAX chunkwise, scan over chunks with jax.checkpoint
  "pallas"    kernels.pallas (GPU/TPU), packed documents (segment_ids) included
  "auto"      pallas on GPU/TPU for bf16/fp16 inputs where it applies, else chunk
"""
from __future__ import annotations

import functools
import importlib
import inspect

import jax
import jax.numpy as jnp

from kernels import chunk as _chunk
from kernels import recurrent as _rec
from kernels.attention import (attend_to_cache, ring_buffer_mask, sliding_window_attention,
                               softmax_attention)
from kernels.common import pad_axis, run_ids, to_heads_first, to_time_second

__all__ = ["linear_attention", "gated_delta_rule", "softmax_attention",
           "sliding_window_attention", "attend_to_cache", "ring_buffer_mask", "IMPLS"]

IMPLS = ("auto", "parallel", "recurrent", "chunk", "pallas")
CONV_IMPLS = ("xla", "pallas")  # conv_silu_norm: XLA's fusions, or the Pallas kernel


# ----------------------------------------------------------------------------- dispatch

def _pallas_module():
    """kernels.pallas, or None when it is absent or does not import here."""
    try:
        return importlib.import_module("kernels.pallas")
    except ImportError:
        return None


# Imported with this module, before anything is traced: the Pallas modules define jax
# config options, which join jit's tracing context when defined (kernels.pallas.common).
# Imported inside the first train step's trace, where the GPU dispatch first asked for
# them, every jit cache missed once afterwards: the step was traced and compiled twice.
_pallas_module()


def _resolve_impl(impl, op, dtype):
    """The form to run. "auto": the Pallas kernels on GPU and TPU for 16-bit inputs;
    float32 inputs take the chunk form there, since the kernels' float32 products run as
    IEEE float32 FMAs (the float32 tolerances of the tests), slower than XLA's chunk form
    (docs/benchmarks.md); CPU: the chunk form."""
    if impl not in IMPLS:
        raise ValueError(f"{op}: unknown impl {impl!r}; valid: {', '.join(IMPLS)}")
    if impl == "auto":
        if (jax.default_backend() in ("gpu", "tpu") and jnp.dtype(dtype).itemsize == 2
                and _pallas_module() is not None):
            return "pallas?"  # pallas, falling back to chunk where it is not implemented
        return "chunk"
    return impl


# The Pallas entry points' settings (everything else they take is an array or None).
_PALLAS_STATIC = ("return_state", "chunk_size", "tuning", "normalize", "eps", "variant",
                  "fused_prep", "head_dim", "scale", "block_t", "num_warps",
                  "dpre_dtype")


@functools.cache
def _jitted_pallas(fn):
    """A kernels.pallas entry point under one jax.jit. The layers of a model that call it
    with the same shapes and settings then share one trace and one lowering of its Pallas
    programs, forward and backward (JAX lowers a jitted call once per module and calls
    it), instead of lowering every program to Triton again for every layer: about 0.35 s
    a gated DeltaNet layer at d1024, most of a deep unrolled model's lowering time."""
    params = inspect.signature(fn).parameters
    any_keyword = any(p.kind is p.VAR_KEYWORD for p in params.values())
    return jax.jit(fn, static_argnames=[a for a in _PALLAS_STATIC
                                        if any_keyword or a in params])


def _call_pallas(name, fallback, *args, **kwargs):
    """Run kernels.pallas.<name>; with fallback (impl="auto"), use chunk where the kernel
    raises NotImplementedError."""
    mod = _pallas_module()
    if mod is None:
        raise ImportError("impl='pallas' needs kernels.pallas, which failed to import; use "
                          "impl='chunk'")
    try:
        return _jitted_pallas(getattr(mod, name))(*args, **kwargs)
    except NotImplementedError:
        if fallback is None:
            raise
        return fallback()


def _pallas_kwargs(**optional):
    """The Pallas entry points' optional arguments, passed only when set (not None; any
    module with the entry points' plain signatures serves where none is)."""
    return {name: value for name, value in optional.items() if value is not None}


# Head dims the Pallas kernels tile (powers of two, 16 to 256). Other dims are zero-padded
# up to the next one for the kernel call and the outputs and state cut back: exact for
# both ops (a zero key / query feature adds nothing to any dot product, and the padded
# state rows and value columns stay zero), e.g. Based's 153 Taylor features run as 256.
_PALLAS_DIMS = (16, 32, 64, 128, 256)


def _pallas_dim(d):
    """The head dim the Pallas call uses for d: the next tiled size, or d past the
    largest (the kernel refuses those, and impl="auto" takes the chunk form)."""
    return next((p for p in _PALLAS_DIMS if p >= d), d)


def _call_pallas_padded(name, fallback, q, k, v, *args, initial_state, **kwargs):
    """_call_pallas with the key/feature and value dims padded to tiled sizes (above);
    returns (o, state) cut back to the caller's dims. initial_state: S (B,H,F,Dv), or the
    pair (S, z (B,H,F)) with normalize."""
    normalize = kwargs.get("normalize", False)
    f, dv = k.shape[-1], v.shape[-1]
    fp, dvp = _pallas_dim(f), _pallas_dim(dv)
    if (fp, dvp) == (f, dv):
        return _call_pallas(name, fallback, q, k, v, *args, initial_state=initial_state,
                            **kwargs)

    def pad_s(s):
        return pad_axis(pad_axis(s, fp, -2), dvp, -1)

    if initial_state is not None:
        initial_state = ((pad_s(initial_state[0]), pad_axis(initial_state[1], fp, -1))
                         if normalize else pad_s(initial_state))
    o, state = _call_pallas(name, fallback, pad_axis(q, fp, -1), pad_axis(k, fp, -1),
                            pad_axis(v, dvp, -1), *args, initial_state=initial_state,
                            **kwargs)
    # cut back (a no-op where the fallback ran on the caller's dims)
    if normalize:
        return o[..., :dv], (state[0][..., :f, :dv], state[1][..., :f])
    return o[..., :dv], state[..., :f, :dv]


# ----------------------------------------------------------------------------- validation

def _compute_dtype(dtype):
    """float32 for float32/bf16/fp16 inputs; float64 inputs (x64 test oracles) stay float64."""
    return jnp.promote_types(dtype, jnp.float32)


def _check_linear_inputs(op, q, k, v):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if jnp.ndim(x) != 4:
            raise ValueError(f"{op}: {name} must be (batch, time, heads, dim), got shape "
                             f"{jnp.shape(x)}")
    if q.shape != k.shape:
        raise ValueError(f"{op}: q {q.shape} and k {k.shape} must have the same shape "
                         f"(same feature dim F: feature-map both the same way)")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"{op}: v {v.shape} must agree with q {q.shape} on (batch, time, "
                         f"heads)")


def _check_per_token(op, name, x, bth):
    if jnp.shape(x) != bth:
        raise ValueError(f"{op}: {name} must have shape (batch, time, heads) = {bth}, got "
                         f"{jnp.shape(x)}")


def _check_segments(op, segment_ids, bt):
    if segment_ids is not None and jnp.shape(segment_ids) != bt:
        raise ValueError(f"{op}: segment_ids must have shape (batch, time) = {bt}, got "
                         f"{jnp.shape(segment_ids)}")


def _check_chunk_size(op, chunk_size):
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"{op}: chunk_size must be a positive int, got {chunk_size!r}")


def _check_state(op, name, x, shape):
    if jnp.shape(x) != shape:
        raise ValueError(f"{op}: {name} must have shape {shape}, got {jnp.shape(x)}")


# ----------------------------------------------------------------------------- linear attention

def linear_attention(q, k, v, *, normalize=True, eps=1e-6, log_decay=None, segment_ids=None,
                     initial_state=None, return_state=False, impl="auto", chunk_size=64,
                     pallas_tuning=None, taylor_qk=None):
    """Causal (decayed) linear attention; q and k are already feature-mapped.

    S_t = exp(g_t) S_{t-1} + k_t v_t^T,  z_t = exp(g_t) z_{t-1} + k_t,
    o_t = S_t^T q_t / (z_t^T q_t + eps)   (normalize=True)   or   S_t^T q_t.
    q, k: (B,T,H,F); v: (B,T,H,Dv); log_decay g: None, (H,) or (B,T,H), values <= 0.
    State: S (B,H,F,Dv) float32, or (S, z) with z (B,H,F) when normalize=True.
    Returns o (B,T,H,Dv) in the input dtype, or (o, state) with return_state=True.
    pallas_tuning: a kernels.pallas.Tuning for the Pallas kernels (None: their default).
    taylor_qk: None, or (x_q, x_k) (B,T,H,d) where q, k are their Taylor features
    (models.feature_maps.taylor / taylor_symmetric) and there is no decay: the Pallas
    path then forms its in-chunk scores from them (kernels.pallas.linear); the other
    forms, exact with the features alone, do not read it.
    """
    op = "linear_attention"
    _check_linear_inputs(op, q, k, v)
    if taylor_qk is not None:
        if log_decay is not None:
            raise ValueError(f"{op}: taylor_qk is for undecayed Taylor features; got a "
                             f"log_decay")
        for name, x in zip(("x_q", "x_k"), taylor_qk):
            if jnp.ndim(x) != 4 or jnp.shape(x)[:3] != q.shape[:3]:
                raise ValueError(f"{op}: taylor_qk's {name} must be (batch, time, heads, "
                                 f"dim) with q's first three {q.shape[:3]}, got "
                                 f"{jnp.shape(x)}")
    _check_segments(op, segment_ids, q.shape[:2])
    _check_chunk_size(op, chunk_size)
    b, t, h, f = q.shape
    dv = v.shape[-1]
    out_dtype = jnp.result_type(q, k, v)
    decay_as_given = log_decay  # the Pallas kernel takes (H,) as is
    if log_decay is not None:
        log_decay = jnp.asarray(log_decay)
        if log_decay.shape == (h,):
            log_decay = jnp.broadcast_to(log_decay, (b, t, h))
        elif log_decay.shape != (b, t, h):
            raise ValueError(f"{op}: log_decay must have shape (heads,) = ({h},) or (batch, "
                             f"time, heads) = {(b, t, h)}, got {log_decay.shape}")
    if initial_state is not None:
        if normalize:
            if not (isinstance(initial_state, (tuple, list)) and len(initial_state) == 2):
                raise ValueError(f"{op}: with normalize=True initial_state must be the pair "
                                 f"(S (B,H,F,Dv), z (B,H,F)) returned by return_state=True")
            _check_state(op, "initial_state S", initial_state[0], (b, h, f, dv))
            _check_state(op, "initial_state z", initial_state[1], (b, h, f))
        else:
            _check_state(op, "initial_state", initial_state, (b, h, f, dv))

    resolved = _resolve_impl(impl, op, out_dtype)

    def pure_jax(form):
        return _linear_attention_jax(q, k, v, normalize, eps, log_decay, segment_ids,
                                     initial_state, form, chunk_size, out_dtype)

    if resolved in ("pallas", "pallas?"):
        fallback = (lambda: pure_jax("chunk")) if resolved == "pallas?" else None
        res = _call_pallas_padded("linear_attention", fallback, q, k, v, normalize=normalize,
                                  eps=eps, log_decay=decay_as_given,
                                  initial_state=initial_state, return_state=True,
                                  chunk_size=chunk_size,
                                  **_pallas_kwargs(tuning=pallas_tuning,
                                                   segment_ids=segment_ids,
                                                   taylor_qk=taylor_qk))
    else:
        res = pure_jax(resolved)
    return res if return_state else res[0]


def _chunk_form(chunk_form, per_token, run, state, chunk_size):
    """The pure-JAX chunk form, segment by segment past _chunk.SEGMENT_TOKENS tokens (its
    per-chunk tensors then exist for one segment at a time; the same result)."""
    form = functools.partial(chunk_form, chunk_size=chunk_size)
    segment = max(_chunk.SEGMENT_TOKENS // chunk_size, 1) * chunk_size
    if run.shape[1] <= segment:
        return form(*per_token, run, state)
    return _chunk.in_segments(form, per_token, run, state, segment)


def _linear_attention_jax(q, k, v, normalize, eps, log_decay, segment_ids, initial_state,
                          form, chunk_size, out_dtype):
    b, t, h = q.shape[:3]
    dv = v.shape[-1]
    cdt = _compute_dtype(out_dtype)
    qh, kh, vh = (to_heads_first(x.astype(cdt)) for x in (q, k, v))
    # No decay: the chunk forms take g=None and skip the decay terms statically (zeros
    # would cost a cumsum and exps, which XLA constant-folds slowly at large shapes).
    g = None if log_decay is None else jnp.moveaxis(log_decay.astype(cdt), 1, 2)
    run = run_ids(segment_ids, b, t)

    # The normaliser z is the state of an extra value column of ones.
    if normalize:
        vh = jnp.concatenate([vh, jnp.ones(vh.shape[:-1] + (1,), cdt)], axis=-1)
    if initial_state is None:
        state = None  # zeros, known statically: the chunk forms drop its terms
    elif normalize:
        s0, z0 = initial_state
        state = jnp.concatenate([jnp.asarray(s0, cdt),
                                 jnp.asarray(z0, cdt)[..., None]], axis=-1)
    else:
        state = jnp.asarray(initial_state, cdt)

    if form == "parallel":
        o, state = _chunk.linear_attention_parallel(qh, kh, vh, g, run, state)
    elif form == "recurrent":
        g = jnp.zeros((b, h, t), cdt) if g is None else g
        state = _chunk.zero_state(kh, vh) if state is None else state
        o, state = _rec.linear_attention_recurrent(qh, kh, vh, g, run, state)
    else:
        o, state = _chunk_form(_chunk.linear_attention_chunk, [qh, kh, vh, g], run, state,
                               chunk_size)

    if normalize:
        o = o[..., :dv] / (o[..., dv:] + eps)
        state = (state[..., :dv], state[..., dv])
    return to_time_second(o).astype(out_dtype), state


# ----------------------------------------------------------------------------- gated delta rule

def gated_delta_rule(q, k, v, log_alpha, beta, *, segment_ids=None, initial_state=None,
                     return_state=False, impl="auto", chunk_size=64, pallas_tuning=None):
    """Gated delta rule: S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,
    o_t = S_t^T q_t, alpha_t = exp(log_alpha_t).

    q, k: (B,T,H,K); v: (B,T,H,V); log_alpha, beta: (B,T,H); state S (B,H,K,V) float32.
    No normaliser and no scaling inside (the caller scales q and normalises k).
    log_alpha = 0 gives the plain delta rule.
    pallas_tuning: a kernels.pallas.Tuning for the Pallas kernels (None: their default).
    """
    op = "gated_delta_rule"
    _check_linear_inputs(op, q, k, v)
    _check_per_token(op, "log_alpha", log_alpha, q.shape[:3])
    _check_per_token(op, "beta", beta, q.shape[:3])
    _check_segments(op, segment_ids, q.shape[:2])
    _check_chunk_size(op, chunk_size)
    b, t, h, f = q.shape
    dv = v.shape[-1]
    if initial_state is not None:
        _check_state(op, "initial_state", initial_state, (b, h, f, dv))
    out_dtype = jnp.result_type(q, k, v)
    resolved = _resolve_impl(impl, op, out_dtype)

    def pure_jax(form):
        return _gated_delta_jax(q, k, v, log_alpha, beta, segment_ids, initial_state, form,
                                chunk_size, out_dtype)

    if resolved in ("pallas", "pallas?"):
        fallback = (lambda: pure_jax("chunk")) if resolved == "pallas?" else None
        res = _call_pallas_padded("gated_delta_rule", fallback, q, k, v, log_alpha, beta,
                                  initial_state=initial_state, return_state=True,
                                  chunk_size=chunk_size,
                                  **_pallas_kwargs(tuning=pallas_tuning,
                                                   segment_ids=segment_ids))
    else:
        res = pure_jax(resolved)
    return res if return_state else res[0]


def _gated_delta_jax(q, k, v, log_alpha, beta, segment_ids, initial_state, form, chunk_size,
                     out_dtype):
    b, t = q.shape[:2]
    cdt = _compute_dtype(out_dtype)
    qh, kh, vh = (to_heads_first(x.astype(cdt)) for x in (q, k, v))
    g = jnp.moveaxis(jnp.asarray(log_alpha, cdt), 1, 2)
    bt = jnp.moveaxis(jnp.asarray(beta, cdt), 1, 2)
    run = run_ids(segment_ids, b, t)
    # None: zeros, known statically (the chunk forms drop the state's terms)
    state = None if initial_state is None else jnp.asarray(initial_state, cdt)
    if form == "parallel":
        o, state = _chunk.gated_delta_parallel(qh, kh, vh, g, bt, run, state)
    elif form == "recurrent":
        state = _chunk.zero_state(kh, vh) if state is None else state
        o, state = _rec.gated_delta_recurrent(qh, kh, vh, g, bt, run, state)
    else:
        o, state = _chunk_form(_chunk.gated_delta_chunk, [qh, kh, vh, g, bt], run, state,
                               chunk_size)
    return to_time_second(o).astype(out_dtype), state


# ----------------------------------------------------------------------------- short conv

# The fused conv kernel's row block and warps (kernels.pallas.short_conv): the fastest of
# 16x4, 32x4 and 64x8 rows x warps alone at B4 T2048 d1024 on an H200, none of which
# spills for sm_90 (scripts/bench_short_conv.py, scripts/triton_spills.py).
_CONV_BLOCK_T = 16
_CONV_WARPS = 4
# Its backward stores the conv output's cotangent in x's dtype (bf16 in training): half
# the bytes of the backward's largest array, 1.17x faster forward + backward than a
# float32 store at B4 T8192 d1024, with dx / dw within bf16 rounding of it (session 38,
# docs/benchmarks.md).
_CONV_DPRE_DTYPE = "input"


def conv_silu_norm_fused(conv_impl: str, impl, dtype, head_dim: int, taps: int) -> bool:
    """Whether conv_silu_norm runs as the Pallas (Triton) kernel: conv_impl "pallas",
    impl "auto" (16-bit inputs on a GPU) or "pallas" on a GPU, a head dim the kernel
    tiles and a conv the kernel's row block covers. Elsewhere the callers' XLA form runs
    (the same values up to the rounding of the intermediates)."""
    if conv_impl not in CONV_IMPLS:
        raise ValueError(f"conv_silu_norm: unknown conv_impl {conv_impl!r}; valid: "
                         f"{', '.join(CONV_IMPLS)}")
    resolved = _resolve_impl(impl, "conv_silu_norm", dtype)
    return (conv_impl == "pallas" and resolved in ("pallas", "pallas?")
            and jax.default_backend() == "gpu"
            and head_dim in _PALLAS_DIMS and taps <= _CONV_BLOCK_T
            and hasattr(_pallas_module(), "conv_silu_norm"))


def conv_silu_norm(x, kernel, positions, *, head_dim: int, normalize, scale,
                   eps: float = 1e-6):
    """kernels.pallas.short_conv.conv_silu_norm (see conv_silu_norm_fused for where it
    applies): x (B, T, N, C), kernel (c, N, C), positions (B, T) int32 (each token's
    position in its document); normalize / scale: N bools / floats. Returns the N
    outputs (B, T, C) in x's dtype."""
    return _jitted_pallas(_pallas_module().conv_silu_norm)(
        x, kernel, positions, head_dim=head_dim, normalize=tuple(normalize),
        scale=tuple(float(s) for s in scale), eps=float(eps), block_t=_CONV_BLOCK_T,
        num_warps=_CONV_WARPS, dpre_dtype=_CONV_DPRE_DTYPE)
