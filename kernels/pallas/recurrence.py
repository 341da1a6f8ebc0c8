"""The sequential part of every chunkwise linear op, with its custom VJP.

Per chunk n (C tokens; S is the (K, V) float32 state before the chunk):

    Qg  = Q * exp(G),  Kd = K * exp(G_C - G)   (formed in the kernel from q, k and G)
    U   = Ut - W S                 (W = 0 for linear attention: U = V)
    O   = Qg S + P U               (P = (Q K^T) * decay mask)
    S'  = exp(G_C) S + Kd^T U

where Ut, W, P, G_C (gcl) come from a parallel-over-chunks preparation (kernels.pallas.gdn,
kernels.pallas.linear) and G is the in-chunk inclusive cumsum of the log-decays (None:
no decay, Qg = Q, Kd = K). Forming Qg, Kd in the kernel saves the preparation writing
2 K values per token. Only the loop over chunks is sequential, so only it must be a
kernel: the state never leaves registers (GPU) or VMEM (TPU).

Backward, recomputing U from the saved chunk-start states (nothing per token is stored
beyond U on the GPU; dS = dL/dS' is carried from the last chunk to the first):

    dU  = P^T dO + Kd dS'          dS  = exp(G_C) dS' + Qg^T dO - W^T dU
    dUt = dU    dW = -dU S^T    dQg = dO S^T    dP = dO U^T    dKd = U dS'^T
    dG_C = exp(G_C) <S, dS'>,  then  dq = dQg exp(G),  dk = dKd exp(G_C - G),
    dG = <dQg, Qg> - <dKd, Kd>,  dG_C += sum_t <dKd, Kd>.

The programs: kernels.pallas.fwd_gpu, bwd_gpu (Triton) and tpu (Mosaic). Saved for the
backward: the chunk-start states, (T / C) K V values per head in the input dtype (every
use casts them to it).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels.pallas import bwd_gpu, fwd_gpu, tpu
from kernels.pallas.plan import Config


@functools.partial(jax.custom_vjp, nondiff_argnums=(10,))
def chunk_recurrence(w, ut, q, k, p, gcl, gam, gkey, s0, bounds, cfg: Config):
    """(O (B, Tp, H, V) in cfg.out_dtype, final state (BH, K, V) float32).

    w: (BH, Tp, K) or None; ut: (BH, Tp, V); q, k: (B, Tp, H, K), the op's (padded)
    inputs; p: (BH, Tp, C); gcl: (BH, N, 1, 1) float32, the chunk's log state decay;
    gam: (B, Tp, H) float32, the log weight of the incoming state at each token (the
    in-chunk inclusive cumsum G of the log-decays), or None for no decay (then gcl must
    be 0); gkey: None (the key weights are G_C - G) or (B, Tp, H) float32, the log key
    weights (packed documents: -inf where a token's document ends inside the chunk, as
    gam is -inf where it starts there, and gcl where one does); s0: (BH, K, V) float32.
    w, ut, q, k, p share one dtype. BH = B * H, batch-major. bounds: None, or with
    cfg.pieces > 1 (GPU, packed documents) the (B, Q) int32 piece bounds of
    kernels.pallas.documents.piece_bounds, which split each row's sequential walk.
    """
    if gkey is not None and gam is None:
        raise ValueError("chunk_recurrence: gkey needs gam (the masked G)")
    if cfg.variant == "gpu":
        return tuple(fwd_gpu.forward(w, ut, q, k, p, gcl, gam, gkey, s0, bounds, cfg))
    o, st = tpu.forward(w, ut, q, k, p, gcl, gam, gkey, s0, cfg, save=False)
    return o, st


def forward_with_residuals(w, ut, q, k, p, gcl, gam, gkey, s0, bounds, cfg: Config):
    """((O, final state), residuals) for backward:
    (w, ut, q, k, p, gcl, gam, gkey, h, u, bounds),
    with h the chunk-start states and u = U where the forward wrote it (the GPU forward of
    the gated delta rule; ut, no longer needed, is then None)."""
    if cfg.variant == "gpu":
        o, st, h, u = fwd_gpu.forward_saving(w, ut, q, k, p, gcl, gam, gkey, s0, bounds,
                                             cfg)
    else:
        o, st, h = tpu.forward(w, ut, q, k, p, gcl, gam, gkey, s0, cfg, save=True)
        u = None
    return (o, st), (w, None if u is not None else ut, q, k, p, gcl, gam, gkey, h, u,
                     bounds)


def backward(cfg: Config, res, cts):
    """(dw | None, dut, dq, dk, dp, dgcl, dgam | None, dgkey | None, ds0) from
    forward_with_residuals' residuals and the cotangents (dO, d final state); dq, dk in
    the input dtype (B, Tp, H, K) with the decay chain applied, the rest float32 or the
    input dtype."""
    w, ut, q, k, p, gcl, gam, gkey, h, u, bounds = res
    do, dst = cts
    dst = dst.astype(jnp.float32)
    if cfg.variant == "gpu":
        return bwd_gpu.backward(w, ut, q, k, p, gcl, gam, gkey, h, do, dst, bounds, cfg,
                                u=u)
    return tpu.backward(w, ut, q, k, p, gcl, gam, gkey, h, do, dst, cfg)


def _vjp_bwd(cfg, res, cts):
    w, _, q, k, p, _, _, _, _, _, _ = res
    dw, dut, dq, dk, dp, dgcl, dgam, dgkey, ds0 = backward(cfg, res, cts)
    cast = lambda g, like: None if like is None else g.astype(like.dtype)  # noqa: E731
    # dut in the inputs' dtype (ut may be None here: the forward saved U instead)
    return (cast(dw, w), cast(dut, p), cast(dq, q), cast(dk, k), cast(dp, p), dgcl, dgam,
            dgkey, ds0, None)


chunk_recurrence.defvjp(forward_with_residuals, _vjp_bwd)
