"""train.py with Hedgehog's feature map changed, for issue 18's diagnosis (session 25):

    PATCH=frozen  a = x: the map's W and b unused (held at the identity and zero), so the
                  features are softmax([2x, -2x]) of the short conv's output
    PATCH=nobias  a = W x: W learned, b held at zero
    PATCH=fla     fla's LinearAttention layout (its defaults): no denominator, an RMSNorm
                  on each head's output (our `linear` with feature_map=identity does the
                  same); the map learned as usual
    PATCH=temp8   softmax([8a, -8a]) instead of fla's [2a, -2a] (any number after "temp")

    PATCH=frozen python docs/measurements/session25/hedgehog_cpu/patched_train.py \\
        --config=configs/mqar_zoology_paper.py --workdir=... --config.model.mixer=hedgehog

Run from the repository root; every other flag is train.py's."""
import os
import runpy
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.getcwd())
from models import feature_maps as fm  # noqa: E402


LOG_FEATURES = fm.HedgehogFeatureMap.log_features  # [a, -a], a = W x + b


def identity_map(self, x):
    a = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    return jnp.concatenate([a, -a], axis=-1)


def map_without_bias(self, x):
    """[W x, -W x]: the bias added and taken away again, so it gets no gradient and
    stays at its initial zero."""
    b = self.bias[...].astype(jnp.float32)
    return LOG_FEATURES(self, x) - jnp.concatenate([b, -b], axis=-1)


def fla_layout():
    from flax import nnx

    from models.layers import dtypes, meta
    from models.mixers.linear import Hedgehog

    init, output = Hedgehog.__init__, Hedgehog._output

    def new_init(self, cfg, *, rngs):
        init(self, cfg, rngs=rngs)
        self.normalize = False
        dtype, param_dtype = dtypes(cfg)
        self.o_norm = nnx.RMSNorm(self.head_dim, epsilon=cfg.norm_eps, dtype=dtype,
                                  param_dtype=param_dtype, scale_metadata=meta("norm"),
                                  rngs=rngs)

    def new_output(self, o, x, inputs):
        return output(self, self.o_norm(o), x, inputs)

    Hedgehog.__init__, Hedgehog._output = new_init, new_output


def sharper_softmax(temperature: float):
    def call(self, x):
        return jax.nn.softmax(temperature * self.log_features(x), axis=-1)
    fm.HedgehogFeatureMap.__call__ = call


patch = os.environ.get("PATCH", "")
if patch == "frozen":
    fm.HedgehogFeatureMap.log_features = identity_map
elif patch == "nobias":
    fm.HedgehogFeatureMap.log_features = map_without_bias
elif patch == "fla":
    fla_layout()
elif patch.startswith("temp"):
    sharper_softmax(float(patch[4:]))
else:
    raise SystemExit(f"PATCH={patch!r}: choose frozen, nobias, fla or temp<T>")
sys.argv = ["train.py"] + sys.argv[1:]
runpy.run_path("train.py", run_name="__main__")
