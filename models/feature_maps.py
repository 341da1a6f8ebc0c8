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
    feature count the Pallas kernels take padded to 256 (273 would need 512)."""
    d = x.shape[-1]
    rows, cols = np.triu_indices(d)
    coef = np.where(rows == cols, 1.0 / math.sqrt(2.0), 1.0)  # cast to x.dtype below
    pairs = x[..., rows] * x[..., cols] * jnp.asarray(coef, x.dtype)
    ones = jnp.ones((*x.shape[:-1], 1), x.dtype)
    return jnp.concatenate([ones, x, pairs], axis=-1)


def taylor_symmetric_dim(d: int) -> int:
    return 1 + d + d * (d + 1) // 2


# --- FAVOR+ (Choromanski et al. 2020) -------------------------------------------------

def gaussian_projection(key, num_features: int, dim: int, *, orthogonal: bool = True):
    """Random directions omega (num_features, dim) for FAVOR+.

    orthogonal=True stacks blocks of `dim` exactly orthogonal rows (QR of a Gaussian
    matrix) and rescales each row by the norm of an independent Gaussian vector, so every
    row has the chi(dim) length a Gaussian row would have (unbiasedness is kept, the
    variance drops: Performer Theorem 2). orthogonal=False: iid N(0, I) rows.
    """
    if not orthogonal:
        return jax.random.normal(key, (num_features, dim), jnp.float32)
    num_blocks = -(-num_features // dim)
    block_key, norm_key = jax.random.split(key)
    g = jax.random.normal(block_key, (num_blocks, dim, dim), jnp.float32)
    q, r = jnp.linalg.qr(g)  # batched over blocks
    # Sign-fix by diag(R) so each Q is Haar-distributed; raw QR output is biased in
    # direction, and so would be the estimate.
    signs = jnp.where(jnp.diagonal(r, axis1=-2, axis2=-1) < 0, -1.0, 1.0)
    blocks = jnp.swapaxes(q * signs[:, None, :], -1, -2)  # rows orthonormal
    rows = blocks.reshape(num_blocks * dim, dim)[:num_features]
    norms = jnp.linalg.norm(jax.random.normal(norm_key, (num_features, dim), jnp.float32),
                            axis=-1)
    return rows * norms[:, None]


def favor_plus(x, omega, *, scale: float = 1.0, query: bool = False, eps: float = 0.0):
    """Positive random features exp(omega_i . x - |x|^2 / 2) / sqrt(m) (+ eps).

    E[phi(q) . phi(k)] = exp(q . k) for Gaussian omega (seed 000). `scale` multiplies x
    first: d^(-1/4) gives the softmax temperature, exp(q . k / sqrt(d)).

    Stabiliser, causal-safe: for queries (query=True) subtract the per-token max of the
    exponent over features. That multiplies phi(q_t) by a constant of token t alone, which
    cancels between the numerator and the normaliser, and uses no other token (a max over
    keys or time would leak the future). Keys need none: omega . x - |x|^2/2 <= |omega|^2/2,
    a bound that depends on omega only.
    """
    x = x.astype(jnp.float32) * scale
    # Full float32 precision: exp() turns a small error in the exponent (TF32 on GPU) into
    # a relative error of the feature.
    logits = jnp.einsum("...d,md->...m", x, omega.astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST)
    logits = logits - 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)
    if query:
        logits = logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    m = omega.shape[0]
    return jnp.exp(logits) / math.sqrt(m) + eps


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

class HedgehogFeatureMap(nnx.Module):
    """Learned map per head: phi(x) = [softmax(W x), softmax(-W x)] over features.

    W (heads, d, d) starts at the identity, so at init phi is the mirrored softmax of x.
    The same map serves a head's queries and keys. 2 * d features.
    """

    def __init__(self, num_heads: int, head_dim: int, *, param_dtype=jnp.float32):
        eye = jnp.broadcast_to(jnp.eye(head_dim, dtype=param_dtype),
                               (num_heads, head_dim, head_dim))
        self.kernel = nnx.Param(eye, sharding_names=("heads", None, None),
                                eager_sharding=False)

    def __call__(self, x):  # x (..., H, D)
        wx = jnp.einsum("...hd,hde->...he", x.astype(jnp.float32),
                        self.kernel[...].astype(jnp.float32))
        return jnp.concatenate([jax.nn.softmax(wx, axis=-1), jax.nn.softmax(-wx, axis=-1)],
                               axis=-1)
