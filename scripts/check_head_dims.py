"""GPU check of the Pallas kernels at head dims the benchmark (D = 128) does not cover.

    python scripts/check_head_dims.py            # every case, one process each
    python scripts/check_head_dims.py CASE       # one case

Each case runs in its own process, so a kernel that fails to compile (e.g. asking for
more shared memory than the GPU has, as the sequential kernels did at K = 256 with three
pipeline stages) is reported and the others still run. Per case: the relative error of
the bf16 Pallas kernel and of the bf16 chunk form against the float32 chunk form
(output and, with grad, dq dk dv), and the median ms of each (forward, or forward +
backward). Based's linear attention has 153 Taylor features, which kernels.ops pads to
256; the gated delta rule runs at K = V = 256.
"""
import pathlib
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

# name: (op, B, T, H, K, V, with gradient)
CASES = {
    "la_k153_v128_train": ("la", 4, 2048, 8, 153, 128, True),     # compare_speed, train
    "la_k153_v128_prefill": ("la", 64, 2048, 8, 153, 128, False),  # compare_speed, decode
    "la_k153_v64_train": ("la", 64, 256, 6, 153, 64, True),       # compare_shakespeare
    "gdn_k256_v256_train": ("gdn", 2, 2048, 8, 256, 256, True),
    "gdn_k256_v256_fwd": ("gdn", 2, 2048, 8, 256, 256, False),
}


def run_case(name):
    import jax
    import jax.numpy as jnp

    from kernels import ops

    op, b, t, h, kd, vd, grad = CASES[name]
    ks = jax.random.split(jax.random.PRNGKey(0), 6)
    if op == "la":  # positive features, as a feature map gives
        q = jax.nn.softplus(jax.random.normal(ks[0], (b, t, h, kd))) * 0.2
        k = jax.nn.softplus(jax.random.normal(ks[1], (b, t, h, kd))) * 0.2
    else:  # unit keys and queries, as the mixer gives
        unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
        q = unit(jax.random.normal(ks[0], (b, t, h, kd)))
        k = unit(jax.random.normal(ks[1], (b, t, h, kd)))
        log_alpha = jax.nn.log_sigmoid(jax.random.normal(ks[3], (b, t, h)))
        beta = jax.nn.sigmoid(jax.random.normal(ks[4], (b, t, h)))
    v = jax.random.normal(ks[2], (b, t, h, vd))
    weights = jax.random.normal(ks[5], (b, t, h, vd))

    def forward(q, k, v, impl):
        if op == "la":
            return ops.linear_attention(q, k, v, impl=impl)
        return ops.gated_delta_rule(q, k, v, log_alpha, beta, impl=impl)

    def loss(q, k, v, impl):
        o = forward(q, k, v, impl)
        return jnp.sum(o.astype(jnp.float32) * weights), o

    results = {}
    for impl, dtype in (("chunk", jnp.float32), ("pallas", jnp.bfloat16),
                        ("chunk", jnp.bfloat16)):
        if grad:
            fn = jax.jit(jax.value_and_grad(lambda *a, i=impl: loss(*a, i),
                                            argnums=(0, 1, 2), has_aux=True))
        else:
            fn = jax.jit(lambda *a, i=impl: ((None, forward(*a, i)), ()))
        args = [x.astype(dtype) for x in (q, k, v)]
        (_, o), grads = fn(*args)
        jax.block_until_ready(o)
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times.append(time.perf_counter() - t0)
        results[(impl, jnp.dtype(dtype).name)] = (
            o.astype(jnp.float32), [x.astype(jnp.float32) for x in grads],
            1e3 * float(np.median(times)))
    ref_o, ref_grads, _ = results[("chunk", "float32")]
    rel = lambda a, r: float(jnp.linalg.norm(a - r) / jnp.linalg.norm(r))  # noqa: E731
    for (impl, dtype), (o, grads, ms) in results.items():
        errs = " ".join(f"d{n} {rel(g, r):.1e}" for n, g, r in zip("qkv", grads, ref_grads))
        print(f"{name:22s} {impl:6s} {dtype:8s} {ms:8.3f} ms  o {rel(o, ref_o):.1e} {errs}",
              flush=True)


def main(argv):
    if argv:
        run_case(argv[0])
        return
    for name in CASES:
        try:
            proc = subprocess.run([sys.executable, __file__, name], capture_output=True,
                                  text=True, timeout=300)
            out = proc.stdout.strip()
            if proc.returncode:
                err = [ln for ln in proc.stderr.splitlines()
                       if "Error" in ln or "RESOURCE" in ln][-1:]
                out += f"\n{name:22s} FAIL rc {proc.returncode}: {err}"
            else:
                out += f"\n{name:22s} OK"
        except subprocess.TimeoutExpired:
            out = f"{name:22s} FAIL timeout"
        print(out, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
