"""Hugging Face checkpoints in and out: a folder of config.json + model.safetensors.

    model = hf.load("path/to/llama")          # Llama, Mistral, Qwen2, GPT-2, or ours
    hf.save(model, "out/")                    # softmax models: transformers' format

Read without torch: the safetensors package's numpy API (bfloat16 and float16 tensors
are read through ml_dtypes and cast to the model's param_dtype), one file or a sharded
checkpoint (model.safetensors.index.json). The names map one to one (`hf_names`):
nn.Linear weights (out, in) are transposed to our kernels (in, out); GPT-2's Conv1D
weights are already (in, out), and its fused c_attn is split into q, k, v. A
checkpoint tensor the map does not use, or a parameter it lacks, stops the import with
their names (only GPT-2's attention-mask buffers are skipped), so an unsupported variant
never loads as a wrong model.

save: a model of softmax (or sliding-window) layers is written as the transformers
family whose blocks it has (models.hf_config.family_of), loadable by
AutoModelForCausalLM; any other model (linear mixers, hybrids) as our own format: the
same two files, config.json {"model_type": "linmix", "model": ModelConfig fields} and the
parameters under their unrolled names ("blocks/3/mixer/q_proj/kernel"), which `load`
reads back (in either scan layout).
"""
from __future__ import annotations

import json
import pathlib
from typing import Mapping

import numpy as np

from models import hf_config, layer_stack
from models.config import ModelConfig

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
OURS = "linmix"  # config.json model_type of this repository's own format
# GPT-2 checkpoints carry the causal mask as buffers (older ones): not parameters.
_SKIPPED = (".attn.bias", ".attn.masked_bias")


# ------------------------------------------------------------------------- safetensors
def read_tensors(folder: str | pathlib.Path) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint folder (one file, or the shards its index names),
    as numpy arrays; no torch."""
    folder = pathlib.Path(folder)
    index = folder / INDEX
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / WEIGHTS).is_file():
        files = [WEIGHTS]
    else:
        raise FileNotFoundError(f"{folder} has neither {WEIGHTS} nor {INDEX}: pass a folder "
                                f"written by save_pretrained(safe_serialization=True)")
    out = {}
    for name in files:
        out.update(_read_file(folder / name))
    return out


def _read_file(path: pathlib.Path) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file
    try:
        return load_file(str(path))
    except (SafetensorError, TypeError, ValueError) as e:
        if "BF16" not in str(e) and "bfloat16" not in str(e).lower():
            raise ValueError(f"{path}: not a readable safetensors file ({e})") from e
    return _read_raw(path)  # numpy has no bfloat16: read the bytes through ml_dtypes


def _read_raw(path: pathlib.Path) -> dict[str, np.ndarray]:
    """The safetensors layout read directly: an 8-byte little-endian header length, a
    JSON header {name: {dtype, shape, data_offsets}}, then the bytes."""
    import ml_dtypes
    dtypes = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
              "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32,
              "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        start, end = spec["data_offsets"]
        dtype = dtypes[spec["dtype"]]
        out[name] = np.frombuffer(raw[base + start:base + end], dtype=dtype).reshape(
            spec["shape"]).copy()
    return out


def write_tensors(path: str | pathlib.Path, tensors: Mapping[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file
    # transformers refuses a file whose metadata format is not a framework it knows.
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path),
              metadata={"format": "pt"})


# ------------------------------------------------------------------------------ names
def hf_names(cfg: ModelConfig, family: str) -> dict[str, tuple[str, bool]]:
    """{our unrolled parameter name: (the checkpoint's tensor name, transposed?)} for a
    model of `family`; GPT-2's c_attn is listed as its q, k, v thirds ("...c_attn.weight
    #q"), which _split_fused / _fuse turn into the file's one tensor and back."""
    out: dict[str, tuple[str, bool]] = {}
    if family == "gpt2":
        out["embed/embedding"] = ("transformer.wte.weight", False)
        out["pos_embed/embedding"] = ("transformer.wpe.weight", False)
        for i in range(cfg.num_layers):
            h, b = f"transformer.h.{i}.", f"blocks/{i}/"
            for ours, theirs in (("mixer_norm", "ln_1"), ("mlp_norm", "ln_2")):
                out[b + ours + "/scale"] = (h + theirs + ".weight", False)
                out[b + ours + "/bias"] = (h + theirs + ".bias", False)
            for p in "qkv":
                out[b + f"mixer/{p}_proj/kernel"] = (h + f"attn.c_attn.weight#{p}", False)
                out[b + f"mixer/{p}_proj/bias"] = (h + f"attn.c_attn.bias#{p}", False)
            for ours, theirs in (("mixer/o_proj", "attn.c_proj"), ("mlp/up", "mlp.c_fc"),
                                 ("mlp/down", "mlp.c_proj")):
                out[b + ours + "/kernel"] = (h + theirs + ".weight", False)
                out[b + ours + "/bias"] = (h + theirs + ".bias", False)
        out["final_norm/scale"] = ("transformer.ln_f.weight", False)
        out["final_norm/bias"] = ("transformer.ln_f.bias", False)
    else:
        out["embed/embedding"] = ("model.embed_tokens.weight", False)
        for i in range(cfg.num_layers):
            h, b = f"model.layers.{i}.", f"blocks/{i}/"
            out[b + "mixer_norm/scale"] = (h + "input_layernorm.weight", False)
            out[b + "mlp_norm/scale"] = (h + "post_attention_layernorm.weight", False)
            for p, bias in (("q", cfg.qkv_bias), ("k", cfg.qkv_bias), ("v", cfg.qkv_bias),
                            ("o", cfg.o_bias)):
                out[b + f"mixer/{p}_proj/kernel"] = (h + f"self_attn.{p}_proj.weight", True)
                if bias:
                    out[b + f"mixer/{p}_proj/bias"] = (h + f"self_attn.{p}_proj.bias", False)
            for p in ("gate", "up", "down"):
                out[b + f"mlp/{p}/kernel"] = (h + f"mlp.{p}_proj.weight", True)
                if cfg.mlp_bias:
                    out[b + f"mlp/{p}/bias"] = (h + f"mlp.{p}_proj.bias", False)
        out["final_norm/scale"] = ("model.norm.weight", False)
    if not cfg.tie_embeddings:
        out["head/kernel"] = ("lm_head.weight", True)
    return out


def _split_fused(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GPT-2: each c_attn weight (d, 3d) and bias (3d,) as its q, k, v thirds; names
    without the optional "transformer." prefix given it; mask buffers dropped."""
    out = {}
    for name, t in tensors.items():
        if name.endswith(_SKIPPED):
            continue
        if not name.startswith("transformer.") and name != "lm_head.weight":
            name = "transformer." + name
        if ".attn.c_attn." in name:
            for p, part in zip("qkv", np.split(t, 3, axis=-1)):
                out[f"{name}#{p}"] = part
        else:
            out[name] = t
    return out


def _fuse(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out, parts = {}, {}
    for name, t in tensors.items():
        base, _, p = name.partition("#")
        if p:
            parts.setdefault(base, {})[p] = t
        else:
            out[name] = t
    for base, qkv in parts.items():
        out[base] = np.concatenate([qkv[p] for p in "qkv"], axis=-1)
    return out


# ------------------------------------------------------------------------------ import
def params_from_hf(tensors: Mapping[str, np.ndarray], cfg: ModelConfig,
                   family: str) -> dict[str, np.ndarray]:
    """Our flat parameters (unrolled names, cfg.param_dtype) from a checkpoint's tensors;
    ValueError naming any tensor left unused or missing."""
    tensors = _split_fused(dict(tensors)) if family == "gpt2" else dict(tensors)
    if cfg.tie_embeddings:
        tensors.pop("lm_head.weight", None)  # some files store the tied head too
    names = hf_names(cfg, family)
    missing = sorted(theirs for theirs, _ in names.values() if theirs not in tensors)
    used = {theirs for theirs, _ in names.values()}
    extra = sorted(set(tensors) - used)
    if missing or extra:
        raise ValueError(
            f"the {family} checkpoint does not match its config.json: "
            + (f"missing {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}; "
               if missing else "")
            + (f"not used {', '.join(extra[:6])}{' ...' if len(extra) > 6 else ''}"
               if extra else ""))
    dtype = np.dtype(cfg.param_dtype) if cfg.param_dtype != "bfloat16" else np.float32
    return {ours: np.asarray(tensors[theirs].T if t else tensors[theirs]).astype(dtype)
            for ours, (theirs, t) in names.items()}


def params_to_hf(flat: Mapping[str, np.ndarray], cfg: ModelConfig,
                 family: str) -> dict[str, np.ndarray]:
    """The checkpoint tensors of our flat parameters (unrolled names), float32."""
    names = hf_names(cfg, family)
    out = {theirs: np.asarray(flat[ours], np.float32).T if t
           else np.asarray(flat[ours], np.float32)
           for ours, (theirs, t) in names.items()}
    return _fuse(out) if family == "gpt2" else out


# ----------------------------------------------------------------------- model <-> flat
def unrolled_params(model) -> dict[str, np.ndarray]:
    """A LanguageModel's parameters as numpy, under their unrolled names."""
    from flax import nnx

    from training.model_state import flat_params  # a pure helper, no training state
    flat = flat_params(nnx.state(model, nnx.Param))
    period = layer_stack.stacked_period(flat)
    out = {}
    for name, a in flat.items():
        if name.startswith(layer_stack.STACKED + "/"):
            for r in range(a.shape[0]):
                out[layer_stack.unrolled_name(name, r, period)] = a[r]
        else:
            out[name] = a
    flat = out
    return {k: np.asarray(v) for k, v in flat.items()}


def build(cfg: ModelConfig, flat: Mapping[str, np.ndarray], seed: int = 0):
    """A LanguageModel of cfg holding `flat` (unrolled or stacked names; converted to
    the model's layout); ValueError naming parameters missing, extra or misshapen."""
    import jax.numpy as jnp
    from flax import nnx

    from models.lm import LanguageModel
    from training.model_state import flat_params, path_name
    model = LanguageModel(cfg, rngs=nnx.Rngs(seed))
    state = nnx.state(model, nnx.Param)
    paths = {path_name(p): p for p, _ in state.flat_state()}
    current = flat_params(state)
    flat = layer_stack.convert(dict(flat), current.keys(), stack=np.stack,
                               take=lambda a, r: a[r])
    missing, extra = sorted(set(current) - set(flat)), sorted(set(flat) - set(current))
    shapes = [f"{k} {tuple(flat[k].shape)} != {tuple(current[k].shape)}"
              for k in sorted(set(current) & set(flat))
              if tuple(flat[k].shape) != tuple(current[k].shape)]
    if missing or extra or shapes:
        raise ValueError("the parameters do not fit the model: "
                         + "; ".join(filter(None, [
                             missing and f"missing {', '.join(missing[:5])}",
                             extra and f"extra {', '.join(extra[:5])}",
                             shapes and f"shapes {', '.join(shapes[:5])}"])))
    nnx.update(model, nnx.State.from_flat_path(
        [(paths[k], jnp.asarray(flat[k], current[k].dtype)) for k in current]))
    return model


# --------------------------------------------------------------------------- load / save
def read_config(folder: str | pathlib.Path) -> dict:
    path = pathlib.Path(folder) / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: pass a folder holding a Hugging Face "
                                f"checkpoint (config.json and model.safetensors)")
    return json.loads(path.read_text())


def model_config(folder: str | pathlib.Path, **overrides) -> ModelConfig:
    """The ModelConfig of a checkpoint folder (either format), overrides applied."""
    hf = read_config(folder)
    if hf.get("model_type") == OURS:
        return ModelConfig.from_dict({**hf["model"], **overrides})
    return hf_config.from_hf(hf, **overrides)


def load(folder: str | pathlib.Path, **overrides):
    """The LanguageModel of a checkpoint folder: a Hugging Face Llama, Mistral, Qwen2 or
    GPT-2, or one `save` wrote in our format. overrides: ModelConfig keys (dtype,
    scan_layers, impl, ...)."""
    hf = read_config(folder)
    cfg = model_config(folder, **overrides)
    tensors = read_tensors(folder)
    if hf.get("model_type") == OURS:
        return build(cfg, tensors)
    return build(cfg, params_from_hf(tensors, cfg, hf["model_type"]))


def save(model, folder: str | pathlib.Path, *, ours: bool = False) -> str:
    """Writes `model` to `folder` (config.json + model.safetensors): as its transformers
    family when it has one and not `ours`, else in our format. Returns the format
    written ("llama", "qwen2", "mistral", "gpt2" or "linmix")."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg
    flat = unrolled_params(model)
    family = OURS
    if not ours:
        try:
            family = hf_config.family_of(cfg)
        except hf_config.UnsupportedConfig:
            family = OURS
    if family == OURS:
        config = {"model_type": OURS, "format_version": 1, "model": cfg.to_dict()}
        tensors = {k: np.asarray(v) for k, v in flat.items()}
    else:
        config = hf_config.to_hf(cfg)
        tensors = params_to_hf(flat, cfg, family)
    write_tensors(folder / WEIGHTS, tensors)
    (folder / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return family
