"""Context parallelism (kernels.context_parallel): every op split along time over 2, 4 and
8 simulated CPU devices gives the unsplit op's outputs, final state and gradients
(float32, relative error <= 1e-5), with packed documents whose boundaries fall inside
pieces, exactly at a piece boundary and one token after it, and documents spanning
several devices.

The devices exist only in a fresh process (XLA_FLAGS must be set before jax starts), as
in tests/training/test_distributed.py: one subprocess runs `main` for the whole module
and prints every error as JSON; the tests read them.
"""
import json
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.training.conftest import ROOT, env

TOL = 1e-5
DEVICES = (2, 4, 8)
B, T, H, K, V = 2, 32, 2, 8, 4   # T / 8 = 4 tokens a device; chunk 2 below: 2 chunks
CHUNK = 2


def segment_ids():
    """Row 0: boundaries mid-piece (5, 13), at the 4-device boundary 8 and the 8-device
    boundaries 16 and 20, one-token document at 16; row 1: a document from 1 over 8
    devices' pieces to 25, then one starting one token past a boundary (25)."""
    seg = np.zeros((B, T), np.int32)
    for start, doc in ((5, 1), (8, 2), (13, 3), (16, 4), (17, 5), (20, 6)):
        seg[0, start:] = doc
    seg[1, 1:] = 7
    seg[1, 25:] = 8
    return seg


def _cases():
    """name -> (function of the differentiable inputs, those inputs). Each function
    takes `cp`, kernels.context_parallel (split) or kernels.ops (the unsplit reference,
    the same signatures), and returns a pytree of outputs and states."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.key(0), 8)
    q = jax.random.normal(keys[0], (B, T, H, K))
    k = jax.random.normal(keys[1], (B, T, H, K))
    v = jax.random.normal(keys[2], (B, T, H, V))
    log_decay = -0.4 * jax.nn.softplus(jax.random.normal(keys[3], (B, T, H)))
    beta = jax.nn.sigmoid(jax.random.normal(keys[4], (B, T, H)))
    s0 = 0.3 * jax.random.normal(keys[5], (B, H, K, V))
    z0 = jnp.abs(jax.random.normal(keys[6], (B, H, K)))
    kv = jax.random.normal(keys[7], (B, T, 1, K))  # one kv head: grouped-query attention
    seg = jnp.asarray(segment_ids())
    positive = lambda x: jax.nn.elu(x) + 1  # noqa: E731
    unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731

    def la(cp, q, k, v, **kw):
        return cp.linear_attention(q, k, v, return_state=True, chunk_size=CHUNK, **kw)

    return {
        "linear_normalised": (
            lambda cp, q, k, v: la(cp, positive(q), positive(k), v, segment_ids=seg),
            (q, k, v)),
        "linear_normalised_initial_state": (
            lambda cp, q, k, v, s0, z0: la(cp, positive(q), positive(k), v,
                                           initial_state=(jnp.abs(s0), z0)),
            (q, k, v, s0, z0)),
        "linear_decay_per_token": (
            lambda cp, q, k, v, g: la(cp, q, k, v, normalize=False, log_decay=g,
                                      segment_ids=seg),
            (q, k, v, log_decay)),
        "linear_decay_per_head_initial_state": (
            lambda cp, q, k, v, s0: la(cp, q, k, v, normalize=False,
                                       log_decay=jnp.array([-0.1, -0.7]),
                                       initial_state=s0),
            (q, k, v, s0)),
        "linear_no_decay": (
            lambda cp, q, k, v: la(cp, q, k, v, normalize=False, segment_ids=seg),
            (q, k, v)),
        "gated_delta": (
            lambda cp, q, k, v, g, b: cp.gated_delta_rule(
                q, unit(k), v, g, b, segment_ids=seg, return_state=True,
                chunk_size=CHUNK),
            (q, k, v, log_decay, beta)),
        "gated_delta_initial_state": (
            lambda cp, q, k, v, g, b, s0: cp.gated_delta_rule(
                q, unit(k), v, g, b, initial_state=s0, return_state=True,
                chunk_size=CHUNK),
            (q, k, v, log_decay, beta, s0)),
        "delta_no_decay": (
            lambda cp, q, k, v, b: cp.gated_delta_rule(
                q, unit(k), v, jnp.zeros((B, T, H)), b, segment_ids=seg,
                return_state=True, chunk_size=CHUNK),
            (q, k, v, beta)),
        "softmax_gqa": (
            lambda cp, q, k, v: cp.softmax_attention(q, k, v, segment_ids=seg),
            (q, kv, kv * 0.5 + 1.0)),
        # window 3: the previous device's last 2 keys (ppermute), on every split;
        # window 9: more than a 4- or 8-device piece + 1, so the all-gather there.
        "sliding_window_halo": (
            lambda cp, q, k, v: cp.sliding_window_attention(q, k, v, window=3,
                                                            segment_ids=seg),
            (q, k, v)),
        "sliding_window_gather": (
            lambda cp, q, k, v: cp.sliding_window_attention(q, k, v, window=9,
                                                            segment_ids=seg),
            (q, k, v)),
    }


def _conv_case():
    """models.layers.ShortConv (4 taps) through context_parallel.short_conv."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from models.config import ModelConfig
    from models.layers import ShortConv

    conv = ShortConv(ModelConfig(), 6, rngs=nnx.Rngs(0), bias=True)
    graphdef, state = nnx.split(conv)
    x = jax.random.normal(jax.random.key(1), (B, T, 6))
    seg = jnp.asarray(segment_ids())
    init = jax.random.normal(jax.random.key(2), (B, 3, 6))

    def fn(_, state, x, init):
        return nnx.merge(graphdef, state)(x, segment_ids=seg, state=init)

    def fn_plain(_, state, x, init):  # no documents, a state from before the sequence
        return nnx.merge(graphdef, state)(x, state=init)
    return {"short_conv": (fn, (state, x, init)), "short_conv_state": (fn_plain,
                                                                       (state, x, init))}


def _value_and_grads(cases, split):
    """One function of every case's inputs: {name: ((loss, outputs), gradients)}, the loss
    a fixed random projection of the case's outputs and states, split over the context's
    sequence mesh (kernels.context_parallel) or not (kernels.ops). All cases in one jit:
    on the CPU one compile of them all is a third faster than one each."""
    import jax
    import jax.numpy as jnp

    from kernels import context_parallel as cp
    from kernels import ops

    def one(fn):
        def loss_and_out(*args):
            out = fn(cp if split else ops, *args)
            leaves = jax.tree.leaves(out)
            weights = [jax.random.normal(jax.random.fold_in(jax.random.key(9), i), x.shape)
                       for i, x in enumerate(leaves)]
            return sum(jnp.sum(w * x) for w, x in zip(weights, leaves)), out
        return loss_and_out

    def all_cases(inputs):
        return {name: jax.value_and_grad(one(cases[name][0]), argnums=tuple(
            range(len(args))), has_aux=True)(*args) for name, args in inputs.items()}
    return all_cases


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def errors_of(cases, plan):
    """{name: {n: relative errors of outputs/states and gradients, split over n devices
    against unsplit, and the collectives of the split case's jaxpr}}."""
    import jax
    from jax.sharding import Mesh

    from kernels import context_parallel as cp

    inputs = {name: cases[name][1] for name in plan}
    want = jax.jit(_value_and_grads(cases, split=False))(inputs)
    out = {name: {} for name in plan}
    for n in sorted({n for ns in plan.values() for n in ns}):
        names = [name for name, ns in plan.items() if n in ns]
        mesh = Mesh(np.array(jax.devices()[:n]).reshape(1, 1, 1, n),
                    ("data", "fsdp", "tensor", "sequence"))
        with cp.sequence_mesh(mesh):
            split = _value_and_grads(cases, split=True)
            got = jax.jit(split)({name: inputs[name] for name in names})
            texts = {name: str(jax.make_jaxpr(split)({name: inputs[name]}))
                     for name in names}
        for name in names:
            (_, got_out), got_grads = got[name]
            (_, want_out), want_grads = want[name]
            out[name][n] = {
                "outputs": [_rel(a, b) for a, b in zip(jax.tree.leaves(got_out),
                                                        jax.tree.leaves(want_out))],
                "grads": [_rel(a, b) for a, b in zip(jax.tree.leaves(got_grads),
                                                      jax.tree.leaves(want_grads))],
                "collectives": sorted(c for c in ("ppermute", "all_gather", "psum")
                                      if c in texts[name]),
                "shard_map": "shard_map" in texts[name]}
    return out


LINEAR = ["linear_normalised", "linear_normalised_initial_state", "linear_decay_per_token",
          "linear_decay_per_head_initial_state", "linear_no_decay", "gated_delta",
          "gated_delta_initial_state", "delta_no_decay"]
ATTENTION = ["softmax_gqa", "sliding_window_halo", "sliding_window_gather"]
CONV = ["short_conv", "short_conv_state"]
ALL = LINEAR + ATTENTION + CONV
# The default suite: every case over 8 devices (the most boundaries), the two linear
# workhorses over 2 and 4 as well; -m slow: every case over 2, 4 and 8.
DEFAULT_PLAN = {name: [8] for name in ALL}
DEFAULT_PLAN.update({"gated_delta": [2, 4, 8], "linear_decay_per_token": [2, 4, 8],
                     "sliding_window_gather": [2, 8]})
FULL_PLAN = {name: list(DEVICES) for name in ALL}


def main(plan):
    """plan: {case name: [device counts]}; prints the errors as JSON after "ERRORS"."""
    start = time.time()
    out = errors_of({**_cases(), **_conv_case()}, plan)
    print(f"{time.time() - start:.1f} s", file=sys.stderr, flush=True)
    print("ERRORS" + json.dumps(out))


def run_on_8_devices(module: str, plan):
    """`module`'s main(plan) in a subprocess over 8 simulated CPU devices; the errors
    it prints after "ERRORS" as JSON."""
    r = subprocess.run(
        [sys.executable, "-c", f"import json, sys; from {module} import main; "
         "main(json.loads(sys.argv[1]))", json.dumps(plan)],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
        env=env(XLA_FLAGS="--xla_force_host_platform_device_count=8"))
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.split("ERRORS", 1)[1])


def _run(plan):
    return run_on_8_devices("tests.kernels.test_context_parallel", plan)


@pytest.fixture(scope="module")
def errors():
    return _run(DEFAULT_PLAN)


def _check(errors, name):
    for n, e in errors[name].items():
        assert e["shard_map"], (name, n, "not split")
        assert max(e["outputs"]) <= TOL, (name, n, e["outputs"])
        assert max(e["grads"]) <= TOL, (name, n, e["grads"])


@pytest.mark.parametrize("name", ALL)
def test_split_equals_unsplit(errors, name):
    _check(errors, name)


@pytest.mark.slow
def test_split_equals_unsplit_over_2_4_8_devices():
    errors = _run(FULL_PLAN)
    for name in ALL:
        assert sorted(errors[name]) == ["2", "4", "8"]
        _check(errors, name)


def test_states_pass_between_devices(errors):
    """The linear ops pass states by ppermute (the doubling scan) and broadcast the final
    state by psum; softmax gathers; short windows and convs only ppermute; a window
    longer than a piece + 1 (9 > 32 / 8 + 1) gathers, one that fits (9 <= 32 / 2 + 1)
    does not."""
    for name in LINEAR:
        for n, e in errors[name].items():
            assert {"ppermute", "psum"} <= set(e["collectives"]), (name, n)
    assert "all_gather" in errors["softmax_gqa"]["8"]["collectives"]
    assert errors["sliding_window_halo"]["8"]["collectives"] == ["ppermute"]
    assert "ppermute" in errors["short_conv"]["8"]["collectives"]
    assert "all_gather" in errors["sliding_window_gather"]["8"]["collectives"]
    assert "all_gather" not in errors["sliding_window_gather"]["2"]["collectives"]


def test_segment_ids_cross_device_boundaries():
    """The documents of the tests start inside pieces, at piece boundaries and one token
    past them, and span several pieces, for every split."""
    seg = segment_ids()
    for n in DEVICES:
        piece = T // n
        starts = [t for t in range(1, T) if (seg[:, t] != seg[:, t - 1]).any()]
        assert any(t % piece == 0 for t in starts), n
        assert any(t % piece not in (0,) for t in starts), n
        spans = [(seg[r] == d).nonzero()[0] for r in range(B) for d in np.unique(seg[r])]
        assert any(s[0] // piece != s[-1] // piece for s in spans), n


if __name__ == "__main__":  # the full grid, printed: XLA_FLAGS as _run sets it
    main(FULL_PLAN)
