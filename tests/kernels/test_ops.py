"""kernels.ops against float64 NumPy token loops (tests/kernels/reference.py).

Forward: every impl (parallel, recurrent, chunk) in float32 vs the NumPy reference.
Gradients: every impl in float32 vs jax.grad of the recurrent impl run in float64 under
x64; that float64 recurrent forward is itself checked against NumPy, anchoring the chain.
Relative error ||a - b|| / ||b|| per array, <= 1e-5.
"""
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import ops
from tests.kernels import reference as ref

IMPLS = ("parallel", "recurrent", "chunk")
TOL = 1e-5
B, H, F, DV = 2, 2, 6, 5  # F != Dv on purpose


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    denom = np.linalg.norm(b)
    return np.linalg.norm(a - b) / (denom if denom > 0 else 1.0)


def assert_close(a, b, what, tol=TOL):
    err = rel(a, b)
    assert err <= tol, f"{what}: relative error {err:.2e} > {tol:.0e}"


# ----------------------------------------------------------------------------- inputs

def segments(t, b=B):
    """Packed documents: row 0 has several (incl. a length-1 one), row 1 one document."""
    ids = np.ones((b, t), np.int32)
    if t > 1:
        cuts = sorted({max(1, t // 4), max(1, t // 4) + 1, max(1, (2 * t) // 3)})
        for i, c in enumerate(cuts):
            ids[0, c:] = i + 2
    return ids


def make_inputs(op, t, *, decay="bth", init=True, segs=True, seed=0, b=B):
    """Random float64 NumPy inputs for `op` in {"la", "la_unnorm", "gdr"}."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(b, t, H, F))
    k = rng.normal(size=(b, t, H, F))
    v = rng.normal(size=(b, t, H, DV))
    x = dict(v=v)
    if op == "la":  # feature-mapped (positive) q, k so the normaliser stays away from 0
        x["q"], x["k"] = np.exp(0.5 * q), np.exp(0.5 * k)
    elif op == "la_unnorm":
        x["q"], x["k"] = q, k
    else:  # gated delta rule: unit keys, as the mixer feeds it
        x["q"], x["k"] = q, k / np.linalg.norm(k, axis=-1, keepdims=True)
    if op == "gdr":
        x["log_alpha"] = -rng.uniform(0.0, 0.7, size=(b, t, H))
        x["beta"] = rng.uniform(0.05, 1.0, size=(b, t, H))
    elif decay == "h":
        x["log_decay"] = -rng.uniform(0.01, 0.5, size=(H,))
    elif decay == "bth":
        x["log_decay"] = -rng.uniform(0.0, 0.7, size=(b, t, H))
    if init:
        s0 = rng.normal(size=(b, H, F, DV))
        x["initial_state"] = (s0, np.exp(rng.normal(size=(b, H, F)))) if op == "la" else s0
    if segs:
        x["segment_ids"] = segments(t, b)
    return x


def reference(op, x):
    """(outputs, final state leaves) from the NumPy reference."""
    if op == "gdr":
        o, s = ref.gated_delta_rule(x["q"], x["k"], x["v"], x["log_alpha"], x["beta"],
                                    segment_ids=x.get("segment_ids"),
                                    initial_state=x.get("initial_state"))
        return o, (s,)
    o, s, z = ref.linear_attention(x["q"], x["k"], x["v"], normalize=op == "la",
                                   log_decay=x.get("log_decay"),
                                   segment_ids=x.get("segment_ids"),
                                   initial_state=x.get("initial_state"))
    return o, ((s, z) if op == "la" else (s,))


def run_op(op, x, impl, chunk_size=64, dtype=jnp.float32):
    """Call kernels.ops (jitted: one compile instead of many eager ops) on x cast to dtype;
    returns (o, tuple of state leaves)."""
    arrays = {n: jax.tree.map(lambda y: jnp.asarray(y, dtype), a)
              for n, a in x.items() if n != "segment_ids"}
    return _jit_op(arrays, x.get("segment_ids"), op, impl, chunk_size)


def _op_body(arrays, seg, op, impl, chunk_size):
    kw = dict(segment_ids=seg, initial_state=arrays.get("initial_state"), return_state=True,
              impl=impl, chunk_size=chunk_size)
    if op == "gdr":
        o, s = ops.gated_delta_rule(arrays["q"], arrays["k"], arrays["v"],
                                    arrays["log_alpha"], arrays["beta"], **kw)
        return o, (s,)
    o, s = ops.linear_attention(arrays["q"], arrays["k"], arrays["v"], normalize=op == "la",
                                log_decay=arrays.get("log_decay"), **kw)
    return o, (tuple(s) if op == "la" else (s,))


_jit_op = jax.jit(_op_body, static_argnums=(2, 3, 4))


def run_eager(op, x, impl, chunk_size, dtype=jnp.float32):
    """As run_op, without jit: dispatch happens on every call (for the dispatch tests)."""
    arrays = {n: jax.tree.map(lambda y: jnp.asarray(y, dtype), a)
              for n, a in x.items() if n != "segment_ids"}
    return _op_body(arrays, x.get("segment_ids"), op, impl, chunk_size)


def check_forward(op, x, impl, chunk_size=64, tol=TOL):
    ro, rs = reference(op, x)
    o, s = run_op(op, x, impl, chunk_size)
    assert o.dtype == jnp.float32
    assert_close(o, ro, f"{op}/{impl}/C={chunk_size} output", tol)
    for i, (a, b) in enumerate(zip(s, rs)):
        assert a.dtype == jnp.float32
        assert_close(a, b, f"{op}/{impl}/C={chunk_size} state[{i}]", tol)


# ----------------------------------------------------------------------------- worked examples

def _bt1(rows):
    return jnp.asarray(np.array(rows, np.float32))[None, :, None, :]


@pytest.mark.parametrize("impl", IMPLS)
def test_seed000_three_token_elu_plus_one(impl):
    phi = lambda x: jax.nn.elu(x) + 1.0
    q = phi(_bt1([[0, 0], [1, 0], [0, 1]]))
    k = phi(_bt1([[1, 0], [0, 1], [0, 0]]))
    v = _bt1([[1, 0], [0, 1], [1, 1]])
    for cs in (1, 2, 64):
        o, (s, z) = ops.linear_attention(q, k, v, eps=0.0, impl=impl, chunk_size=cs,
                                         return_state=True)
        np.testing.assert_allclose(o[0, :, 0], [[1, 0], [5 / 9, 4 / 9], [7 / 12, 2 / 3]],
                                   rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(s[0, 0], [[3, 2], [2, 3]], rtol=1e-6)
        np.testing.assert_allclose(z[0, 0], [4, 4], rtol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_seed002_gated_delta_update(impl):
    s_old = np.array([[3.0, 0.0], [1.0, 2.0], [2.0, 1.0]])  # seed's (values x keys) layout
    q, k, v = _bt1([[0.6, 0.8]]), _bt1([[1.0, 0.0]]), _bt1([[0.0, 4.0, 1.0]])
    log_alpha = jnp.full((1, 1, 1), np.log(0.5), jnp.float32)
    beta = jnp.ones((1, 1, 1), jnp.float32)
    s0 = jnp.asarray(s_old.T, jnp.float32)[None, None]
    o, s = ops.gated_delta_rule(q, k, v, log_alpha, beta, initial_state=s0, impl=impl,
                                return_state=True)
    np.testing.assert_allclose(o[0, 0, 0], [0.0, 3.2, 1.0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(s[0, 0].T, [[0, 0], [4, 1], [1, 0.5]], rtol=1e-6, atol=1e-6)


def test_delta_rule_stores_orthonormal_keys_exactly():
    """beta = 1, alpha = 1, orthonormal keys: reading key i returns the last value written
    at key i (CHUNKWISE.md's check), here across chunk boundaries."""
    rng = np.random.default_rng(3)
    keys = np.linalg.qr(rng.normal(size=(F, F)))[0].T  # rows orthonormal
    order = [0, 1, 2, 0, 3, 1, 4, 5, 0]
    t = len(order)
    k = jnp.asarray(keys[order], jnp.float32)[None, :, None]
    v = jnp.asarray(rng.normal(size=(1, t, 1, DV)), jnp.float32)
    ones, zeros = jnp.ones((1, t, 1)), jnp.zeros((1, t, 1))
    for impl in IMPLS:
        _, s = ops.gated_delta_rule(k, k, v, zeros, ones, impl=impl, chunk_size=4,
                                    return_state=True)
        for i in range(F):
            last = max(j for j, o in enumerate(order) if o == i)
            np.testing.assert_allclose(keys[i] @ np.asarray(s[0, 0]), v[0, last, 0],
                                       rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- forward sweeps

# (T, chunk size): T = 1, T not a multiple of the chunk, several chunk sizes.
T_CHUNKS = [(1, 64), (37, 16), (130, 32)]


@pytest.mark.parametrize("op", ["la", "la_unnorm", "gdr"])
@pytest.mark.parametrize("t,cs", T_CHUNKS)
def test_forward_all_features_vs_reference(op, t, cs):
    """Decay (B,T,H), initial state and segments all at once."""
    x = make_inputs(op, t, seed=t + cs)
    for impl in IMPLS:
        check_forward(op, x, impl, cs)


@pytest.mark.parametrize("op", ["la", "la_unnorm"])
@pytest.mark.parametrize("decay", [None, "h", "bth"])
def test_linear_attention_decay_forms(op, decay):
    x = make_inputs(op, 37, decay=decay, init=False, segs=False, seed=7)
    for impl in IMPLS:
        check_forward(op, x, impl, chunk_size=16)


@pytest.mark.slow
@pytest.mark.parametrize("op", ["la", "la_unnorm", "gdr"])
@pytest.mark.parametrize("t", [1, 37, 130])
@pytest.mark.parametrize("cs", [16, 32, 64])
@pytest.mark.parametrize("decay", [None, "h", "bth"])
@pytest.mark.parametrize("init", [False, True])
@pytest.mark.parametrize("segs", [False, True])
def test_forward_full_grid(op, t, cs, decay, init, segs):
    if op == "gdr" and decay != "bth":
        pytest.skip("the gated delta rule always has its gate")
    x = make_inputs(op, t, decay=decay, init=init, segs=segs, seed=t * cs)
    for impl in IMPLS:
        check_forward(op, x, impl, cs)


@pytest.mark.parametrize("alpha", ["zero", "neg_inf", "one"])
def test_gated_delta_gates_at_their_ends(alpha):
    x = make_inputs("gdr", 37, seed=11)
    la = x["log_alpha"].copy()
    # every third token takes the extreme gate, so chunks mix extreme and ordinary ones
    la[:, ::3] = {"zero": -1e4, "neg_inf": -np.inf, "one": 0.0}[alpha]
    x["log_alpha"] = la
    # beta 0 on every 4th token, 1 on the next, ordinary elsewhere
    pos = np.arange(37)[None, :, None]
    x["beta"] = np.where(pos % 4 == 0, 0.0, np.where(pos % 4 == 1, 1.0, x["beta"]))
    for impl in IMPLS:
        check_forward("gdr", x, impl, chunk_size=16)
    g = grads("gdr", x, "chunk", 16, jnp.float32)
    for name, val in g.items():
        assert np.all(np.isfinite(np.asarray(val))), f"non-finite gradient for {name}"


@pytest.mark.parametrize("impl", IMPLS)
def test_linear_attention_decay_to_zero_forgets(impl):
    """log_decay -1e4 / -inf at a token erases everything written before it."""
    x = make_inputs("la_unnorm", 37, init=False, segs=False, seed=5)
    for big in (-1e4, -np.inf):
        ld = x["log_decay"].copy()
        ld[:, 20] = big
        x["log_decay"] = ld
        check_forward("la_unnorm", x, impl, chunk_size=16)
        alone = dict(x, q=x["q"][:, 20:], k=x["k"][:, 20:], v=x["v"][:, 20:],
                     log_decay=x["log_decay"][:, 20:])
        o_full, _ = run_op("la_unnorm", x, impl, 16)
        o_tail, _ = run_op("la_unnorm", alone, impl, 16)
        np.testing.assert_allclose(o_full[:, 20:], o_tail, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- gradients

def _loss_inputs(op, x):
    """Differentiable inputs (a dict) and the fixed ones."""
    names = ["q", "k", "v", "initial_state"] + (
        ["log_alpha", "beta"] if op == "gdr" else ["log_decay"])
    return {n: x[n] for n in names if n in x}


def grads(op, x, impl, chunk_size, dtype):
    """jax.grad of sum(o * w_o) + sum(state * w_s) w.r.t. every differentiable input."""
    rng = np.random.default_rng(99)
    ro, rs = reference(op, x)
    w_o = rng.normal(size=ro.shape)
    w_s = [rng.normal(size=s.shape) for s in rs]
    seg = x.get("segment_ids")

    def loss(params):
        y = dict(x, **params)
        y["segment_ids"] = seg
        o, s = run_op(op, y, impl, chunk_size, dtype)
        total = jnp.sum(o * jnp.asarray(w_o, dtype))
        for a, w in zip(s, w_s):
            total = total + jnp.sum(a * jnp.asarray(w, dtype))
        return total

    params = jax.tree.map(lambda a: jnp.asarray(a, dtype), _loss_inputs(op, x))
    return jax.jit(jax.grad(loss))(params)


def float64_recurrent_grads(op, x, chunk_size):
    """The oracle: jax.grad of the recurrent impl in float64, its forward anchored to NumPy."""
    with jax.enable_x64(True):
        ro, rs = reference(op, x)
        o, s = run_op(op, x, "recurrent", chunk_size, jnp.float64)
        assert o.dtype == jnp.float64
        assert_close(o, ro, "float64 recurrent output", 1e-12)
        for a, b in zip(s, rs):
            assert_close(a, b, "float64 recurrent state", 1e-12)
        g = grads(op, x, "recurrent", chunk_size, jnp.float64)
        return jax.tree.map(np.asarray, g)


def check_grads(op, x, chunk_size, impls=IMPLS, tol=TOL):
    want = float64_recurrent_grads(op, x, chunk_size)
    for impl in impls:
        got = grads(op, x, impl, chunk_size, jnp.float32)
        flat_got = jax.tree_util.tree_flatten_with_path(got)[0]
        flat_want = jax.tree.leaves(want)
        for (path, g), w in zip(flat_got, flat_want):
            assert g.dtype == jnp.float32
            assert_close(g, w, f"{op}/{impl}/C={chunk_size} grad {jax.tree_util.keystr(path)}",
                         tol)


@pytest.mark.parametrize("op,t,cs", [("la", 37, 16), ("la_unnorm", 37, 16), ("gdr", 37, 16),
                                     ("la", 130, 32), ("gdr", 130, 32), ("gdr", 1, 64)])
def test_gradients_all_features(op, t, cs):
    check_grads(op, make_inputs(op, t, seed=3 * t + cs), cs)


def test_gradients_head_decay():
    check_grads("la", make_inputs("la", 37, decay="h", segs=False, seed=4), 16)


@pytest.mark.slow
@pytest.mark.parametrize("op", ["la", "la_unnorm", "gdr"])
@pytest.mark.parametrize("t", [37, 130])
@pytest.mark.parametrize("cs", [16, 32, 64])
@pytest.mark.parametrize("decay", [None, "h", "bth"])
def test_gradients_grid(op, t, cs, decay):
    if op == "gdr" and decay != "bth":
        pytest.skip("the gated delta rule always has its gate")
    check_grads(op, make_inputs(op, t, decay=decay, seed=t + cs), cs)


@pytest.mark.parametrize("op,decay,segs", [("la", "bth", True), ("la_unnorm", None, True),
                                           ("la", "h", False), ("gdr", "bth", True)])
def test_chunk_form_in_segments_is_the_whole_sequence_form(op, decay, segs, monkeypatch):
    """Past _chunk.SEGMENT_TOKENS tokens the chunk form runs segment by segment, carrying
    the state (memory for one segment's per-chunk tensors): outputs, final state and
    gradients still equal the float64 references, with packed documents whose cuts fall
    inside and at the ends of segments, an initial state, and T not a multiple of the
    segment (here 16 tokens, chunks of 8, T = 45: three segments and a padded one)."""
    from kernels import chunk as chunk_mod
    calls = []
    real = chunk_mod.in_segments

    def counting(*args, **kwargs):
        calls.append(args[-1])
        return real(*args, **kwargs)

    monkeypatch.setattr(chunk_mod, "SEGMENT_TOKENS", 16)
    monkeypatch.setattr(chunk_mod, "in_segments", counting)
    jax.clear_caches()           # traces cached at the default segment length
    try:
        x = make_inputs(op, 45, decay=decay, segs=segs, seed=11)
        if segs:                 # a document starting exactly at a segment boundary
            x["segment_ids"][1, 32:] = 7
        check_forward(op, x, "chunk", chunk_size=8)
        check_grads(op, x, 8, impls=("chunk",))
        assert calls and set(calls) == {16}
    finally:
        jax.clear_caches()


# ----------------------------------------------------------------------------- composition

@pytest.mark.parametrize("op", ["la", "la_unnorm", "gdr"])
@pytest.mark.parametrize("impl", IMPLS)
def test_two_halves_with_carried_state_equal_one_run(op, impl):
    x = make_inputs(op, 37, seed=21)  # segments change at 9, 10 and 24; split inside one
    o_full, s_full = run_op(op, x, impl, 16)
    split = 17
    per_token = [n for n in x if n not in ("initial_state",) and not
                 (n == "log_decay" and x[n].ndim == 1)]
    first = dict(x, **{n: x[n][:, :split] for n in per_token})
    o1, s1 = run_op(op, first, impl, 16)
    second = dict(x, **{n: x[n][:, split:] for n in per_token})
    second["initial_state"] = (tuple(np.asarray(a) for a in s1) if op == "la"
                               else np.asarray(s1[0]))
    o2, s2 = run_op(op, second, impl, 16)
    assert_close(jnp.concatenate([o1, o2], axis=1), o_full, "two halves output")
    for a, b in zip(s2, s_full):
        assert_close(a, b, "two halves state")


@pytest.mark.parametrize("op", ["la", "gdr"])
@pytest.mark.parametrize("impl", IMPLS)
def test_packed_documents_equal_separate_runs(op, impl):
    """Documents packed with segment_ids == each document run alone; an initial state
    belongs to the first document only; a later run reusing an earlier id is still new."""
    lengths = [5, 17, 1, 14]
    ids = np.concatenate([np.full(n, i) for n, i in zip(lengths, [1, 2, 3, 1])])[None]
    x = make_inputs(op, sum(lengths), init=True, segs=False, seed=31, b=1)
    o_packed, _ = run_op(op, dict(x, segment_ids=ids), impl, 8)
    start = 0
    for i, n in enumerate(lengths):
        doc = {m: a[:, start:start + n] for m, a in x.items() if m != "initial_state"}
        if i == 0:
            doc["initial_state"] = x["initial_state"]
        o_doc, _ = run_op(op, doc, impl, 8)
        assert_close(o_packed[:, start:start + n], o_doc, f"document {i}")
        start += n


# ----------------------------------------------------------------------------- dtypes, dispatch

@pytest.mark.parametrize("impl", IMPLS)
def test_bfloat16_inputs_give_bfloat16_outputs_and_float32_states(impl):
    x = make_inputs("gdr", 37, seed=41)
    o, (s,) = run_op("gdr", x, impl, 16, dtype=jnp.bfloat16)
    assert o.dtype == jnp.bfloat16 and s.dtype == jnp.float32
    ro, _ = reference("gdr", x)
    assert rel(o, ro) < 5e-2  # bf16 inputs: a few digits only
    x = make_inputs("la", 37, seed=41)
    o, (s, z) = run_op("la", x, impl, 16, dtype=jnp.bfloat16)
    assert o.dtype == jnp.bfloat16 and s.dtype == z.dtype == jnp.float32


def test_auto_on_cpu_is_chunk():
    x = make_inputs("gdr", 37, seed=1)
    o_auto, _ = run_op("gdr", x, "auto", 16)
    o_chunk, _ = run_op("gdr", x, "chunk", 16)
    np.testing.assert_array_equal(o_auto, o_chunk)


def _fake_pallas(monkeypatch, *, supported, dims=None):
    """A stand-in kernels.pallas on a (faked) GPU backend: records the calls (and in dims
    the (key, value) head dims each was given) and runs the recurrent form."""
    calls = []
    dims = [] if dims is None else dims

    def linear_attention(q, k, v, *, normalize, eps, log_decay, initial_state,
                         return_state, chunk_size, segment_ids=None):
        calls.append("la")
        dims.append((k.shape[-1], v.shape[-1]))
        if not supported:
            raise NotImplementedError("fake kernel")
        return ops.linear_attention(q, k, v, normalize=normalize, eps=eps,
                                    log_decay=log_decay, initial_state=initial_state,
                                    return_state=return_state, impl="recurrent",
                                    segment_ids=segment_ids)

    def gated_delta_rule(q, k, v, log_alpha, beta, *, initial_state, return_state,
                         chunk_size, segment_ids=None):
        calls.append("gdr")
        dims.append((k.shape[-1], v.shape[-1]))
        if not supported:
            raise NotImplementedError("fake kernel")
        return ops.gated_delta_rule(q, k, v, log_alpha, beta, initial_state=initial_state,
                                    return_state=return_state, impl="recurrent",
                                    segment_ids=segment_ids)

    mod = types.ModuleType("kernels.pallas")
    mod.linear_attention, mod.gated_delta_rule = linear_attention, gated_delta_rule
    monkeypatch.setitem(sys.modules, "kernels.pallas", mod)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    return calls


@pytest.mark.parametrize("supported", [True, False])
def test_auto_dispatches_to_pallas_on_gpu(monkeypatch, supported):
    """On a GPU, "auto" sends bf16 inputs to the kernels (packed documents too) and
    float32 inputs to the chunk form."""
    calls = _fake_pallas(monkeypatch, supported=supported)
    bf16, tol = jnp.bfloat16, 3e-2
    x = make_inputs("gdr", 9, segs=False, seed=2)
    want, _ = reference("gdr", x)
    o, _ = run_eager("gdr", x, "auto", 4, bf16)  # NotImplementedError falls back to chunk
    assert calls == ["gdr"]
    assert_close(o, want, "auto on (fake) gpu", tol)
    x = make_inputs("la", 9, segs=False, seed=2)
    o, _ = run_eager("la", x, "auto", 4, bf16)
    assert calls == ["gdr", "la"]
    assert_close(o, reference("la", x)[0], "auto on (fake) gpu", tol)
    # packed documents (segment_ids) go to the kernel too
    x = make_inputs("gdr", 9, segs=True, seed=2)
    o, _ = run_eager("gdr", x, "auto", 4, bf16)
    assert calls == ["gdr", "la", "gdr"]
    assert_close(o, reference("gdr", x)[0], "auto with segment_ids on (fake) gpu", tol)
    # float32 inputs: the chunk form, no kernel call
    o, _ = run_eager("gdr", x, "auto", 4)
    assert calls == ["gdr", "la", "gdr"]
    assert_close(o, reference("gdr", x)[0], "float32 auto on (fake) gpu")
    if not supported:
        with pytest.raises(NotImplementedError):
            run_eager("gdr", make_inputs("gdr", 9, segs=False), "pallas", 4)


@pytest.mark.parametrize("op", ["la", "la_unnorm", "gdr"])
def test_pallas_call_pads_untiled_head_dims(monkeypatch, op):
    """Head dims the kernels do not tile (F = 6, Dv = 5) reach the kernel zero-padded to
    16 and come back cut to the caller's: outputs, states (with a nonzero initial state)
    and gradients equal the float64 references."""
    dims = []
    _fake_pallas(monkeypatch, supported=True, dims=dims)
    x = make_inputs(op, 37, segs=False, seed=11)
    check_forward(op, x, "pallas", 16)
    check_grads(op, x, 16, impls=("pallas",))
    assert dims and set(dims) == {(16, 16)}
    assert [ops._pallas_dim(d) for d in (6, 16, 17, 153, 256, 273)] == [16, 16, 32, 256,
                                                                         256, 273]


def test_errors_name_the_problem():
    x = make_inputs("gdr", 5, segs=False, init=False)
    q, k, v = (jnp.asarray(x[n], jnp.float32) for n in ("q", "k", "v"))
    la, be = jnp.asarray(x["log_alpha"]), jnp.asarray(x["beta"])
    with pytest.raises(ValueError, match="unknown impl 'fast'.*parallel, recurrent, chunk"):
        ops.gated_delta_rule(q, k, v, la, be, impl="fast")
    with pytest.raises(ValueError, match="q .* and k .* must have the same shape"):
        ops.linear_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="log_decay must have shape"):
        ops.linear_attention(q, k, v, log_decay=jnp.zeros((H + 1,)))
    with pytest.raises(ValueError, match="beta must have shape"):
        ops.gated_delta_rule(q, k, v, la, be[:, :, :1])
    with pytest.raises(ValueError, match="initial_state must be the pair"):
        ops.linear_attention(q, k, v, initial_state=jnp.zeros((B, H, F, DV)))
    with pytest.raises(ValueError, match="initial_state must have shape"):
        ops.gated_delta_rule(q, k, v, la, be, initial_state=jnp.zeros((B, H, DV, F)))
    with pytest.raises(ValueError, match="segment_ids must have shape"):
        ops.gated_delta_rule(q, k, v, la, be, segment_ids=np.ones((B, 4), int))
    with pytest.raises(ValueError, match="chunk_size"):
        ops.gated_delta_rule(q, k, v, la, be, chunk_size=0)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        ops.softmax_attention(jnp.zeros((1, 4, 3, 8)), jnp.zeros((1, 4, 2, 8)),
                              jnp.zeros((1, 4, 2, 8)))
    with pytest.raises(ValueError, match="window must be a positive int"):
        ops.sliding_window_attention(q, k, k, window=0)


# ----------------------------------------------------------------------------- softmax attention

def _attn_inputs(t, hq=4, hkv=2, d=8, seed=0, s=None):
    rng = np.random.default_rng(seed)
    s = t if s is None else s
    return (rng.normal(size=(B, t, hq, d)), rng.normal(size=(B, s, hkv, d)),
            rng.normal(size=(B, s, hkv, d)))


f32 = lambda a: jnp.asarray(a, jnp.float32)
# jitted once per shape/static config: far cheaper on CPU than running each op eagerly
_window = jax.jit(ops.sliding_window_attention, static_argnames=("window", "impl"))
_softmax = jax.jit(ops.softmax_attention, static_argnames=("causal", "scale", "window"))


@pytest.mark.parametrize("t,window", [(1, 4), (37, 1), (37, 4), (37, 16), (37, 64)])
@pytest.mark.parametrize("segs", [False, True])
def test_sliding_window_vs_reference(t, window, segs):
    q, k, v = _attn_inputs(t, seed=t + window)
    seg = segments(t) if segs else None
    want = ref.softmax_attention(q, k, v, segment_ids=seg, window=window)
    for impl in ("blocked", "masked"):
        got = _window(f32(q), f32(k), f32(v), window=window, segment_ids=seg, impl=impl)
        assert_close(got, want, f"sliding window {impl} w={window}")
    got = _softmax(f32(q), f32(k), f32(v), window=window, segment_ids=seg)
    assert_close(got, want, f"softmax_attention window={window}")


@pytest.mark.parametrize("hq,hkv", [(2, 2), (4, 2), (4, 1)])
@pytest.mark.parametrize("segs", [False, True])
def test_softmax_attention_causal_gqa_vs_reference(hq, hkv, segs):
    t = 37
    q, k, v = _attn_inputs(t, hq, hkv, seed=hq * 10 + hkv)
    seg = segments(t) if segs else None
    for scale in (None, 0.3):
        want = ref.softmax_attention(q, k, v, segment_ids=seg, scale=scale)
        got = _softmax(f32(q), f32(k), f32(v), segment_ids=seg, scale=scale)
        assert_close(got, want, f"softmax hq={hq} hkv={hkv} scale={scale}")


@pytest.mark.parametrize("window,segs", [(None, False), (None, True), (5, True)])
def test_softmax_attention_dropout_vs_reference_with_the_same_mask(window, segs):
    t, hq, hkv, rate = 19, 4, 2, 0.3
    q, k, v = _attn_inputs(t, hq, hkv, seed=21)
    seg = segments(t) if segs else None
    key = jax.random.key(7)
    got = ops.softmax_attention(f32(q), f32(k), f32(v), segment_ids=seg, window=window,
                                dropout_rate=rate, dropout_rng=key)
    # The kernel draws one keep-mask over (B, Hkv, group, T, S); the float64 reference
    # applies that same mask to its own probabilities.
    keep = np.asarray(jax.random.bernoulli(key, 1.0 - rate, (B, hkv, hq // hkv, t, t)))
    assert 0.6 < keep.mean() < 0.8
    want = ref.softmax_attention(q, k, v, segment_ids=seg, window=window, keep=keep, rate=rate)
    assert_close(got, want, f"attention dropout window={window} segs={segs}")
    plain = ops.softmax_attention(f32(q), f32(k), f32(v), segment_ids=seg, window=window)
    assert rel(got, plain) > 0.05  # the mask did something
    with pytest.raises(ValueError, match="dropout_rng"):
        ops.softmax_attention(f32(q), f32(k), f32(v), dropout_rate=rate)


def test_softmax_attention_non_causal_cross_lengths():
    q, k, v = _attn_inputs(5, seed=8, s=11)
    want = ref.softmax_attention(q, k, v, causal=False)
    got = ops.softmax_attention(f32(q), f32(k), f32(v), causal=False)
    assert_close(got, want, "non-causal softmax")


def test_attend_to_cache_matches_causal_attention_rows():
    t, max_len = 13, 20
    q, k, v = _attn_inputs(t, 4, 2, seed=12)
    full = ref.softmax_attention(q, k, v)
    k_cache = np.zeros((B, max_len, 2, 8))
    v_cache = np.zeros((B, max_len, 2, 8))
    k_cache[:, :t], v_cache[:, :t] = k, v
    for pos in (0, 6, t - 1):
        lengths = jnp.full((B,), pos + 1)
        got = ops.attend_to_cache(f32(q[:, pos]), f32(k_cache), f32(v_cache), lengths)
        assert_close(got, full[:, pos], f"attend_to_cache pos={pos}")
    # a ring buffer of the last `w` keys, stored out of order, gives the windowed row
    w, pos = 4, 9
    slots = [(pos - j) % w for j in range(w)]
    kb, vb = np.zeros((B, w, 2, 8)), np.zeros((B, w, 2, 8))
    for j, slot in enumerate(slots):
        kb[:, slot], vb[:, slot] = k[:, pos - j], v[:, pos - j]
    mask = ops.ring_buffer_mask(jnp.full((B,), pos + 1), w)
    got = ops.attend_to_cache(f32(q[:, pos]), f32(kb), f32(vb), mask)
    want = ref.softmax_attention(q, k, v, window=w)[:, pos]
    assert_close(got, want, "ring buffer")
    # only two writes so far: two valid slots
    assert np.asarray(ops.ring_buffer_mask(jnp.full((B,), 2), w)).sum(-1).tolist() == [2, 2]



@pytest.mark.parametrize("window", [None, 3])
def test_cudnn_attention_traces_vmapped_and_differentiated_with_every_head(monkeypatch,
                                                                          window):
    """A population's step (vmap of value_and_grad of a jitted loss) through cuDNN
    attention with packed documents: traced on the CPU with cuDNN's platform checks off
    (its kernels run only on a GPU), the step's jaxpr forms with mask_every_head=True;
    with the shared-head mask cuDNN's batching rules (jax <= 0.11.2) fail."""
    fused = pytest.importorskip("jax._src.cudnn.fused_attention_stablehlo")
    from kernels import attention
    monkeypatch.setattr(fused, "check_cudnn_version", lambda *a: None)
    monkeypatch.setattr(fused, "check_compute_capability", lambda *a: None)
    monkeypatch.setattr(attention, "_cudnn_applies", lambda q: True)
    members, b, t, h, d = 3, 2, 16, 4, 16
    q = jnp.ones((members, b, t, h, d), jnp.bfloat16)
    seg = jnp.broadcast_to(jnp.arange(t) // 5, (members, b, t))

    def step(every_head):
        @jax.jit
        def loss(q, seg):
            if window is None:
                o = attention.softmax_attention(q, q, q, segment_ids=seg, impl="cudnn",
                                                mask_every_head=every_head)
            else:
                o = attention.sliding_window_attention(q, q, q, window=window,
                                                       segment_ids=seg, impl="cudnn",
                                                       mask_every_head=every_head)
            return jnp.sum(o.astype(jnp.float32) ** 2)  # a cotangent per member
        return jax.vmap(jax.value_and_grad(loss))

    jaxpr = jax.make_jaxpr(step(True))(q, seg)
    assert "dot_product_attention" in str(jaxpr)
    try:
        jax.make_jaxpr(step(False))(q, seg)
    except TypeError as e:  # the batching rules' reshape of a shared-head mask
        assert "reshape" in str(e)



def _runs_numpy(row):
    """(starts, lengths) of the runs of equal ids in one row, by a Python loop."""
    starts = [0] + [i for i in range(1, len(row)) if row[i] != row[i - 1]]
    return starts, [e - s for s, e in zip(starts, starts[1:] + [len(row)])]


@pytest.mark.parametrize("max_segments", [1, 3, 6, 40])
def test_packed_layout_lists_each_rows_runs(max_segments):
    """kernels.attention.packed_layout against a Python loop over random rows (runs of
    1-9 tokens, an id that comes back after another run is a new run): each row's first
    max_segments runs' offsets and lengths, -1 after its last, and its count of runs."""
    from kernels.attention import packed_layout
    rng = np.random.default_rng(max_segments)
    rows = []
    for _ in range(5):
        ids = np.repeat(rng.integers(0, 3, 30), rng.integers(1, 10, 30))[:33]
        rows.append(np.pad(ids, (0, 33 - len(ids)), mode="edge"))
    seg = np.stack(rows)
    lengths, offsets, runs = (np.asarray(x) for x in packed_layout(seg, max_segments))
    assert lengths.shape == (5, max_segments) and offsets.shape == (5, max_segments + 1)
    for row, n, ln, off in zip(seg, runs, lengths, offsets):
        starts, lens = _runs_numpy(list(row))
        assert n == len(starts)
        kept = min(len(starts), max_segments)
        assert off[:kept].tolist() == starts[:kept] and (off[kept:] == -1).all()
        if len(starts) <= max_segments:  # a row that fits is described whole
            assert ln[:kept].tolist() == lens and (ln[kept:] == -1).all()


def test_packed_layout_is_the_attention_of_the_mask():
    """Causal attention inside each (offset, length) of packed_layout, computed sequence by
    sequence in float64, equals the masked reference (tokens see earlier tokens of their
    own segment id) on rows whose ids do not repeat: the layout handed to cuDNN describes
    the attention the mask path computes."""
    from kernels.attention import packed_layout
    rng = np.random.default_rng(0)
    b, t, h, d = 2, 24, 2, 4
    q, k, v = (rng.standard_normal((b, t, h, d)) for _ in range(3))
    seg = np.stack([np.repeat(np.arange(5), [3, 7, 1, 9, 4]),
                    np.repeat(np.arange(2), [20, 4])])
    lengths, offsets, _ = (np.asarray(x) for x in packed_layout(seg, 8))
    got = np.zeros((b, t, h, d))
    for bi in range(b):
        for start, n in zip(offsets[bi], lengths[bi]):
            if n < 0:
                break
            sl = slice(start, start + n)
            got[bi:bi + 1, sl] = ref.softmax_attention(q[bi:bi + 1, sl], k[bi:bi + 1, sl],
                                                       v[bi:bi + 1, sl])
    want = ref.softmax_attention(q, k, v, segment_ids=seg)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_packed_cudnn_attention_traces_with_its_mask_fallback(monkeypatch):
    """max_segments > 0 on the cuDNN path: value_and_grad of a jitted loss traces (cuDNN's
    platform checks off, its kernels run only on a GPU) with jax's packed-sequence call
    (check_layout accepts the (B, M) lengths and (B, M + 1) offsets) and the mask path
    beside it under one lax.cond; grouped-query heads and max_segments 0 keep the mask
    path alone. The GPU check of its values: docs/measurements/session36/packed_check.py."""
    fused = pytest.importorskip("jax._src.cudnn.fused_attention_stablehlo")
    from kernels import attention
    monkeypatch.setattr(fused, "check_cudnn_version", lambda *a: None)
    monkeypatch.setattr(fused, "check_compute_capability", lambda *a: True)  # Hopper
    monkeypatch.setattr(attention, "_cudnn_applies", lambda q: True)
    b, t, h, d = 2, 32, 4, 16
    q = jnp.ones((b, t, h, d), jnp.bfloat16)
    seg = jnp.broadcast_to(jnp.arange(t) // 5, (b, t))

    def jaxpr(kv_heads, max_segments):
        kv = q[:, :, :kv_heads]

        @jax.jit
        def loss(q, kv):
            o = attention.softmax_attention(q, kv, kv, segment_ids=seg, impl="auto",
                                            max_segments=max_segments)
            return jnp.sum(o.astype(jnp.float32) ** 2)
        return str(jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1)))(q, kv))

    packed = jaxpr(h, 8)
    assert "cond" in packed and "dot_product_attention" in packed
    for other in (jaxpr(h, 0), jaxpr(2, 8)):
        assert "cond" not in other and "dot_product_attention" in other
