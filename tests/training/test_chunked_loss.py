"""training.step.loss_sums forming the logits a piece of the time axis at a time.

Against the one-pass loss of the same model (float32, CPU): the three sums and the
gradient of every parameter agree, with pieces that do not divide the sequence (padded
positions) and a mask that drops tokens; a model without `hidden` (any callable model)
takes the one pass; and the compiled gradient's temporary memory shrinks, which is the
point of the pieces.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import LanguageModel, ModelConfig
from training import step as step_fns

VOCAB = 97


def _model(mixer="gated_deltanet", **extra):
    cfg = ModelConfig(vocab_size=VOCAB, d_model=32, num_layers=2, num_heads=2,
                      mixer=mixer, dtype="float32", max_len=64, **extra)
    return LanguageModel(cfg, rngs=nnx.Rngs(0))


def _batch(b=3, t=21, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, (b, t + 1))
    mask = (rng.random((b, t)) > 0.3).astype(np.float32)
    return {"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:]),
            "segment_ids": jnp.ones((b, t), jnp.int32), "mask": jnp.asarray(mask)}


def _sums_and_grads(model, batch, chunk_logits):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def total(p):
        s, n, c = step_fns.loss_sums(nnx.merge(graphdef, p, rest), batch, deterministic=True,
                                     chunk_logits=chunk_logits)
        return s, (n, c)
    (s, (n, c)), g = jax.jit(jax.value_and_grad(total, has_aux=True))(params)
    return (float(s), float(n), float(c)), g


@pytest.mark.parametrize("mixer,extra,chunk_logits", [
    ("gated_deltanet", {}, VOCAB * 3 * 4),
    ("softmax", {"tie_embeddings": False}, VOCAB * 3 * 8),
    ("gated_deltanet", {}, 1)])
def test_pieces_equal_one_pass(mixer, extra, chunk_logits):
    """Pieces of 4 and 8 positions (21 = 5 x 4 + 1 and 2 x 8 + 5: padded) and of one;
    tied and untied heads."""
    model, batch = _model(mixer, **extra), _batch()
    ref, g_ref = _sums_and_grads(model, batch, chunk_logits=10 ** 9)
    got, g_got = _sums_and_grads(model, batch, chunk_logits=chunk_logits)
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    flat_ref, flat_got = jax.tree.leaves(g_ref), jax.tree.leaves(g_got)
    assert len(flat_ref) == len(flat_got)
    for a, b in zip(flat_ref, flat_got):  # float32 sums in another order: 1e-5 of scale
        a, b = np.asarray(a), np.asarray(b)
        assert np.max(np.abs(b - a)) <= 1e-5 * np.max(np.abs(a)) + 1e-9


def test_the_sums_are_the_masked_cross_entropy():
    """Against float64 NumPy from the model's own logits."""
    model, batch = _model(), _batch(seed=1)
    logits = np.asarray(nnx.jit(lambda m, x: m(x))(model, batch["inputs"]), np.float64)
    targets, mask = np.asarray(batch["targets"]), np.asarray(batch["mask"], np.float64)
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    correct = (logits.argmax(-1) == targets).astype(np.float64)
    got = nnx.jit(lambda m, b: step_fns.loss_sums(m, b, deterministic=True,
                                                  chunk_logits=VOCAB * 3 * 5))(model, batch)
    np.testing.assert_allclose([float(x) for x in got],
                               [(nll * mask).sum(), mask.sum(), (correct * mask).sum()],
                               rtol=1e-5)


def test_a_model_without_hidden_takes_one_pass():
    model, batch = _model("softmax"), _batch()
    seen = []

    def plain(tokens, *, segment_ids=None, deterministic=True):
        seen.append(tokens.shape)
        return model(tokens, segment_ids=segment_ids, deterministic=deterministic)
    ref = step_fns.loss_sums(model, batch, deterministic=True, chunk_logits=10 ** 9)
    got = step_fns.loss_sums(plain, batch, deterministic=True, chunk_logits=1)
    assert seen == [batch["inputs"].shape]
    np.testing.assert_allclose([float(x) for x in got], [float(x) for x in ref], rtol=1e-6)


def test_pieces_take_less_temporary_memory():
    """The compiled gradient's temporaries at batch 64 x 64, vocabulary 4,096 (16.8 M
    float32 logits, 64 MiB a copy; the one pass keeps about two): pieces of 2 M logits
    need less than 40% of the one pass's."""
    cfg = ModelConfig(vocab_size=4096, d_model=32, num_layers=1, num_heads=2,
                      mixer="softmax", dtype="float32", max_len=64)
    model = LanguageModel(cfg, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    shape = (64, 64)
    batch = {"inputs": jnp.zeros(shape, jnp.int32), "targets": jnp.zeros(shape, jnp.int32),
             "segment_ids": jnp.ones(shape, jnp.int32), "mask": jnp.ones(shape)}

    def temp_bytes(chunk_logits):
        def total(p):
            return step_fns.loss_sums(nnx.merge(graphdef, p, rest), batch,
                                      deterministic=True, chunk_logits=chunk_logits)[0]
        compiled = jax.jit(jax.grad(total)).lower(params).compile()
        return compiled.memory_analysis().temp_size_in_bytes
    one_pass, pieces = temp_bytes(10 ** 9), temp_bytes(1 << 21)
    print(f"temporaries: one pass {one_pass / 2**20:.1f} MiB, pieces {pieces / 2**20:.1f} MiB")
    assert pieces < 0.4 * one_pass


def test_pieces_under_vmap_as_a_population_runs_them():
    """training.population vmaps the step over members: two members' sums in pieces under
    jax.vmap equal each member's one-pass sums."""
    batch = _batch()
    members = [nnx.split(_model(), nnx.Param, ...) for _ in range(2)]
    graphdef, _, rest = members[0]
    second = jax.tree.map(lambda a: a * 1.1, members[1][1])
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), members[0][1], second)

    def sums(p, chunk_logits):
        return jnp.stack(step_fns.loss_sums(nnx.merge(graphdef, p, rest), batch,
                                            deterministic=True, chunk_logits=chunk_logits))
    got = jax.jit(jax.vmap(lambda p: sums(p, VOCAB * 3 * 4)))(stacked)
    for i, p in enumerate((members[0][1], second)):
        np.testing.assert_allclose(np.asarray(got[i]), np.asarray(sums(p, 10 ** 9)),
                                   rtol=1e-6)
