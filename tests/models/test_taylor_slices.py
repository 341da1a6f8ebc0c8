"""taylor_symmetric built from slices equals the triu_indices gather it replaced, in values
and gradients, bit for bit (same products in the same order)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import feature_maps as fm


def gathered(x):
    """The former form: x[..., rows] * x[..., cols] * c over rows, cols = triu_indices."""
    d = x.shape[-1]
    rows, cols = np.triu_indices(d)
    coef = np.where(rows == cols, 1.0 / math.sqrt(2.0), 1.0)
    pairs = x[..., rows] * x[..., cols] * jnp.asarray(coef, x.dtype)
    return jnp.concatenate([jnp.ones((*x.shape[:-1], 1), x.dtype), x, pairs], axis=-1)


# the gradient every platform lowers (written out), and autodiff of the slices
FORMS = {"as_called": fm.taylor_symmetric, "autodiff": fm._taylor_symmetric_forward}


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("d", [1, 3, 16])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_slices_equal_gather_values_and_gradients(d, dtype, form):
    taylor_symmetric = FORMS[form]
    x = jax.random.normal(jax.random.PRNGKey(d), (2, 5, 3, d), jnp.float32).astype(dtype)
    ct = jax.random.normal(jax.random.PRNGKey(7), (2, 5, 3, fm.taylor_symmetric_dim(d)),
                           jnp.float32).astype(dtype)
    np.testing.assert_array_equal(np.asarray(taylor_symmetric(x), np.float32),
                                  np.asarray(gathered(x), np.float32))
    grad_new = jax.vjp(taylor_symmetric, x)[1](ct)[0]
    grad_old = jax.vjp(gathered, x)[1](ct)[0]
    # each x_i's gradient sums the same terms in another order: float32 rounding, or
    # bfloat16's (8 bits) relative to the gradient's scale, where sums cancel
    grad_old = np.asarray(grad_old, np.float32)
    scale = 1e-6 if dtype == jnp.float32 else 1e-2 * np.abs(grad_old).max()
    np.testing.assert_allclose(np.asarray(grad_new, np.float32), grad_old, rtol=1e-6,
                               atol=scale)


def test_the_gradient_is_written_out_on_every_backend(monkeypatch):
    """Traced for a CPU or a GPU the gradient is the written-out one (its pairs read by a
    gather), not autodiff's sum of the slices' padded copies (no gather)."""
    def primitives(fn, backend):
        monkeypatch.setattr(jax, "default_backend", lambda: backend)
        grad = jax.grad(lambda x: jnp.sum(fn(x) ** 2))
        return str(jax.make_jaxpr(grad)(jnp.ones((2, 4, 16), jnp.float32)))

    assert "gather" in primitives(fm.taylor_symmetric, "cpu")
    assert "gather" in primitives(fm.taylor_symmetric, "gpu")
    assert "gather" not in primitives(fm._taylor_symmetric_forward, "gpu")
