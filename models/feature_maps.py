"""Feature maps phi for linear attention: kappa(q, k) = phi(q) . phi(k).

All act on the last axis, so they apply to (B, T, H, D) arrays per head and token.
Formulas and worked examples follow seed 000 (linear attention) and the papers named
on each function.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kernels.common import segmented_scan


def elu_plus_one(x):
    """Katharopoulos et al. (2020): elu(x) + 1, positive, d features."""
    return jax.nn.elu(x) + 1.0


def relu(x):
    return jax.nn.relu(x)


def identity(x):
    return x


SIMPLE_MAPS = {"elu": elu_plus_one, "relu": relu, "identity": identity}


def taylor(x):
    """Second-order Taylor features (Based): [1, x, vec(x x^T) / sqrt(2)], 1 + d + d^2.

    taylor(q) . taylor(k) = 1 + s + s^2 / 2 with s = q . k, exactly. The order is the
    constant, the d linear features, then the outer product row-major (seed 000). Callers
    wanting the softmax temperature scale x by d^(-1/4) first, so s = q . k / sqrt(d).
    """
    d = x.shape[-1]
    outer = (x[..., :, None] * x[..., None, :]).reshape(*x.shape[:-1], d * d)
    ones = jnp.ones((*x.shape[:-1], 1), x.dtype)
    return jnp.concatenate([ones, x, outer / math.sqrt(2.0)], axis=-1)


def taylor_dim(d: int) -> int:
    return 1 + d + d * d


def taylor_symmetric(x):
    """taylor(x) with each pair (i, j), (j, i) of the outer product stored once:
    [1, x, x_i x_j c_ij for i <= j], c_ii = 1/sqrt(2) and c_ij = 1 for i < j, so
    1 + d + d (d + 1) / 2 features (153 at d = 16, against 273) and the same kernel,
    taylor_symmetric(q) . taylor_symmetric(k) = 1 + s + s^2 / 2 exactly
    (sum_{i<=j} c_ij^2 q_i q_j k_i k_j = (q . k)^2 / 2). A smaller recurrent state and a
    feature count the Pallas kernels take padded to 256 (273 would need 512).

    The pairs are built from slices (row i: x_i * x[i:]), not by indexing x with
    triu_indices: a gather's gradient is a scatter-add, slow on GPUs (docs/benchmarks.md,
    session 13). Same values and order as x[..., rows] * x[..., cols] for rows, cols =
    triu_indices(d). The gradient is written out (_taylor_symmetric_bwd) on every
    backend: autodiff of the slices sums ~d^2 / 2 zero-padded copies, which XLA's CPU
    compiler fuses into one slow loop and the GPU reduces in two extra passes over the
    features (docs/benchmarks.md, sessions 32 and 40).
    """
    return _taylor_symmetric(x)


def _taylor_symmetric_forward(x):
    d = x.shape[-1]
    half = jnp.asarray(1.0 / math.sqrt(2.0), x.dtype)
    rows = [jnp.concatenate([x[..., i:i + 1] * x[..., i:i + 1] * half,
                             x[..., i:i + 1] * x[..., i + 1:]], axis=-1) for i in range(d)]
    ones = jnp.ones((*x.shape[:-1], 1), x.dtype)
    return jnp.concatenate([ones, x, *rows], axis=-1)


_taylor_symmetric = jax.custom_vjp(_taylor_symmetric_forward)


def _taylor_symmetric_fwd(x):
    return _taylor_symmetric_forward(x), x


def _symmetric_pair_table(d: int):
    """(index, coefficient) tables (d, d): entry (i, j) of U + U^T, U the upper-triangular
    matrix of the pairs' gradients c_ij d_phi_ij (i <= j), is d_phi's pair
    index[i, j] = index of (min(i, j), max(i, j)) times coefficient[i, j] (c_ij, doubled
    on the diagonal, where U and U^T meet)."""
    rows, cols = np.triu_indices(d)
    index = np.zeros((d, d), np.int32)
    index[rows, cols] = np.arange(rows.size)
    index[cols, rows] = np.arange(rows.size)
    coefficient = np.ones((d, d), np.float32)
    np.fill_diagonal(coefficient, 2.0 / math.sqrt(2.0))
    return index, coefficient


def _taylor_symmetric_bwd(x, d_phi):
    """d_x = d_phi's linear part + (U + U^T) x, U (d, d) upper triangular holding each
    pair's gradient c_ij d_phi_ij (i <= j): feature x_i x_j c_ij sends c_ij x_j d_phi_ij
    to x_i and c_ij x_i d_phi_ij to x_j (both x_i when i = j). U + U^T is read from the
    pairs by one static gather, elementwise work that fuses with the product and the sum
    over j (rather than B x T x H tiny matvecs)."""
    d = x.shape[-1]
    index, coefficient = _symmetric_pair_table(d)
    pairs = d_phi[..., 1 + d:].astype(jnp.float32)
    symmetric = jnp.take(pairs, jnp.asarray(index.reshape(-1)), axis=-1)
    symmetric = symmetric.reshape(x.shape + (d,)) * jnp.asarray(coefficient)
    d_x = (d_phi[..., 1:1 + d].astype(jnp.float32)
           + jnp.sum(symmetric * x.astype(jnp.float32)[..., None, :], axis=-1))
    return (d_x.astype(x.dtype),)


_taylor_symmetric.defvjp(_taylor_symmetric_fwd, _taylor_symmetric_bwd)


def taylor_symmetric_dim(d: int) -> int:
    return 1 + d + d * (d + 1) // 2


# --- FAVOR+ (Choromanski et al. 2020) -------------------------------------------------

def orthonormal_columns(g):
    """Q of g = Q R (..., d, d) with R's diagonal positive: the unique such Q, which is
    Haar-distributed for Gaussian g (a raw LAPACK QR's signs are not).

    Performer redraws its features inside every train step, so the method is chosen per
    platform at lowering (lax.platform_dependent): on CPU Gram-Schmidt in plain XLA ops
    (LAPACK's custom call can deadlock XLA's thread pool on small CPU machines); elsewhere
    Householder QR (jnp.linalg.qr, one cuSOLVER call), since Gram-Schmidt is d dependent
    steps of a few small kernels each, per layer and step: latency a GPU cannot hide.
    """
    return jax.lax.platform_dependent(g, cpu=orthonormal_columns_gram_schmidt,
                                      default=orthonormal_columns_householder)


def orthonormal_columns_householder(g):
    """orthonormal_columns by Householder QR, the signs of Q's columns flipped where
    R's diagonal is negative."""
    q, r = jnp.linalg.qr(g)
    signs = jnp.where(jnp.diagonal(r, axis1=-2, axis2=-1) < 0, -1.0, 1.0).astype(q.dtype)
    return q * signs[..., None, :]


def orthonormal_columns_gram_schmidt(g):
    """orthonormal_columns by Gram-Schmidt over the columns in order, each projection
    done twice (CGS2: orthogonal to float32 rounding); diag(R) = the norms, positive."""
    d = g.shape[-1]
    cols = jnp.swapaxes(g, -1, -2)  # (..., d, d): row i is column i of g

    def add_column(i, q_rows):  # q_rows: the columns accepted so far, zero rows after
        v = cols[..., i, :]
        for _ in range(2):
            v = v - jnp.einsum("...j,...jd->...d", jnp.einsum("...jd,...d->...j", q_rows, v,
                                                              precision="highest"),
                               q_rows, precision="highest")
        v = v / jnp.linalg.norm(v, axis=-1, keepdims=True)
        return q_rows.at[..., i, :].set(v)

    q_rows = jax.lax.fori_loop(0, d, add_column, jnp.zeros_like(cols))
    return jnp.swapaxes(q_rows, -1, -2)


def gaussian_projection(key, num_features: int, dim: int, *, orthogonal: bool = True):
    """Random directions omega (num_features, dim) for FAVOR+.

    orthogonal=True stacks blocks of `dim` exactly orthogonal rows (the Q of a Gaussian
    matrix, orthonormal_columns) and rescales each row by the norm of an independent
    Gaussian vector, so every row has the chi(dim) length a Gaussian row would have
    (unbiasedness is kept, the variance drops: Performer Theorem 2). orthogonal=False:
    iid N(0, I) rows.
    """
    if not orthogonal:
        return jax.random.normal(key, (num_features, dim), jnp.float32)
    num_blocks = -(-num_features // dim)
    block_key, norm_key = jax.random.split(key)
    g = jax.random.normal(block_key, (num_blocks, dim, dim), jnp.float32)
    blocks = jnp.swapaxes(orthonormal_columns(g), -1, -2)  # rows orthonormal
    rows = blocks.reshape(num_blocks * dim, dim)[:num_features]
    norms = jnp.linalg.norm(jax.random.normal(norm_key, (num_features, dim), jnp.float32),
                            axis=-1)
    return rows * norms[:, None]


def favor_logits(x, omega, *, scale: float = 1.0):
    """The exponents of FAVOR+'s positive features, omega_i . x' - |x'|^2 / 2 with
    x' = scale x, in float32 (..., m): exp() turns a small error in an exponent into a
    relative error of the feature, so the product runs at full float32 precision (not
    TF32 on GPU) whatever the input dtype (float64 inputs stay float64)."""
    dtype = jnp.promote_types(x.dtype, jnp.float32)  # float64 stays (x64 test oracles)
    x = x.astype(dtype) * scale
    logits = jnp.einsum("...d,md->...m", x, omega.astype(dtype),
                        precision=jax.lax.Precision.HIGHEST)
    return logits - 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)


def favor_plus(x, omega, *, scale: float = 1.0, query: bool = False, eps: float = 0.0):
    """Positive random features exp(omega_i . x - |x|^2 / 2) / sqrt(m) (+ eps).

    E[phi(q) . phi(k)] = exp(q . k) for Gaussian omega (seed 000). `scale` multiplies x
    first: d^(-1/4) gives the softmax temperature, exp(q . k / sqrt(d)).

    query=True subtracts the per-token max of the exponent over features: a constant of
    token t alone, which cancels between the numerator and the normaliser. Keys are not
    stabilised here: a mixer stabilises them over the causal prefix
    (running_max_features), since a max over keys of other tokens would leak the future.
    """
    logits = favor_logits(x, omega, scale=scale)
    m = omega.shape[0]
    if query:
        return per_token_max_features(logits, eps=eps * math.sqrt(m)) / math.sqrt(m)
    return jnp.exp(logits) / math.sqrt(m) + eps


# --- Stabilising exponential features (FAVOR+, Hedgehog's exp form) -------------------
#
# A feature exp(l) overflows float32 past l = 88.7 and underflows below -103. Any shift
# that is one constant per query token cancels between the numerator and the normaliser;
# for keys the shift must be shared by every key a query reads, and may use no later key.

def per_token_max_features(logits, *, eps: float = 0.0):
    """exp(l - max_f l) + eps per token (the largest feature is 1 + eps): a constant of the
    token alone, held out of the gradient (it cancels when normalised)."""
    top = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    return jnp.exp(logits - top) + eps


def running_max_features(logits, run, c0, *, eps: float = 0.0):
    """Causally stabilised key features and the log decay that keeps them exact.

    logits (B, T, H, F) float32; run (B, T) the run (document) index of each token, from 0
    (kernels.common.run_ids), or None for one document per row; c0 (B, H) the running
    max carried in from an earlier call (decode, chunked prefill), -inf for an empty
    state.

    c_t = max over the run's prefix s <= t (and c0 for run 0) of max_f l_s,f. The key at
    s is written as phi_s = exp(l_s - c_s) + eps <= 1 + eps and every state is kept
    relative to the current max by the decay exp(g_t), g_t = c_{t-1} - c_t <= 0:

        S_t = exp(g_t) S_{t-1} + phi_t v_t^T  =  sum_s exp(c_s - c_t) phi_s v_s^T,

    i.e. key s enters with exp(l_s - c_t) (+ eps exp(c_s - c_t)): one constant exp(-c_t)
    for every key query t reads, which cancels in the normalised output. No exponent
    exceeds 0, c_t reads no later token, and the largest key of the prefix keeps feature
    1, so the keys never all underflow. g = 0 where a run starts (the op zeroes the state
    there) and where c0 is -inf. c is held out of the gradient: it cancels but for eps.

    Returns (features (B, T, H, F), log_decay (B, T, H), c at the last token (B, H)).
    """
    top = jax.lax.stop_gradient(jnp.max(logits, axis=-1))           # (B, T, H)
    c0 = jax.lax.stop_gradient(c0.astype(top.dtype))
    if run is None:  # one document: a plain cummax (the segmented scan compiles slowly)
        c = jnp.maximum(jax.lax.cummax(top, axis=1), c0[:, None])
        new_run = jnp.zeros(c.shape, bool)
    else:
        c = segmented_scan(jnp.maximum, top, run)
        c = jnp.where((run == 0)[..., None], jnp.maximum(c, c0[:, None]), c)
        new_run = jnp.concatenate([jnp.zeros_like(run[:, :1], bool),
                                   run[:, 1:] != run[:, :-1]], axis=1)[..., None]
    c_prev = jnp.concatenate([c0[:, None], c[:, :-1]], axis=1)
    log_decay = jnp.where(new_run | ~jnp.isfinite(c_prev), 0.0, c_prev - c)
    return jnp.exp(logits - c[..., None]) + eps, log_decay, c[:, -1]


# --- DPFP (Schlag, Irie & Schmidhuber 2021) -------------------------------------------

def dpfp(x, nu: int = 1):
    """Deterministic parameter-free projection: 2 * d * nu sparse non-negative features.

    r = [relu(x), relu(-x)]; phi = concat over i = 1..nu of r * roll(r, i).
    """
    if nu < 1:
        raise ValueError(f"dpfp: nu={nu} must be >= 1")
    r = jnp.concatenate([jax.nn.relu(x), jax.nn.relu(-x)], axis=-1)
    return jnp.concatenate([r * jnp.roll(r, i, axis=-1) for i in range(1, nu + 1)], axis=-1)


# --- Hedgehog (Zhang et al. 2024) -----------------------------------------------------

HEDGEHOG_MAPS = ("softmax", "exp")


class HedgehogFeatureMap(nnx.Module):
    """One learned map per head, a = W x + b with W (heads, d, d) at the identity and b
    (heads, d) at zero (fla's nn.Linear(head_dim, head_dim) with eye_ / zeros_ init; ours
    per head), giving 2 d features from the mirrored pair [a, -a] (`log_features`):

      "softmax" (fla's fla/modules/feature_map.py, its default): softmax([2a, -2a]), one
          softmax over all 2 d features (`__call__`);
      "exp" (the paper's, Zhang et al. 2024 and HazyResearch's hedgehog code):
          [exp(a), exp(-a)], exponentiated by the mixer with a causal stabiliser
          (running_max_features), since exp(a) alone overflows.

    A mixer keeps two, one for queries and one for keys (fla's default,
    tie_feature_map_qk=False). Neither W nor b is weight-decayed (training.optim): decay
    would pull W from the identity towards zero, the uniform map.
    """

    def __init__(self, num_heads: int, head_dim: int, *, param_dtype=jnp.float32):
        eye = jnp.broadcast_to(jnp.eye(head_dim, dtype=param_dtype),
                               (num_heads, head_dim, head_dim))
        self.kernel = nnx.Param(eye, sharding_names=("heads", None, None),
                                eager_sharding=False)
        self.bias = nnx.Param(jnp.zeros((num_heads, head_dim), param_dtype),
                              sharding_names=("heads", None), eager_sharding=False)

    def log_features(self, x):  # x (..., H, D) -> [a, -a] (..., H, 2 D), float32 at least
        dtype = jnp.promote_types(x.dtype, jnp.float32)
        a = jnp.einsum("...hd,hde->...he", x.astype(dtype), self.kernel[...].astype(dtype),
                       precision=jax.lax.Precision.HIGHEST)
        a = a + self.bias[...].astype(dtype)
        return jnp.concatenate([a, -a], axis=-1)

    def __call__(self, x):
        """fla's map: softmax over the 2 d features of [2a, -2a]."""
        return jax.nn.softmax(2.0 * self.log_features(x), axis=-1)
