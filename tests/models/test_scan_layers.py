"""Scanned layers (ModelConfig.scan_layers): the stacked model equals the unrolled one.

The reference is the unrolled model of the same seed (a Python loop over blocks, the
path the rest of the suite checks against float64 references); the stacked parameters
are its own, mapped by models.layer_stack.convert_arrays. Forward, gradients, every
remat policy, dropout masks and decoding are compared; the converter's round trip must
be exact. Float32, tiny shapes (d_model 32, 2-4 layers)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import LanguageModel, layer_stack
from tests.models.helpers import close, tiny_config
from training import model_state

B, T = 2, 16


def tokens(cfg, seed=1):
    return jax.random.randint(jax.random.key(seed), (B, T), 0, cfg.vocab_size)


def _flat(model):
    return model_state.flat_params(nnx.state(model, nnx.Param))


def _loss_fn(model, deterministic=True):
    """(params flat dict, tokens[, key]) -> mean NLL, jitted; with deterministic=False,
    dropout keyed by `key` through training's own rekey (per (seed, step), as train.py)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    names = {model_state.path_name(p): p for p, _ in params.flat_state()}
    template = {model_state.path_name(p): v for p, v in params.flat_state()}

    @jax.jit
    def loss(flat, tok, key=None):
        state = nnx.State.from_flat_path(
            [(path, template[n].replace(flat[n])) for n, path in names.items()])
        r = model_state.rekey(rest, key) if key is not None else rest
        state, r = jax.tree.map(lambda x: x, (state, r))
        logits = nnx.merge(graphdef, state, r)(tok, deterministic=deterministic)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
            logits, tok[..., None], -1)[..., 0])
    return loss


def _pair(**kw):
    """(unrolled, scanned) models of one seed."""
    a = LanguageModel(tiny_config(scan_layers=False, **kw), rngs=nnx.Rngs(0))
    b = LanguageModel(tiny_config(scan_layers=True, **kw), rngs=nnx.Rngs(0))
    return a, b


CASES = {
    "softmax": dict(num_layers=2, mixer="softmax"),
    "gated_deltanet": dict(num_layers=2, mixer="gated_deltanet"),
    # softmax at layers 1 and 3: a group of (gated_deltanet, softmax) repeated twice
    "hybrid": dict(num_layers=4, mixer="gated_deltanet", softmax_every=2),
}


def test_group_period():
    assert layer_stack.group_period(["a"] * 6) == 1
    assert layer_stack.group_period(["l"] * 7 + ["s"]) == 8
    assert layer_stack.group_period((["l"] * 7 + ["s"]) * 3) == 8
    assert layer_stack.group_period(["l", "s", "l", "s"]) == 2
    assert layer_stack.group_period(["l", "l", "s"]) == 3
    assert layer_stack.scan_shape(["l"] * 7 + ["s"], True) is None  # one group: unrolled
    assert layer_stack.scan_shape((["l"] * 7 + ["s"]) * 3, True) == (8, 3)
    assert layer_stack.scan_shape(["l"] * 4, False) is None


# gated_deltanet alone is slow-marked: the hybrid case scans it too (beside softmax).
@pytest.mark.parametrize("case", ["hybrid", "softmax",
                                  pytest.param("gated_deltanet", marks=pytest.mark.slow)])
def test_scanned_forward_and_grads_equal_unrolled(case):
    kw = CASES[case]
    a, b = _pair(**kw)
    assert b.scan is not None and a.scan is None
    fa, fb = _flat(a), _flat(b)
    # The scanned model of one seed holds the unrolled model's values, stacked.
    converted = layer_stack.convert_arrays(fa, fb)
    assert set(converted) == set(fb)
    for name in fb:
        np.testing.assert_array_equal(converted[name], fb[name], err_msg=name)
    period, repeats = b.scan
    assert fb[f"scan_blocks/{period - 1}/mixer_norm/scale"].shape == (repeats, 32)
    tok = tokens(b.cfg)
    la, ga = jax.value_and_grad(_loss_fn(a))(fa, tok)
    lb, gb = jax.value_and_grad(_loss_fn(b))(fb, tok)
    np.testing.assert_allclose(la, lb, rtol=1e-6)
    gb_unrolled = layer_stack.convert_arrays(gb, fa)
    assert set(gb_unrolled) == set(ga)
    for name in ga:
        close(ga[name], gb_unrolled[name], tol=1e-5)


_REMAT = dict(num_layers=2, mixer="linear", impl="parallel")  # cheap to compile


@functools.cache
def _no_remat_reference():
    """(tokens, (loss, grads)) of the scanned model without remat, computed once."""
    ref = LanguageModel(tiny_config(**_REMAT), rngs=nnx.Rngs(0))
    flat, tok = _flat(ref), tokens(ref.cfg)
    return tok, jax.value_and_grad(_loss_fn(ref))(flat, tok)


# Scanned under every policy; the unrolled path (test_lm checks its "full") under one.
@pytest.mark.parametrize("policy,scan", [
    ("full", True), ("save_dots", True),
    pytest.param("save_all_dots", True, marks=pytest.mark.slow),
    pytest.param("save_dots", False, marks=pytest.mark.slow)])
def test_remat_policies_same_loss_and_grads(policy, scan):
    tok, (l0, g0) = _no_remat_reference()
    m = LanguageModel(tiny_config(remat_policy=policy, scan_layers=scan, **_REMAT),
                      rngs=nnx.Rngs(0))
    l1, g1 = jax.value_and_grad(_loss_fn(m))(_flat(m), tok)
    np.testing.assert_allclose(l0, l1, rtol=1e-6)
    g1 = layer_stack.convert_arrays(g1, g0)
    for name in g0:
        close(g0[name], g1[name], tol=1e-5)


def test_remat_true_means_full_and_policy_names_are_checked():
    assert tiny_config(remat=True).resolved_remat_policy == "full"
    assert tiny_config(remat=True, remat_policy="save_dots").resolved_remat_policy == \
        "save_dots"
    assert tiny_config().resolved_remat_policy == "none"
    with pytest.raises(ValueError, match="remat_policy.*choose one of"):
        tiny_config(remat_policy="dots")


def test_dropout_masks_do_not_depend_on_the_layout():
    """training's rekey gives repeat r of a stacked stream the unrolled layer's key: the
    same (seed, step) draws the same masks scanned or unrolled; another step others."""
    kw = dict(num_layers=2, mixer="softmax", dropout=0.3, attention_dropout=0.2)
    a, b = _pair(**kw)
    fa, fb, tok = _flat(a), _flat(b), tokens(a.cfg)
    key = jax.random.fold_in(jax.random.key(7), 3)
    loss_a, loss_b = _loss_fn(a, False), _loss_fn(b, False)
    la, lb = loss_a(fa, tok, key), loss_b(fb, tok, key)
    np.testing.assert_allclose(la, lb, rtol=1e-6)
    assert float(loss_b(fb, tok, key)) == float(lb)  # a pure function of the key
    other = loss_b(fb, tok, jax.random.fold_in(jax.random.key(7), 4))
    plain = loss_a(fa, tok)
    assert abs(float(other) - float(lb)) > 1e-4 and abs(float(plain) - float(lb)) > 1e-4


def test_scanned_decode_equals_unrolled():
    a, b = _pair(**CASES["hybrid"])
    tok = tokens(b.cfg)
    split = 12

    prefill = nnx.jit(lambda m, tok: m.prefill(tok, m.init_cache(B, T)))
    step = nnx.jit(lambda m, tok, cache: m.decode_step(tok, cache))

    def decode(model, tok):
        logits, cache = prefill(model, tok[:, :split])
        outs = [logits]
        for t in range(split, T):
            step_logits, cache = step(model, tok[:, t], cache)
            outs.append(step_logits[:, None])
        return jnp.concatenate(outs, axis=1), cache

    ya, ca = decode(a, tok)
    yb, cb = decode(b, tok)
    close(ya, yb, tol=1e-5)
    close(nnx.jit(lambda m, t: m(t))(b, tok), yb, tol=1e-4)  # decode == forward
    assert len(cb["layers"]) == b.cfg.num_layers  # cache format unchanged
    jax.tree.map(lambda x, y: close(x, y, tol=1e-5), ca, cb)
    assert a.state_size(30) == b.state_size(30)


def test_converter_round_trip_is_exact():
    a, b = _pair(**CASES["hybrid"])
    fa = {k: jax.random.normal(jax.random.key(i), v.shape)
          for i, (k, v) in enumerate(sorted(_flat(a).items()))}
    stacked = layer_stack.convert_arrays(fa, _flat(b))
    back = layer_stack.convert_arrays(stacked, fa)
    assert set(back) == set(fa)
    for k in fa:
        np.testing.assert_array_equal(back[k], fa[k])
    # layer i = r * period + j sits at index r of scan_blocks/j
    np.testing.assert_array_equal(stacked["scan_blocks/1/mixer_norm/scale"][1],
                                  fa["blocks/3/mixer_norm/scale"])
    shapes = layer_stack.convert_shapes({k: v.shape for k, v in fa.items()}, stacked)
    assert shapes == {k: v.shape for k, v in stacked.items()}
    # a deeper model's layers are missing, not silently read from the wrong repeat
    deeper = _pair(**{**CASES["hybrid"], "num_layers": 6})[0]
    short = layer_stack.convert_shapes({k: v.shape for k, v in stacked.items()},
                                       _flat(deeper))
    assert "blocks/5/mixer_norm/scale" not in short and "blocks/3/mixer_norm/scale" in short


def test_stacked_parameters_carry_the_layer_axis_and_keep_decay():
    from training import optim, sharding
    _, b = _pair(**CASES["hybrid"])
    logical = {model_state.path_name(p): model_state.logical_axes(v)
               for p, v in nnx.state(b, nnx.Param).flat_state()}
    flat = _flat(b)
    for name, axes in logical.items():
        assert len(axes) == flat[name].ndim, name
        assert (axes[0] == layer_stack.LAYER_AXIS) == name.startswith("scan_blocks/"), name
    assert sharding.LOGICAL_RULES[layer_stack.LAYER_AXIS] is None
    a, _ = _pair(**CASES["hybrid"])
    la = {model_state.path_name(p): model_state.logical_axes(v)
          for p, v in nnx.state(a, nnx.Param).flat_state()}
    mask_a = optim.decay_mask(_flat(a), la)
    mask_b = optim.decay_mask(flat, logical)
    # the same decision for every layer's parameter in both layouts
    assert layer_stack.convert(mask_a, flat, stack=lambda xs: xs[0],
                               take=lambda x, r: x) == mask_b
    assert mask_b["scan_blocks/0/mixer/q_proj/kernel"]
    assert not mask_b["scan_blocks/0/mixer_norm/scale"]
