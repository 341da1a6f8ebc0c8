"""Issue 17's convolutions: the short conv (cfg.short_conv) against a float64 transcription
of fla's ShortConvolution, Zoology's BaseConv against a float64 transcription of
zoology/mixers/base_conv.py, and every mixer that takes short_conv with it on: its three
forms (cfg.impl parallel / recurrent / chunk) and decode (prefill + steps) agree, and
packed documents do not see each other through the conv."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import get_mixer
from models.layers import ShortConv, _causal_conv
from tests.models import reference
from tests.models.helpers import close, tiny_config

B, T, SPLIT = 2, 20, 12


def np_causal_conv1d(x, weight, bias=None):
    """torch.nn.Conv1d(C, C, K, groups=C, padding=K-1)(x.transpose(1, 2))[..., :T]
    .transpose(1, 2), as fla's ShortConvolution and Zoology's ShortConvolution call it:
    x (B, T, C), weight (C, 1, K) torch's layout, bias (C,). Cross-correlation over the
    zero-padded input, first T outputs kept."""
    b, t, c = x.shape
    k = weight.shape[-1]
    xp = np.concatenate([np.zeros((b, k - 1, c)), x, np.zeros((b, k - 1, c))], axis=1)
    out = np.zeros((b, t + k - 1, c))
    for s in range(t + k - 1):
        for j in range(k):
            out[:, s] += weight[:, 0, j] * xp[:, s + j]
    if bias is not None:
        out = out + bias
    return out[:, :t]


def torch_weight(conv):
    """Our (K, C) kernel in torch's (C, 1, K) Conv1d layout."""
    return np.asarray(conv.kernel[...], np.float64).T[:, None, :]


def x_of(shape, seed=1):
    return jax.random.normal(jax.random.key(seed), shape)


def _conv_outputs(conv, x, seg):
    """The conv's full call, packed call and prefill + per-token decode, in one program."""
    y, state = conv(x)
    packed, _ = conv(x, segment_ids=seg)
    y0, s = conv(x[:, :SPLIT])
    ys = [y0]
    for t in range(SPLIT, T):
        y_t, s = conv(x[:, t:t + 1], state=s)
        ys.append(y_t)
    return y, state, packed, jnp.concatenate(ys, axis=1)


def test_short_conv_is_fla_short_convolution():
    """fla's ShortConvolution(activation='silu', bias=False): silu(causal conv(x)); with
    the packed rows of cu_seqlens each document convolved alone; and decode from the
    state equals the full conv."""
    cfg = tiny_config(conv_size=4)
    conv = ShortConv(cfg, 6, rngs=nnx.Rngs(0))
    x = x_of((B, T, 6))
    cuts = [7, 12]  # packed: documents of 7 + 13 (row 0) and 12 + 8 (row 1) tokens
    seg = jnp.array([[1] * c + [2] * (T - c) for c in cuts], jnp.int32)
    y, state, packed, decoded = run_fast(_conv_outputs, conv, x, seg)
    ref = reference.silu(np_causal_conv1d(np.asarray(x, np.float64), torch_weight(conv)))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state, x[:, -3:])  # the last conv_size - 1 inputs
    for i, c in enumerate(cuts):
        for lo, hi in ((0, c), (c, T)):
            alone = reference.silu(np_causal_conv1d(np.asarray(x[i:i + 1, lo:hi], np.float64),
                                                    torch_weight(conv)))
            np.testing.assert_allclose(packed[i:i + 1, lo:hi], alone, rtol=1e-5, atol=1e-6)
    close(y, decoded, tol=1e-6)


def np_base_conv(m, u):
    """zoology/mixers/base_conv.py BaseConv.forward with its defaults (use_act=False):
    u_conv = self.conv(u); u_proj = self.projection(u); return u_conv * u_proj + u."""
    u = np.asarray(u, np.float64)
    u_conv = np_causal_conv1d(u, torch_weight(m.conv), reference.p(m.conv.bias))
    u_proj = u @ reference.p(m.projection.kernel) + reference.p(m.projection.bias)
    return u_conv * u_proj + u


def _move_off_init(module, seed=7):
    """Nonzero biases (they initialise to 0 in nnx.Linear), so the test sees them used."""
    for i, (_, var) in enumerate(nnx.to_flat_state(nnx.state(module, nnx.Param))):
        var[...] = var[...] + 0.3 * jax.random.normal(jax.random.key(seed + i),
                                                      var[...].shape)
    return module


def np_gated_conv(m, u):
    """based/models/mixers/convolution.py BaseConv.forward (use_cuda=False):
    u = self.in_proj(u); u1, u2 = torch.split(u, self.d_inner, dim=-1);
    u_conv = silu(self.conv(u1)); return self.out_proj(u_conv * u2)."""
    u = np.asarray(u, np.float64) @ reference.p(m.in_proj.kernel) + reference.p(m.in_proj.bias)
    u1, u2 = u[..., :m.d_inner], u[..., m.d_inner:]
    u_conv = reference.silu(np_causal_conv1d(u1, torch_weight(m.conv)))  # conv_bias=False
    return (u_conv * u2) @ reference.p(m.out_proj.kernel) + reference.p(m.out_proj.bias)


@pytest.mark.parametrize("name, ref", [("base_conv", np_base_conv),
                                       ("gated_conv", np_gated_conv)])
def test_conv_mixers_match_their_reference(name, ref):
    """Zoology's BaseConv (base_conv) and the Based LM's BaseConv (gated_conv): the layer
    against its float64 transcription, decode (prefill + steps) against the full call, and
    a packed row's second document against that document alone."""
    cfg = tiny_config()
    m = _move_off_init(get_mixer(name)(cfg, rngs=nnx.Rngs(0)))
    assert m.conv.size == 3 and (m.conv.bias is not None) == (name == "base_conv")
    x = x_of((B, T, cfg.d_model), seed=4)
    seg = jnp.array([[1] * 7 + [2] * (T - 7)] * B, jnp.int32)
    full, decoded, packed = run_fast(_mixer_outputs, m, x, seg)
    np.testing.assert_allclose(full, ref(m, x), rtol=2e-5, atol=2e-5)
    close(full, decoded)
    np.testing.assert_allclose(packed[:, 7:], ref(m, x[:, 7:]), rtol=2e-5, atol=2e-5)


def _decode(m, x):
    """Prefill SPLIT tokens, then one step per token: the outputs, (B, T, d_model)."""
    y0, state = m.prefill(x[:, :SPLIT], m.init_state(x.shape[0]))

    def body(c, x_t):
        y, c = m.step(x_t, c)
        return c, y
    _, y1 = jax.lax.scan(body, state, jnp.swapaxes(x[:, SPLIT:], 0, 1))
    return jnp.concatenate([y0, jnp.swapaxes(y1, 0, 1)], axis=1)


def _mixer_outputs(m, x, seg):
    return m(x), _decode(m, x), m(x, segment_ids=seg)


def test_conv_mixers_init_as_their_references():
    """N(0, 0.02) linears with zero bias (Zoology's and Based's _init_weights), Based's
    out_proj at 0.02 / sqrt(2 n_layers); the conv at torch's U(+-1/sqrt(k))."""
    cfg = tiny_config(d_model=128, num_layers=8)
    base = get_mixer("base_conv")(cfg, rngs=nnx.Rngs(0))
    gated = get_mixer("gated_conv")(cfg, rngs=nnx.Rngs(0))
    for w, std in ((base.projection.kernel, 0.02), (gated.in_proj.kernel, 0.02),
                   (gated.out_proj.kernel, 0.02 / 4)):
        assert abs(float(jnp.std(w[...])) / std - 1) < 0.05
    assert not float(jnp.abs(base.projection.bias[...]).max())
    assert float(jnp.abs(base.conv.kernel[...]).max()) <= 3 ** -0.5


def _build(name, **overrides):
    cfg = tiny_config(short_conv=True, **overrides)
    return cfg, get_mixer(name)(cfg, rngs=nnx.Rngs(0))


CUTS = (7, 12)  # row 0 packs documents of 7 + 13 tokens, row 1 of 12 + 8


def run_fast(fn, modules, *args):
    """fn(modules, *args) jitted with XLA's backend optimisation off: the same float32
    arithmetic (no fast-math either way), compiled in half the time, which is most of
    these tests' time on a CPU."""
    graphdef, state = nnx.split(modules)

    def pure(state, *args):
        return fn(nnx.merge(graphdef, state), *args)
    lowered = jax.jit(pure).lower(state, *args)
    return lowered.compile({"xla_backend_optimization_level": 0})(state, *args)


def _every_form(modules, x, seg, alone_x):
    """One traced program (one compile) with every output the test compares: the full
    call in each impl, prefill + per-token steps, the packed rows, the documents alone."""
    chunk = modules["chunk"]
    out = {impl: m(x) for impl, m in modules.items()}
    out["decode"] = _decode(chunk, x)
    out["packed"] = chunk(x, segment_ids=seg)
    out["alone"] = chunk(alone_x)
    return out


@pytest.mark.parametrize("name", ["linear", "hedgehog", "performer", "lightning", "based"])
def test_short_conv_forms_decode_and_packing_agree(name):
    cfg, module = _build(name)
    convs = [p for p, _ in nnx.to_flat_state(nnx.state(module, nnx.Param))
             if any("conv" in str(k) for k in p)]
    assert convs, f"{name}: short_conv=True built no conv"
    state = module.init_state(B)
    assert "conv" in (state["linear"] if name == "based" else state)
    # The three forms of the op on the same parameters (impl is a config field).
    modules = {}
    for impl in ("parallel", "recurrent", "chunk"):
        _, m = _build(name, impl=impl)
        nnx.update(m, nnx.state(module))
        modules[impl] = m
    x = x_of((B, T, cfg.d_model))
    seg = jnp.array([[1] * c + [2] * (T - c) for c in CUTS], jnp.int32)
    alone_x = jnp.stack([jnp.concatenate([x[i, c:], jnp.zeros_like(x[i, :c])])
                         for i, c in enumerate(CUTS)])
    out = run_fast(_every_form, modules, x, seg, alone_x)
    full = out["chunk"]
    close(out["parallel"], out["recurrent"])
    close(out["parallel"], full)
    # Decode: prefill, then a step per token, carrying the op's state and the conv's.
    close(full, out["decode"])
    # Packed documents equal the documents alone: nothing leaks through the conv's taps.
    for i, c in enumerate(CUTS):
        close(full[i, :c], out["packed"][i, :c])
        close(out["alone"][i, :T - c], out["packed"][i, c:])


def test_short_conv_linear_layer_matches_float64_reference():
    """The whole `linear` layer with short_conv: q, k, v = silu(conv(x W)) (fla's order:
    conv before the feature map), then elu+1 normalised linear attention."""
    cfg, module = _build("linear")
    x = x_of((B, T, cfg.d_model), seed=4)
    h = cfg.num_heads

    def conv_silu(a, conv):
        return reference.silu(np_causal_conv1d(a, torch_weight(conv)))

    xs = np.asarray(x, np.float64)
    q = conv_silu(xs @ reference.p(module.q_proj.kernel), module.q_conv)
    k = conv_silu(xs @ reference.p(module.k_proj.kernel), module.k_conv)
    v = conv_silu(xs @ reference.p(module.v_proj.kernel), module.v_conv)
    out = []
    for qb, kb, vb in zip(q, k, v):
        qf, kf = reference._elu1(reference.heads(qb, h)), reference._elu1(reference.heads(kb, h))
        vh = reference.heads(vb, h)
        S, z, rows = 0, 0, []
        for t in range(T):
            S = S + np.einsum("hf,hd->hfd", kf[t], vh[t])
            z = z + kf[t]
            num = np.einsum("hf,hfd->hd", qf[t], S)
            rows.append((num / (np.einsum("hf,hf->h", qf[t], z)[:, None] + 1e-6)).reshape(-1))
        out.append(np.stack(rows) @ reference.p(module.o_proj.kernel))
    np.testing.assert_allclose(run_fast(lambda m, x: m(x), module, x), np.stack(out),
                               rtol=2e-4, atol=2e-5)


def test_flops_count_the_convs_through_their_weights():
    """A depthwise conv tap is one multiply-add per token and channel, i.e. 2 FLOPs per
    weight: models.flops counts it through the parameter count; BaseConv's layer costs its
    weights and nothing more."""
    from models import LanguageModel, ModelConfig
    small = dict(vocab_size=50, d_model=32, num_heads=2, num_layers=2, mixer="linear")
    def build(**kw):  # shapes only: FLOPs need the parameter count, not the values
        return nnx.eval_shape(lambda: LanguageModel(ModelConfig(**small, **kw),
                                                    rngs=nnx.Rngs(0)))
    off, on = build(), build(short_conv=True)
    conv_weights = 2 * 3 * 4 * 32  # layers x (q, k, v) x conv_size taps x channels
    assert on.flops_per_token(64) - off.flops_per_token(64) == 2 * conv_weights
    hybrid = build(layer_pattern="base_conv,linear")
    n = sum(p.size for p in jax.tree.leaves(nnx.state(hybrid, nnx.Param)))
    linear_mixing = get_mixer("linear").flops_per_token(hybrid.cfg, 64)
    assert hybrid.flops_per_token(64) == 2 * n + linear_mixing


def test_bfloat16_short_conv_rounds_once():
    """bfloat16 inputs: the taps are summed and the SiLU taken in float32 and rounded to
    bfloat16 once (as fla's causal_conv1d), so every output is the float64 result of the
    same bfloat16 inputs and float32 weights rounded to the nearest bfloat16, within one unit of
    rounding of the float32 arithmetic."""
    cfg = tiny_config(conv_size=4)
    conv = ShortConv(cfg, 64, rngs=nnx.Rngs(0))
    x = x_of((B, 256, 64)).astype(jnp.bfloat16)
    y, _ = conv(x)
    assert y.dtype == jnp.bfloat16
    ref = reference.silu(np_causal_conv1d(np.asarray(x, np.float64), torch_weight(conv)))
    got = np.asarray(y, np.float64)
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(ref), 1e-30))) - 7)  # bf16 spacing
    assert np.all(np.abs(got - ref) <= 0.5 * ulp * 1.01 + 1e-30)


@pytest.mark.parametrize("bias, activation, size", [(False, True, 4), (True, False, 4),
                                                   (False, True, 2), (True, True, 1)])
def test_short_conv_gradients_match_float64_autodiff(bias, activation, size):
    """The conv's hand-written backward (models.layers._conv_taps_bwd) against float64
    autodiff of the taps written out: gradients of x, the carried-in state, the kernel and
    the bias, with packed documents (segment ids) and without, for 4, 2 and 1 taps."""
    cfg = tiny_config(conv_size=size)
    conv = ShortConv(cfg, 6, rngs=nnx.Rngs(0), bias=bias, activation=activation)
    x, state, cot = x_of((B, T, 6), 1), x_of((B, size - 1, 6), 2), x_of((B, T, 6), 3)
    seg = jnp.asarray(np.repeat([[0, 1, 1, 2]], B, 0).repeat(T // 4, 1))
    kernel = conv.kernel[...]
    b = conv.bias[...] if bias else jnp.zeros((6,))

    def ours(x, state, kernel, b, seg):  # ShortConv.__call__'s function
        y, _ = _causal_conv(x, seg, None if seg is not None else state, kernel,
                            b if bias else None, activation)
        return jnp.sum(y * cot)

    def plain(x, state, kernel, b, seg):  # float64, no custom rule
        xp = jnp.concatenate([state if seg is None else jnp.zeros_like(state), x], axis=1)
        segp = None if seg is None else jnp.concatenate(
            [jnp.full((B, size - 1), -1, seg.dtype), seg], axis=1)
        y = b if bias else 0.0
        for i in range(size):
            tap = xp[:, i:i + T]
            if segp is not None:
                tap = jnp.where((segp[:, i:i + T] == segp[:, size - 1:])[..., None], tap, 0)
            y = y + tap * kernel[i]
        y = y * jax.nn.sigmoid(y) if activation else y
        return jnp.sum(y * cot)

    for packed in (None, seg):
        got = jax.grad(ours, argnums=(0, 1, 2, 3))(x, state, kernel, b, packed)
        with jax.enable_x64():
            f64 = [jnp.asarray(np.asarray(a), jnp.float64) for a in (x, state, kernel, b)]
            want = jax.grad(plain, argnums=(0, 1, 2, 3))(*f64, packed)
            want = [np.asarray(w) for w in want]
        names = ("x", "state", "kernel", "bias")
        for name, g, w in zip(names, got, want):
            if name == "bias" and not bias:
                continue
            if name == "state" and packed is not None:
                continue
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5,
                                       err_msg=f"{name}, packed={packed is not None}")
