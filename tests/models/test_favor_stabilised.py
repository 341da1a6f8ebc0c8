"""FAVOR+ with the causal running-max stabiliser (models.mixers.linear.Performer) and
Hedgehog's two maps and exp form, against float64 references written here: a NumPy
transcription of google-research's performer/fast_attention/jax/fast_attention.py
(nonnegative_softmax_kernel_feature_creator, _numerator, _denominator and the
renormalisation of FastAttentionviaLowRankDecomposition), and direct sums over keys.
"""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import LanguageModel
from models import feature_maps as fm
from models.mixers import get_mixer
from tests.models.helpers import tiny_config
from training import model_state, optim


def _performer(head_dim, m=32, **overrides):
    cfg = tiny_config(mixer="performer", d_model=head_dim, num_heads=1, head_dim=head_dim,
                      num_random_features=m, chunk_size=4, **overrides)
    return get_mixer("performer")(cfg, rngs=nnx.Rngs(0))


_JITTED = {}


def _op(layer, q, k, v, *, impl="chunk", omega=None, segment_ids=None):
    """The layer's own op on pre-projected q, k, v (B, T, H, D), jitted once per layer
    and form (eager dispatch of the chunk form's many small ops would cost the time)."""
    key = (id(layer), impl)
    if key not in _JITTED:
        def run(q, k, v, omega, segment_ids):
            inputs = {"q": q, "k": k, "v": v}
            if omega is not None:
                inputs["omega"] = omega
            return layer._op(inputs, segment_ids=segment_ids, initial_state=None,
                             return_state=False, impl=impl)
        _JITTED[key] = (layer, jax.jit(run))  # the layer kept alive: its id stays unique
    return _JITTED[key][1](q, k, v, omega, segment_ids)


def _op_state(layer, q, k, v, state, impl):
    """(o, state) of the layer's op from `state` (decode, chunked prefill), jitted."""
    def run(q, k, v, state):
        return layer._op({"q": q, "k": k, "v": v}, segment_ids=None, initial_state=state,
                         return_state=True, impl=impl)
    return jax.jit(run)(q, k, v, state)


def _qkv(seed, shape, std):
    ks = jax.random.split(jax.random.key(seed), 3)
    return tuple(std * jax.random.normal(k, shape) for k in ks)


# --- no overflow, no dependence on the future ------------------------------------------

@pytest.mark.parametrize("head_dim", [32, 64, 128, 256])
def test_finite_outputs_and_gradients_at_any_scale(head_dim):
    layer = _performer(head_dim)
    omega = layer.omega[...]
    # Row 0 of the batch at std 1, row 1 at std 10; one key of each row lies along the
    # longest omega row at the exponent's maximum |w|^2 / 2 (x' = w), the overflow case.
    q, k, v = _qkv(head_dim, (2, 8, 1, head_dim), 1.0)
    scale = jnp.asarray([1.0, 10.0])[:, None, None, None]
    q, k = q * scale, k * scale
    w_max = omega[jnp.argmax(jnp.sum(omega * omega, -1))]
    k = k.at[:, 3, 0].set(w_max * head_dim ** 0.25)
    w = jax.random.normal(jax.random.key(9), v.shape)

    @jax.jit
    def value_and_grads(q, k, v):
        loss = lambda q, k, v: jnp.sum(_op(layer, q, k, v, impl="parallel") * w)
        return _op(layer, q, k, v, impl="parallel"), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    o, grads = value_and_grads(q, k, v)
    assert bool(jnp.all(jnp.isfinite(o)))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
    # Unshifted, the same keys under- or overflow: every feature of the std-10 keys is 0
    # (exponents near -|x'|^2/2 = -50 sqrt(d)), and the aligned key's top feature is
    # exp(|w|^2 / 2), past float32's range from head dim 256 (|w|^2 ~ d).
    unshifted = jnp.exp(fm.favor_logits(k, omega, scale=head_dim ** -0.25))
    assert float(jnp.max(unshifted[1, :3])) == 0.0
    if head_dim >= 256:
        assert not bool(jnp.all(jnp.isfinite(unshifted[:, 3])))


def test_no_output_depends_on_a_later_token():
    layer = _performer(64)
    q, k, v = _qkv(1, (2, 12, 1, 64), 2.0)
    cut = 7
    # A future key far larger than any before it raises the running max from `cut` on.
    k2 = k.at[:, cut:].multiply(6.0).at[:, cut:].add(3.0)
    q2, v2 = q.at[:, cut:].multiply(-4.0), v.at[:, cut:].add(100.0)
    for impl in ("parallel", "recurrent", "chunk"):
        before = np.asarray(_op(layer, q, k, v, impl=impl))
        after = np.asarray(_op(layer, q2, k2, v2, impl=impl))
        np.testing.assert_array_equal(before[:, :cut], after[:, :cut], err_msg=impl)
        assert not np.allclose(before[:, cut:], after[:, cut:])


# --- exact: the same estimator as without the shift, in every form ---------------------

def _direct_float64(q, k, v, omega, eps, seg=None):
    """o_t = sum_s w_ts v_s / sum_s w_ts with w_ts = phi(q_t) . phi(k_s) for same-document
    s <= t, phi(x) = (exp(l - shift) + eps) / sqrt(m), queries shifted by their own max
    and key s by the prefix max c_s (then scaled by exp(c_s - c_t)), as a direct sum."""
    q, k, v, omega = (np.asarray(a, np.float64) for a in (q, k, v, omega))
    b, t, h, d = q.shape
    r = 1 / math.sqrt(len(omega))
    seg = np.zeros((b, t), int) if seg is None else np.asarray(seg)

    def logits(a):
        a = a * d ** -0.25
        return a @ omega.T - 0.5 * np.sum(a * a, -1, keepdims=True)
    lq, lk = logits(q), logits(k)
    out = np.zeros(v.shape)
    for bi in range(b):
        for ti in range(t):
            same = [s for s in range(ti + 1) if seg[bi, s] == seg[bi, ti]]
            c = np.maximum.accumulate(lk[bi, same].max(-1), axis=0)  # (S, H)
            fq = r * (np.exp(lq[bi, ti] - lq[bi, ti].max(-1, keepdims=True)) + eps)
            fk = r * (np.exp(lk[bi, same] - c[..., None]) + eps) * np.exp(c - c[-1])[..., None]
            wts = np.einsum("hf,shf->sh", fq, fk)
            out[bi, ti] = np.einsum("sh,shv->hv", wts, v[bi, same]) / wts.sum(0)[:, None]
    return out


def test_forms_decode_and_packed_documents_match_float64():
    layer = _performer(16, m=24)
    q, k, v = _qkv(3, (2, 11, 1, 16), 3.0)
    seg = jnp.asarray([[0] * 4 + [1] * 7, [0] * 9 + [1] * 2])
    ref = _direct_float64(q, k, v, layer.omega[...], layer.feature_eps, seg)
    for impl in ("parallel", "recurrent", "chunk"):
        got = _op(layer, q, k, v, impl=impl, segment_ids=seg)
        np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-4, err_msg=impl)
    # Decode and a split prefill through the layer's own state (S, z, c).
    ref = _direct_float64(q, k, v, layer.omega[...], layer.feature_eps)
    state = layer._op_state(2)
    step = jax.jit(lambda q, k, v, state: layer._op(
        {"q": q, "k": k, "v": v}, segment_ids=None, initial_state=state, return_state=True,
        impl="recurrent"))
    ys = []
    for t in range(11):
        y, state = step(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], state)
        ys.append(y)
    np.testing.assert_allclose(jnp.concatenate(ys, 1), ref, rtol=2e-4, atol=2e-4)
    y1, s1 = _op_state(layer, q[:, :5], k[:, :5], v[:, :5], layer._op_state(2), "chunk")
    y2, _ = _op_state(layer, q[:, 5:], k[:, 5:], v[:, 5:], s1, "chunk")
    np.testing.assert_allclose(jnp.concatenate([y1, y2], 1), ref, rtol=2e-4, atol=2e-4)


def test_unbiased_against_exp_qk_float64():
    """E over feature draws of the stabilised kernel times the shifts it removed
    (exp(max_f l_q) for the query, exp(c) for the key) is exp(q . k / sqrt(d))."""
    d, m, n = 8, 16, 3000
    rng = np.random.default_rng(5)
    q, k = rng.normal(size=d) * 0.6, rng.normal(size=d) * 0.6
    truth = math.exp(q @ k / math.sqrt(d))
    with jax.enable_x64(True):
        def estimate(key):
            omega = fm.gaussian_projection(key, m, d).astype(jnp.float64)
            lq = fm.favor_logits(jnp.asarray(q), omega, scale=d ** -0.25)
            lk = fm.favor_logits(jnp.asarray(k)[None, None, None], omega, scale=d ** -0.25)
            fq = fm.per_token_max_features(lq)
            fk, _, c = fm.running_max_features(lk, None, jnp.full((1, 1), -jnp.inf))
            return (fq @ fk[0, 0, 0]) / m * jnp.exp(jnp.max(lq) + c[0, 0])
        est = np.asarray(jax.jit(jax.vmap(estimate))(
            jax.random.split(jax.random.key(6), n)), np.float64)
    se = est.std(ddof=1) / math.sqrt(n)
    assert abs(est.mean() - truth) < 5 * se, (est.mean(), truth, se)


# --- google-research's causal FAVOR+, transcribed ---------------------------------------

def _google_features(data, omega, is_query, eps):
    """nonnegative_softmax_kernel_feature_creator for one (batch, head): data (L, d)."""
    normalizer = 1.0 / math.sqrt(math.sqrt(data.shape[-1]))
    ratio = 1.0 / math.sqrt(omega.shape[0])
    data_dash = (normalizer * data) @ omega.T
    diag = (np.sum(data ** 2, -1) / 2.0 * normalizer * normalizer)[:, None]
    if is_query:
        top = data_dash.max(-1, keepdims=True)
    else:  # over the attention (time) axis and the features: all keys
        top = data_dash.max()
    return ratio * (np.exp(data_dash - diag - top) + eps)


def _google_causal(qs, ks, vs, stabilizer):
    """_numerator and _denominator (lax.scan forward passes) and the renormalisation."""
    p = np.zeros((ks.shape[-1], vs.shape[-1]))
    z = np.zeros(ks.shape[-1])
    w, r = [], []
    for q, k, v in zip(qs, ks, vs):
        p = p + np.einsum("m,d->md", k, v)
        w.append(np.einsum("m,md->d", q, p))
        z = z + k
        r.append(np.einsum("m,m->", q, z))
    w, r = np.array(w), np.array(r)
    r = r + 2 * stabilizer * (np.abs(r) <= stabilizer)
    return w / r[:, None]


def test_matches_google_research_causal_favor_float64():
    """Exact with eps = 0: every shift, google-research's (queries by max_f omega . x',
    keys by one max over all tokens and features) and ours (the whole exponent's, per
    query and over each key's prefix), cancels. With eps > 0 the two differ by design:
    each adds eps relative to its own shift."""
    layer = _performer(16, m=24)
    eps = layer.feature_eps = 0.0
    q, k, v = (np.asarray(a, np.float64) for a in _qkv(7, (2, 9, 2, 16), 1.0))
    omega = np.asarray(layer.omega[...], np.float64)
    ref = np.zeros(v.shape)
    for b in range(2):
        for h in range(2):
            fq = _google_features(q[b, :, h], omega, True, eps)
            fk = _google_features(k[b, :, h], omega, False, eps)
            ref[b, :, h] = _google_causal(fq, fk, v[b, :, h], 1e-6)
    layer.num_heads = 2
    with jax.enable_x64(True):
        got = np.asarray(_op(layer, jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                             omega=jnp.asarray(omega)))
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12)


# --- redraw and q/k normalisation ------------------------------------------------------

def _lm(**overrides):
    cfg = tiny_config(mixer="performer", num_layers=1, num_random_features=16, **overrides)
    return LanguageModel(cfg, rngs=nnx.Rngs(0))


def test_redraw_is_a_function_of_seed_and_step():
    tokens = jax.random.randint(jax.random.key(0), (2, 10), 0, 256)

    @functools.partial(jax.jit, static_argnums=(0, 4))
    def forward(graphdef, params, rest, step, deterministic):
        key = jax.random.fold_in(jax.random.key(17), step)  # training's step key
        m = nnx.merge(graphdef, params, model_state.rekey(rest, key))
        return m(tokens, deterministic=deterministic)

    def run(model, step, deterministic=False):
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        return np.asarray(forward(graphdef, params, rest, step, deterministic))

    a = run(_lm(), 5)
    np.testing.assert_array_equal(a, run(_lm(), 5))  # a fresh (resumed) model, same step
    assert not np.allclose(a, run(_lm(), 6))         # another step, other features
    # Evaluation and decoding use the init draw, whatever the step: the fixed-feature
    # model's output.
    fixed = _lm(performer_redraw_every=0)
    np.testing.assert_array_equal(run(_lm(), 5, True), run(fixed, 9, True))
    np.testing.assert_array_equal(run(fixed, 5, False), run(fixed, 9, True))


def test_qk_norm_kernel_uses_the_learned_temperature():
    layer = _performer(16, m=24, performer_qk_norm=True)
    tau = math.exp(float(layer.log_temperature[...][0]))
    assert tau == pytest.approx(4.0)  # sqrt(d) at init
    q, k, v = _qkv(8, (1, 6, 1, 16), 5.0)
    unit = lambda a: a / jnp.sqrt(jnp.sum(a * a, -1, keepdims=True) + layer.cfg.norm_eps)
    # exp(tau q^.k^) is FAVOR+ at temperature 1 of sqrt(tau) q^, i.e. of
    # (sqrt(tau) d^(1/4)) q^ at the usual 1/sqrt(d).
    s = math.sqrt(tau) * 16 ** 0.25
    plain = _performer(16, m=24)
    np.testing.assert_allclose(_op(layer, q, k, v), _op(plain, s * unit(q), s * unit(k), v),
                               rtol=1e-5, atol=1e-6)
    names = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(layer, nnx.Param))}
    assert "log_temperature" in names


# --- Hedgehog ----------------------------------------------------------------------------

def _hedgehog(noise=0.4, **overrides):
    cfg = tiny_config(mixer="hedgehog", d_model=16, num_heads=2, head_dim=8, chunk_size=4,
                      **overrides)
    layer = get_mixer("hedgehog")(cfg, rngs=nnx.Rngs(0))
    for i, w in enumerate([layer.feature_map_q.kernel, layer.feature_map_k.kernel,
                           layer.feature_map_q.bias, layer.feature_map_k.bias]):
        w[...] = w[...] + noise * jax.random.normal(jax.random.key(20 + i), w[...].shape)
    return layer


def test_hedgehog_exp_form_separate_maps_float64():
    """The paper's [exp(a), exp(-a)] with a query map and a key map of their own: the
    three forms against a float64 sum in log space, and finite outputs and gradients at
    inputs where exp(a) alone overflows float32."""
    layer = _hedgehog(hedgehog_map="exp")
    x64 = lambda a: np.asarray(a, np.float64)

    def logf(fmap, a):
        z = np.einsum("thd,hde->the", x64(a), x64(fmap.kernel[...])) + x64(fmap.bias[...])
        return np.concatenate([z, -z], -1)

    def reference(q, k, v, fq, fk):
        lq, lk = logf(fq, q[0]), logf(fk, k[0])
        ref = np.zeros(v.shape[1:])
        for t in range(v.shape[1]):  # weights exp(lq_t + lk_s) summed in log space
            lw = np.logaddexp.reduce(lq[t][None] + lk[:t + 1], axis=-1)  # (s, H)
            w = np.exp(lw - lw.max(0))
            ref[t] = np.einsum("sh,shv->hv", w, x64(v[0, :t + 1])) / w.sum(0)[:, None]
        return ref

    q, k, v = _qkv(11, (1, 9, 2, 8), 3.0)
    ref = reference(q, k, v, layer.feature_map_q, layer.feature_map_k)
    for impl in ("parallel", "recurrent", "chunk"):
        np.testing.assert_allclose(_op(layer, q, k, v, impl=impl)[0], ref, rtol=1e-4,
                                   atol=1e-4, err_msg=impl)
    # The maps are separate: the same weights with q's and k's maps swapped differ.
    swap = reference(q, k, v, layer.feature_map_k, layer.feature_map_q)
    assert not np.allclose(swap, ref, atol=1e-2)
    # At std 40 the exponents pass 89 (exp overflows float32 unshifted).
    big = [40.0 * a for a in (q, k)]
    assert logf(layer.feature_map_k, big[1][0]).max() > 89
    o, grads = jax.jit(lambda q, k, v: (_op(layer, q, k, v), jax.grad(
        lambda q, k, v: jnp.sum(_op(layer, q, k, v)), argnums=(0, 1, 2))(q, k, v)))(*big, v)
    assert bool(jnp.all(jnp.isfinite(o)))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)


def test_weight_decay_mask_excludes_the_hedgehog_maps():
    cfg = tiny_config(mixer="hedgehog", num_layers=2)
    model = LanguageModel(cfg, rngs=nnx.Rngs(0))
    params = model_state.flat_params(nnx.split(model, nnx.Param, ...)[1])
    mask = optim.decay_mask(params)
    maps = [n for n in params if "feature_map_" in n]
    assert {n.split("/", n.count("/") - 1)[-1] for n in maps} == {
        "feature_map_q/kernel", "feature_map_q/bias", "feature_map_k/kernel",
        "feature_map_k/bias"}
    assert not any(mask[n] for n in maps)
    assert all(mask[n] for n in params if n.endswith(("q_proj/kernel", "o_proj/kernel")))


def test_old_performer_configs_keep_their_fixed_features():
    """A config.json from before redraw existed builds the fixed-feature Performer it
    trained (SAVED_DEFAULTS), while a new config redraws (google-research's default)."""
    from models.config import ModelConfig
    old = ModelConfig.from_dict({"mixer": "performer", "d_model": 32})
    assert old.performer_redraw_every == 0 and not old.performer_qk_norm
    assert ModelConfig(mixer="performer").performer_redraw_every == 1
    with pytest.raises(ValueError, match="performer_redraw_every"):
        ModelConfig(performer_redraw_every=-1)
    with pytest.raises(ValueError, match="hedgehog_map"):
        ModelConfig(hedgehog_map="relu")
