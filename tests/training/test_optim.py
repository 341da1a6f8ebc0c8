"""AdamW + warmup/cosine + clipping + decay mask against a float64 NumPy reference."""
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from training import optim


def train_cfg(**kw):
    d = dict(lr=1e-2, steps=10, warmup_steps=3, min_lr_ratio=0.1, grad_clip=0.5, b1=0.9,
             b2=0.95, eps=1e-8, weight_decay=0.1, decay_embeddings=True)
    d.update(kw)
    return ml_collections.ConfigDict(d)


def ref_lr(t, lr=1e-2, steps=10, warmup=3, ratio=0.1):
    if t < warmup:
        return lr * t / warmup
    frac = (t - warmup) / (steps - warmup)
    return lr * ratio + 0.5 * (lr - lr * ratio) * (1 + math.cos(math.pi * min(frac, 1.0)))


def test_schedule_warmup_then_cosine():
    s = optim.lr_schedule(1e-2, 10, 3, 0.1)
    for t in range(12):
        assert abs(float(s(t)) - ref_lr(t)) < 1e-8, t
    # No warmup: starts at lr.
    assert abs(float(optim.lr_schedule(1e-3, 5, 0)(0)) - 1e-3) < 1e-9


def test_decay_mask_excludes_norms_biases_gates_and_optionally_embeddings():
    params = {"embed/embedding": np.zeros((10, 4)),
              "layers/0/mixer/q/kernel": np.zeros((4, 4)),
              "layers/0/norm/scale": np.zeros(4), "layers/0/mixer/q/bias": np.zeros(4),
              "layers/0/mixer/A_log": np.zeros(2), "layers/0/mixer/dt_bias": np.zeros(2)}
    logical = {"embed/embedding": ("vocab", "embed")}
    m = optim.decay_mask(params, logical)
    assert m == {"embed/embedding": True, "layers/0/mixer/q/kernel": True,
                 "layers/0/norm/scale": False, "layers/0/mixer/q/bias": False,
                 "layers/0/mixer/A_log": False, "layers/0/mixer/dt_bias": False}
    assert not optim.decay_mask(params, logical, decay_embeddings=False)["embed/embedding"]


def test_adamw_matches_numpy_reference():
    rng = np.random.default_rng(0)
    params = {"w/kernel": rng.normal(size=(3, 4)), "n/scale": rng.normal(size=(4,))}
    grads = [{k: rng.normal(size=v.shape) * 3 for k, v in params.items()} for _ in range(5)]
    cfg = train_cfg()
    tx, _ = optim.make_optimizer(cfg, params)
    p = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
    state = tx.init(p)
    # Reference: clip by global norm, Adam moments with bias correction, decoupled decay.
    ref = {k: v.copy() for k, v in params.items()}
    mu = {k: np.zeros_like(v) for k, v in params.items()}
    nu = {k: np.zeros_like(v) for k, v in params.items()}
    for t, g in enumerate(grads):
        upd, state = tx.update({k: jnp.asarray(v, jnp.float32) for k, v in g.items()},
                               state, p)
        p = optax.apply_updates(p, upd)
        norm = math.sqrt(sum(float((v ** 2).sum()) for v in g.values()))
        scale = min(1.0, cfg.grad_clip / norm)
        lr = ref_lr(t)
        for k in ref:
            gk = g[k] * scale
            mu[k] = cfg.b1 * mu[k] + (1 - cfg.b1) * gk
            nu[k] = cfg.b2 * nu[k] + (1 - cfg.b2) * gk ** 2
            mhat = mu[k] / (1 - cfg.b1 ** (t + 1))
            vhat = nu[k] / (1 - cfg.b2 ** (t + 1))
            step = mhat / (np.sqrt(vhat) + cfg.eps)
            if k.endswith("kernel"):
                step = step + cfg.weight_decay * ref[k]
            ref[k] = ref[k] - lr * step
    for k in ref:
        np.testing.assert_allclose(np.asarray(p[k]), ref[k], rtol=2e-5, atol=2e-6)
