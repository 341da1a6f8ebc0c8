"""GPU check: softmax attention with packed-document segments, vmapped over a population
axis and differentiated (what training.population runs), on cuDNN against the XLA form.

Before kernels/attention.py's _heads_under_vmap this stopped in the backward with "cannot
reshape array of shape (3, 32, 1, 512, 512) into shape (96, 4, 512, 512)" (session 35's
first NIAH population; kernels.attention's mask_every_head, which training.population
sets, is the fix). Prints the largest differences of outputs and gradients.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from kernels import attention

P, B, T, H, D = 3, 4, 512, 4, 64
rng = np.random.default_rng(0)
q, k, v = (jnp.asarray(rng.normal(size=(P, B, T, H, D)), jnp.bfloat16) for _ in range(3))
seg = jnp.asarray((rng.random((P, B, T)) < 0.01).cumsum(-1), jnp.int32)


@functools.partial(jax.jit, static_argnums=0)  # a jitted loss inside vmap(value_and_grad), as training.population's step
def loss(impl, q, k, v, seg):
    o = attention.softmax_attention(q, k, v, segment_ids=seg, causal=True, impl=impl,
                                    mask_every_head=True)
    return jnp.sum(o.astype(jnp.float32) ** 2), o


for name, impl in (("auto (cuDNN)", "auto"), ("xla", "xla")):
    step = jax.jit(jax.vmap(jax.value_and_grad(lambda *a: loss(impl, *a), argnums=(0, 1, 2),
                                               has_aux=True)))
    (_, out), grads = step(q, k, v, seg)
    if impl == "auto":
        ref_out, ref_grads = out, grads
        print(name, "compiled; uses cuDNN:", "cudnn" in step.lower(q, k, v, seg).as_text())
    else:
        err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref_out.astype(jnp.float32))))
        gerr = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
                   for a, b in zip(grads, ref_grads))
        print(f"cuDNN vs XLA under vmap+grad: max |out| diff {err:.3g}, max |grad| diff "
              f"{gerr:.3g} (bf16 inputs)")
