"""Config -> dataset -> model config -> model, shared by training and `load_for_eval`.

Imports of `data` and `models` happen here, lazily, so that config checking and the
CLI's error messages never wait on (or break because of) model or data code.
"""
from __future__ import annotations

from training import config_tools


def build_dataset(config, tokenizer=None):
    """The config's dataset; `tokenizer` (text sources): use it instead of building one
    from the text (a run's saved tokenizer, for evaluation)."""
    import data
    cfg_data = (config.data.to_dict() if hasattr(config.data, "to_dict")
                else dict(config.data))
    return data.build(cfg_data, seed=int(config.train.seed), tokenizer=tokenizer)


def build_model_config(config, dataset):
    """`models.ModelConfig` from the model section, vocab_size taken from the dataset
    when the config leaves it 0."""
    import models
    d = config_tools.model_config_dict(config, dataset.vocab_size)
    try:
        return models.ModelConfig.from_dict(d)
    except (TypeError, ValueError) as e:  # name the section the user has to edit
        raise config_tools.ConfigError(f"model section: {e}") from e


def model_factory(model_cfg, seed: int):
    """A zero-argument constructor: used abstractly (eval_shape) and inside jit."""
    make = seeded_model_factory(model_cfg)
    return lambda: make(int(seed))


def seeded_model_factory(model_cfg):
    """make(seed): the model of that seed, the seed a Python int or a traced int32 (the
    same draws either way), so one compiled init serves every seed."""
    import jax
    from flax import nnx
    import models

    def make(seed):  # nnx.Rngs(int) is nnx.Rngs(jax.random.key(int))
        return models.LanguageModel(model_cfg, rngs=nnx.Rngs(jax.random.key(seed)))
    return make
