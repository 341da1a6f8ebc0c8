"""train.py with Hedgehog trained from scratch beside its attention-distillation loss,
for issue 18's finding that Hedgehog stays at MQAR's floor (session 26).

Hedgehog (Zhang et al. 2024) trains its feature maps to make the linear attention's
weights match softmax attention's: the cross-entropy between softmax(q k^T / sqrt(d)) and
phi(q_t) . phi(k_s) / sum_s' phi(q_t) . phi(k_s'). Our from-scratch runs train on the
next-token loss alone. Here every Hedgehog layer adds, in training steps only,

    LAMBDA * CE(stop_gradient(softmax attention of the layer's own q, k), its linear
                attention's weights)

(mean over heads and query tokens; q, k after the short conv, before the maps) to the
loss. The softmax teacher is held out of the gradient, so only the maps, and q and k
through the student's weights, learn from it. LAMBDA defaults to 1.

    LAMBDA=1 python docs/measurements/session26/hedgehog_distill/patched_train.py \\
        --config=configs/mqar_zoology_paper.py --workdir=... --config.model.mixer=hedgehog

Run from the repository root; every other flag is train.py's. Needs the softmax map
(cfg.hedgehog_map "softmax", the default) and layers that are not scanned or
rematerialised (the losses are collected from the trace of each training step).
"""
import os
import runpy
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.getcwd())
from kernels.common import run_ids, visible_keys  # noqa: E402
from models.mixers.linear import Hedgehog  # noqa: E402
from training import step  # noqa: E402

LAMBDA = float(os.environ.get("LAMBDA", "1"))
_HI = jax.lax.Precision.HIGHEST
# The training step being traced: its Hedgehog layers' pre-map q, k and their losses.
TRACE = {"active": False, "pre_map": {}, "losses": []}

phi, call, loss_sums = Hedgehog._phi, Hedgehog.__call__, step.loss_sums


def stashing_phi(self, x, *, query: bool):
    if TRACE["active"]:
        TRACE["pre_map"]["q" if query else "k"] = x
    return phi(self, x, query=query)


def distill_loss(self, q, k, segment_ids):
    """CE(softmax attention of q, k (held fixed), the maps' linear attention weights)."""
    b, t, _, d = q.shape
    visible = visible_keys(t, run_ids(segment_ids, b, t))              # (B|1, 1, T, S)
    q32, k32 = q.astype(jnp.float32), k.astype(jnp.float32)
    scores = jnp.einsum("bthd,bshd->bhts", q32, k32, precision=_HI) * d ** -0.5
    teacher = jax.lax.stop_gradient(
        jax.nn.softmax(jnp.where(visible, scores, -jnp.inf), axis=-1))
    fq, fk = self.feature_map_q(q32), self.feature_map_k(k32)
    lin = jnp.where(visible, jnp.einsum("bthf,bshf->bhts", fq, fk, precision=_HI), 0.0)
    student = lin / (jnp.sum(lin, axis=-1, keepdims=True) + 1e-30)
    ce = -jnp.sum(jnp.where(visible, teacher * jnp.log(student + 1e-12), 0.0), axis=-1)
    return jnp.mean(ce)


def distilling_call(self, x, *, segment_ids=None):
    y = call(self, x, segment_ids=segment_ids)
    if TRACE["active"]:
        pre = TRACE["pre_map"]
        TRACE["losses"].append(distill_loss(self, pre["q"], pre["k"], segment_ids))
    return y


def loss_sums_with_distillation(model, batch, *, deterministic, **kwargs):
    """The next-token sums, plus LAMBDA * the layers' mean distillation loss times the
    token count (the caller divides the sum by it) in training steps."""
    TRACE.update(active=not deterministic, pre_map={}, losses=[])
    try:
        s, n, c = loss_sums(model, batch, deterministic=deterministic, **kwargs)
    finally:
        TRACE["active"] = False
    if TRACE["losses"]:
        s = s + LAMBDA * jnp.mean(jnp.stack(TRACE["losses"])) * n
    return s, n, c


Hedgehog._phi, Hedgehog.__call__ = stashing_phi, distilling_call
step.loss_sums = loss_sums_with_distillation
sys.argv = ["train.py"] + sys.argv[1:]
runpy.run_path("train.py", run_name="__main__")
