"""Hugging Face config.json <-> ModelConfig, for the families models.hf reads and writes.

Read: Llama, Mistral, Qwen2 (RoPE, scaled as rope_scaling / rope_parameters say:
default, linear, llama3; grouped-query attention; SwiGLU; RMSNorm; biases as each
family has them; Mistral's and Qwen2's sliding windows) and GPT-2 (learned positions,
LayerNorm, GELU MLP, biases everywhere). Both spellings of RoPE are read: transformers 5's
`rope_parameters` and 4's `rope_theta` + `rope_scaling`.
Write (`to_hf`): a ModelConfig of softmax (or all sliding-window) layers as the family
whose blocks it has; anything a family cannot express is named in the error.
A setting neither side has (another rope_type, a partial rotary, GPT-2's scaled-by-layer
attention, another activation) stops with a ValueError naming the key, never a silently
different model.
"""
from __future__ import annotations

from typing import Any, Mapping

from models.config import ModelConfig

LLAMA_FAMILY = ("llama", "mistral", "qwen2")
FAMILIES = LLAMA_FAMILY + ("gpt2",)
# The KV-cache length a model built from an imported config allocates by default
# (ModelConfig.max_len, a runtime key): max_position_embeddings, at most this.
MAX_CACHE = 8192


class UnsupportedConfig(ValueError):
    """A Hugging Face config with a setting this repository's blocks do not have."""


def _fail(key: str, value: Any, why: str):
    raise UnsupportedConfig(f"config.json {key}={value!r}: {why}")


def _rope(hf: Mapping[str, Any]) -> dict:
    """Our rope_* keys from rope_parameters (transformers 5) or rope_theta + rope_scaling."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = dict(hf.get("rope_scaling") or {})
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    spec = {**scaling, **params}
    kind = spec.get("rope_type", spec.get("type", "default")) or "default"
    if float(hf.get("partial_rotary_factor", spec.get("partial_rotary_factor", 1.0))) != 1.0:
        _fail("partial_rotary_factor", hf.get("partial_rotary_factor"),
              "only full rotary embeddings are supported")
    out = {"rope_theta": float(theta)}
    if kind == "default":
        return out
    if kind == "linear":
        return {**out, "rope_scaling": "linear", "rope_factor": float(spec["factor"])}
    if kind == "llama3":
        return {**out, "rope_scaling": "llama3", "rope_factor": float(spec["factor"]),
                "rope_low_freq_factor": float(spec["low_freq_factor"]),
                "rope_high_freq_factor": float(spec["high_freq_factor"]),
                "rope_original_max_len": int(spec["original_max_position_embeddings"])}
    _fail("rope_type", kind, "supported RoPE types are default, linear and llama3")


def _llama_family(hf: Mapping[str, Any]) -> dict:
    kind = hf["model_type"]
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        _fail("hidden_act", act, "the SwiGLU MLP of this family uses silu")
    heads = int(hf["num_attention_heads"])
    d = int(hf["hidden_size"])
    head_dim = int(hf.get("head_dim") or d // heads)
    out = dict(vocab_size=int(hf["vocab_size"]), d_model=d,
               num_layers=int(hf["num_hidden_layers"]), num_heads=heads,
               num_kv_heads=int(hf.get("num_key_value_heads") or heads),
               head_dim=head_dim if head_dim * heads != d else 0,
               d_ff=int(hf["intermediate_size"]), norm="rmsnorm",
               norm_eps=float(hf.get("rms_norm_eps", 1e-6)), mlp_type="swiglu",
               positions="rope", tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
               **_rope(hf))
    if kind == "llama":
        bias = bool(hf.get("attention_bias", False))
        out.update(qkv_bias=bias, o_bias=bias, mlp_bias=bool(hf.get("mlp_bias", False)))
    elif kind == "qwen2":
        out.update(qkv_bias=True)
    out.update(_windows(hf, out["num_layers"]))
    return out


def _windows(hf: Mapping[str, Any], num_layers: int) -> dict:
    """Mistral: sliding_window (None: full attention) on every layer; Qwen2: layer_types
    (transformers 5) or use_sliding_window with max_window_layers."""
    window = hf.get("sliding_window")
    kind = hf["model_type"]
    if kind == "mistral":
        return {"mixer": "sliding_window", "window": int(window)} if window else {}
    if kind != "qwen2" or not window:
        return {}
    types = hf.get("layer_types")
    if types is None:
        if not hf.get("use_sliding_window", False):
            return {}
        start = int(hf.get("max_window_layers", num_layers))
        types = ["sliding_attention" if i >= start else "full_attention"
                 for i in range(num_layers)]
    names = {"full_attention": "softmax", "sliding_attention": "sliding_window"}
    unknown = sorted(set(types) - set(names))
    if unknown:
        _fail("layer_types", unknown, f"known layer types: {sorted(names)}")
    layers = [names[t] for t in types]
    if set(layers) == {"softmax"}:
        return {}
    return {"layer_pattern": ",".join(layers), "window": int(window)}


def _gpt2(hf: Mapping[str, Any]) -> dict:
    acts = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
    act = hf.get("activation_function", "gelu_new")
    if act not in acts:
        _fail("activation_function", act, f"supported: {sorted(acts)}")
    if hf.get("scale_attn_by_inverse_layer_idx", False):
        _fail("scale_attn_by_inverse_layer_idx", True, "not supported")
    if not hf.get("scale_attn_weights", True):
        _fail("scale_attn_weights", False, "attention is scaled by 1/sqrt(head_dim) here")
    d = int(hf["n_embd"])
    return dict(vocab_size=int(hf["vocab_size"]), d_model=d, num_layers=int(hf["n_layer"]),
                num_heads=int(hf["n_head"]), d_ff=int(hf.get("n_inner") or 4 * d),
                norm="layernorm", norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
                mlp_type=acts[act], qkv_bias=True, o_bias=True, mlp_bias=True,
                positions="learned", num_positions=int(hf["n_positions"]),
                tie_embeddings=bool(hf.get("tie_word_embeddings", True)))


def from_hf(hf: Mapping[str, Any], **overrides) -> ModelConfig:
    """The ModelConfig of a Hugging Face config.json (a dict); `overrides` set any of
    our keys besides (e.g. dtype, scan_layers, impl)."""
    kind = hf.get("model_type")
    if kind not in FAMILIES:
        raise UnsupportedConfig(f"config.json model_type={kind!r}: supported families are "
                                f"{', '.join(FAMILIES)}")
    d = _gpt2(hf) if kind == "gpt2" else _llama_family(hf)
    positions = int(hf.get("max_position_embeddings") or hf.get("n_positions") or 2048)
    d.update(mixer=d.get("mixer", "softmax"), mlp=True, dropout=0.0, attention_dropout=0.0,
             max_len=min(positions, MAX_CACHE),
             init_std=float(hf.get("initializer_range", 0.02)))
    d.update(overrides)
    return ModelConfig(**d)


# ----------------------------------------------------------------------------- export
def family_of(cfg: ModelConfig) -> str:
    """The Hugging Face family whose blocks cfg has ("llama", "qwen2", "mistral",
    "gpt2"); UnsupportedConfig naming what no family has."""
    mixers = set(cfg.layer_mixers())
    if not cfg.mlp:
        raise UnsupportedConfig("model.mlp=False: every exported family has an MLP")
    if not mixers <= {"softmax", "sliding_window"}:
        raise UnsupportedConfig(
            f"layers {sorted(mixers - {'softmax', 'sliding_window'})} are not softmax "
            f"attention: transformers has no such layer (models.hf.save writes those in "
            f"this repository's format)")
    if cfg.positions == "learned":
        want = dict(norm="layernorm", qkv_bias=True, o_bias=True, mlp_bias=True)
        bad = [f"{k}={getattr(cfg, k)!r}" for k, v in want.items() if getattr(cfg, k) != v]
        if cfg.mlp_type == "swiglu":
            bad.append("mlp_type='swiglu'")
        if mixers != {"softmax"}:
            bad.append("sliding_window layers")
        if cfg.resolved_kv_heads != cfg.num_heads or cfg.head_dim not in (0, cfg.d_model //
                                                                         cfg.num_heads):
            bad.append("grouped-query attention or head_dim")
        if bad:
            raise UnsupportedConfig("learned positions export as GPT-2, which has none of: "
                                    + ", ".join(bad))
        return "gpt2"
    bad = []
    if cfg.positions != "rope":
        bad.append(f"positions={cfg.positions!r}")
    if cfg.norm != "rmsnorm":
        bad.append(f"norm={cfg.norm!r}")
    if cfg.mlp_type != "swiglu":
        bad.append(f"mlp_type={cfg.mlp_type!r}")
    if bad:
        raise UnsupportedConfig("RoPE models export as Llama / Qwen2 / Mistral, which have "
                                "none of: " + ", ".join(bad))
    if mixers == {"sliding_window"}:
        if cfg.qkv_bias or cfg.o_bias or cfg.mlp_bias:
            raise UnsupportedConfig("Mistral (all sliding-window layers) has no biases")
        return "mistral"
    if "sliding_window" in mixers:
        if cfg.o_bias or cfg.mlp_bias:
            raise UnsupportedConfig("mixed full / sliding-window layers export as Qwen2, "
                                    "which has no o_proj or MLP biases")
        return "qwen2"
    if cfg.qkv_bias and not cfg.o_bias and not cfg.mlp_bias:
        return "qwen2"
    if cfg.qkv_bias != cfg.o_bias:
        raise UnsupportedConfig("Llama's attention_bias sets q, k, v and o biases together; "
                                f"qkv_bias={cfg.qkv_bias} with o_bias={cfg.o_bias} is no "
                                f"family's")
    return "llama"


def _rope_out(cfg: ModelConfig) -> dict:
    params = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling == "linear":
        params.update(rope_type="linear", factor=cfg.rope_factor)
    elif cfg.rope_scaling == "llama3":
        params.update(rope_type="llama3", factor=cfg.rope_factor,
                      low_freq_factor=cfg.rope_low_freq_factor,
                      high_freq_factor=cfg.rope_high_freq_factor,
                      original_max_position_embeddings=cfg.rope_original_max_len)
    # transformers 5 reads rope_parameters; 4.x reads rope_theta and rope_scaling.
    legacy = {k: v for k, v in params.items() if k != "rope_theta"}
    return {"rope_parameters": params, "rope_theta": cfg.rope_theta,
            "rope_scaling": None if cfg.rope_scaling == "none" else legacy}


def to_hf(cfg: ModelConfig) -> dict:
    """The config.json of cfg as its family (family_of), loadable by transformers'
    AutoModelForCausalLM."""
    family = family_of(cfg)
    common = {"vocab_size": cfg.vocab_size, "tie_word_embeddings": cfg.tie_embeddings,
              "initializer_range": cfg.init_std, "torch_dtype": cfg.param_dtype,
              "dtype": cfg.param_dtype, "use_cache": True}
    if family == "gpt2":
        return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                "n_embd": cfg.d_model, "n_layer": cfg.num_layers, "n_head": cfg.num_heads,
                "n_inner": cfg.resolved_d_ff, "n_positions": cfg.num_positions,
                "layer_norm_epsilon": cfg.norm_eps,
                "activation_function": ("gelu_new" if cfg.mlp_type == "gelu_tanh"
                                        else "gelu"),
                "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
                "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                "reorder_and_upcast_attn": False, "bos_token_id": None,
                "eos_token_id": None, **common}
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "mistral": "MistralForCausalLM"}[family]
    out = {"model_type": family, "architectures": [arch], "hidden_size": cfg.d_model,
           "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
           "num_key_value_heads": cfg.resolved_kv_heads, "head_dim": cfg.resolved_head_dim,
           "intermediate_size": cfg.resolved_d_ff, "hidden_act": "silu",
           "rms_norm_eps": cfg.norm_eps, "max_position_embeddings": cfg.max_len,
           "attention_dropout": 0.0, "bos_token_id": None, "eos_token_id": None,
           **_rope_out(cfg), **common}
    mixers = cfg.layer_mixers()
    if family == "llama":
        out.update(attention_bias=cfg.qkv_bias, mlp_bias=cfg.mlp_bias)
    elif family == "mistral":
        out.update(sliding_window=cfg.window)
    else:
        windowed = "sliding_window" in mixers
        out.update(sliding_window=cfg.window if windowed else None,
                   use_sliding_window=windowed, max_window_layers=cfg.num_layers,
                   layer_types=["sliding_attention" if m == "sliding_window"
                                else "full_attention" for m in mixers])
    return out
