"""ModelConfig: every hyper-parameter of a LanguageModel, with defaults.

A frozen dataclass so a config is a plain value (hashable, safe to close over in jit).
Training builds one from `config.model.to_dict()` with `ModelConfig.from_dict`; models
never import ml_collections (the GPU machine lacks it). configs/base.py takes its model
section from these fields, so the defaults are stated here only. Fields marked runtime
say how a model is computed, not what it is: a resume may change them.
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Mapping

from kernels.attention import WINDOW_IMPLS
from kernels.ops import CONV_IMPLS, IMPLS

DTYPES = ("float32", "bfloat16", "float16")
FEATURE_MAPS = ("elu", "relu", "identity", "dpfp")
REMAT_POLICIES = ("none", "full", "save_dots", "save_all_dots")
NORMS = ("rmsnorm", "layernorm")
MLP_TYPES = ("swiglu", "gelu", "gelu_tanh")
POSITIONS = ("rope", "learned", "none")
ROPE_SCALINGS = ("none", "linear", "llama3")


def _runtime(default):
    """A field a resumed run may change (training.checkpoint compares every other field
    with the checkpoint's config): it changes how the model is computed, not its weights."""
    return dataclasses.field(default=default, metadata={"runtime": True})


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    # Sizes.
    vocab_size: int = 256
    d_model: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 0          # grouped-query attention; 0 = num_heads
    head_dim: int = 0              # 0 = d_model // num_heads
    # Which mixer each layer uses.
    mixer: str = "softmax"         # a name in models.mixers.MIXERS
    softmax_every: int = 0         # 0 = never; 8 = layers 7, 15, ... are softmax (1-in-8 hybrid)
    # Mixer names, comma-separated: one per layer, or a group repeated to num_layers (it
    # must divide it); "N*name" repeats a name; the name "mixer" stands for cfg.mixer.
    # "base_conv,mixer" = Zoology's Hybrid([BaseConv, mixer]) (configs/mqar_zoology.py);
    # "7*gated_deltanet,softmax" = the 1-in-8 hybrid. Overrides softmax_every. (Configs
    # before it held one "L"/"S" letter per layer: read as L = mixer, S = softmax.)
    layer_pattern: str = ""
    # MLP.
    mlp: bool = True               # Zoology's MQAR runs have no MLP
    d_ff: int = 0                  # 0 = SwiGLU default, ~8/3 d_model rounded up to 32
    dropout: float = _runtime(0.0)  # on the embeddings and each residual branch
    attention_dropout: float = 0.0  # on softmax attention probabilities (nanoGPT's attn_dropout)
    # Mixer-specific.
    window: int = 64               # sliding window (sliding_window, based)
    feature_map: str = "elu"       # `linear`: elu, relu, identity, dpfp (2 d features)
    based_feature_dim: int = 16    # Based: q, k projected to this many dims per head
    num_random_features: int = 256  # performer
    # Performer: while training, redraw omega every N steps (1, the default: every step,
    # as google-research's make_fast_softmax_attention, redraw_features=True); each
    # layer's omega is a pure function of (seed, layer, step // N)
    # (training.runtime.Steps.feature_key), so a resume is exact; 0 keeps the draw made at
    # init. Evaluation and decoding always use the init draw.
    performer_redraw_every: int = _runtime(1)
    performer_qk_norm: bool = False  # L2-normalised q, k times a learned temperature
    hedgehog_map: str = "softmax"  # "softmax" (fla's map) or "exp" (the paper's)
    # Hedgehog's attention distillation while training (Zhang et al. 2024): each hedgehog
    # layer adds this weight times the cross-entropy between the softmax attention of its
    # own q, k (held out of the gradient) and its linear attention's weights to the
    # training loss (models.auxiliary, training.step). 0: the next-token loss alone.
    hedgehog_distill: float = _runtime(0.0)
    conv_size: int = 4             # short causal conv (deltanet, gated_deltanet; short_conv)
    # fla's use_short_conv for linear, performer, hedgehog, lightning, based, taylor: a
    # causal depthwise conv (conv_size taps) + SiLU on q, k and v before the feature map.
    # Off by default: none of their reference layers has one (fla's LinearAttention and
    # BasedLinearAttention, Based's LinearAttention, fla's LightNet default False); the
    # delta rules always have theirs.
    short_conv: bool = False
    base_conv_size: int = 3        # base_conv / gated_conv conv taps (kernel_size=3 in both)
    gated_conv_expand: int = 4     # gated_conv: in_proj to 4 d_model (Based's expand_proj)
    impl: str = _runtime("auto")   # kernels.ops implementation for linear ops
    # kernels.attention.sliding_window_attention's impl for sliding-window layers (and
    # based's window part): auto, cudnn, blocked or masked
    window_impl: str = _runtime("auto")
    # Segment masks handed to cuDNN attention for every head rather than one shared head:
    # set by training.population, whose vmapped and differentiated step cuDNN's batching
    # rules (jax <= 0.11.2) cannot take with a shared head (kernels.attention).
    mask_every_head: bool = _runtime(False)
    # Softmax layers over packed documents: > 0 hands cuDNN each row's documents in its
    # packed-sequence layout (rows of at most this many documents; a batch with a longer
    # row takes the mask path), so it computes attention only within documents, where the
    # mask path computes the whole causal T x T. 0: the mask path (kernels.attention).
    # It pays for long rows of many documents (T 8,192 of paragraphs: the layer's
    # attention 1.95x faster) and costs at T <= 2,048, where cuDNN's fixed cost per
    # sequence exceeds the work it skips (docs/benchmarks.md, session 37); hence off.
    attention_max_segments: int = _runtime(0)
    chunk_size: int = _runtime(64)
    # The delta rules' input path in training (conv + SiLU + q/k L2 norm + q scale):
    # "pallas": on a GPU with 16-bit compute, one Triton program forward and two backward
    # (kernels.pallas.short_conv; elsewhere the XLA form), or "xla": XLA's fusions
    # everywhere. The kernel is the default where it runs: faster than XLA's fusions
    # there, in the op and in train.py's step (docs/benchmarks.md, session 16).
    conv_impl: str = _runtime("pallas")
    rope_theta: float = 10000.0
    max_len: int = _runtime(2048)  # default KV-cache length
    norm_eps: float = 1e-6
    init_std: float = 0.02         # embedding init
    # Numerics and memory.
    dtype: str = _runtime("float32")  # compute dtype
    param_dtype: str = "float32"   # parameters stay float32 by default
    remat: bool = _runtime(False)  # rematerialise each block in the backward pass
    # How remat stores a block's inside: "none" (remat off unless remat=True, which
    # means "full"), "full" (keep only each block's input), "save_dots" (keep the
    # projection and MLP matmul outputs, recompute the elementwise work and the batched
    # attention/chunk einsums: jax's dots_with_no_batch_dims_saveable), "save_all_dots"
    # (keep every matmul output, batched ones included: jax's dots_saveable).
    remat_policy: str = _runtime("none")
    # Stack the parameters of the repeating group of layers (all layers alike: one
    # layer; a 7+1 hybrid: the 8 layers) with a leading "layers" axis and run the
    # groups under one lax.scan, so compile time does not grow with depth. Depths with
    # no repeating group shorter than the model stay unrolled. Off by default: under
    # the scan a step runs slower on the GPU and the CPU alike (docs/benchmarks.md), so
    # it pays only where compile time outweighs the run. Runtime: the checkpoint
    # loader converts between the layouts (models.layer_stack).
    scan_layers: bool = _runtime(False)
    tie_embeddings: bool = False
    # Block options that imported checkpoints need (models.hf: Llama, Mistral, Qwen2,
    # GPT-2); the defaults are this repository's own blocks. norm: the blocks' and the
    # final norm, "rmsnorm" or "layernorm" (scale and bias, GPT-2's), eps norm_eps.
    norm: str = "rmsnorm"
    # "swiglu" (down(silu(gate x) * up x)), or a 2-layer MLP down(act(up x)) with "gelu"
    # (erf) or "gelu_tanh" (GPT-2's gelu_new); d_ff 0 = 4 d_model for those.
    mlp_type: str = "swiglu"
    qkv_bias: bool = False         # biases on the q, k, v projections (Qwen2, GPT-2)
    o_bias: bool = False           # and on the attention output projection (GPT-2)
    mlp_bias: bool = False         # on every MLP projection (GPT-2)
    # "rope" (rotary q, k in the softmax mixers), "learned" (GPT-2: a table of
    # num_positions position embeddings added to the token embeddings) or "none".
    positions: str = "rope"
    num_positions: int = 0         # the learned table's length (positions="learned")
    # RoPE frequency scaling as Hugging Face's rope_scaling: "none"; "linear" (every
    # frequency / rope_factor); "llama3" (Llama 3.1: long wavelengths / rope_factor,
    # short ones kept, a smooth blend between, by rope_low_freq_factor,
    # rope_high_freq_factor and rope_original_max_len).
    rope_scaling: str = "none"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192
    # RoPE on q and k of the feature-map mixers (linear, performer, hedgehog, taylor,
    # based's linear part) before the feature map, as LoLCATs' converted layers keep it.
    feature_rope: bool = False

    def __post_init__(self):
        def fail(key, msg):
            raise ValueError(f"ModelConfig.{key}={getattr(self, key)!r}: {msg}")

        for key in ("vocab_size", "d_model", "num_layers", "num_heads", "window",
                    "based_feature_dim", "num_random_features", "conv_size", "base_conv_size",
                    "gated_conv_expand",
                    "chunk_size", "max_len"):
            if getattr(self, key) <= 0:
                fail(key, "must be a positive integer")
        for key in ("num_kv_heads", "head_dim", "d_ff", "softmax_every", "num_positions"):
            if getattr(self, key) < 0:
                fail(key, "must be >= 0 (0 means the default)")
        if self.head_dim == 0 and self.d_model % self.num_heads:
            fail("num_heads", f"must divide d_model={self.d_model}, or set head_dim")
        if self.num_heads % self.resolved_kv_heads:
            fail("num_kv_heads", f"must divide num_heads={self.num_heads}")
        if self.gated_conv_expand * self.d_model % 2:
            fail("gated_conv_expand", "times d_model must be even (gated_conv splits its "
                 "in_proj output in halves)")
        if self.layer_pattern:
            try:
                names = expand_layer_pattern(self.layer_pattern, self.num_layers, self.mixer)
            except ValueError as e:
                fail("layer_pattern", str(e))
            from models.mixers import MIXERS  # here, not at the top: mixers import this file
            unknown = sorted(set(names) - set(MIXERS))
            if unknown:
                fail("layer_pattern", f"unknown mixer {', '.join(map(repr, unknown))}; valid "
                     f"names: {', '.join(sorted(MIXERS))}")
        for key in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, key) < 1.0:
                fail(key, "must be in [0, 1)")
        for key, choices in (("dtype", DTYPES), ("param_dtype", DTYPES), ("impl", IMPLS),
                             ("window_impl", WINDOW_IMPLS), ("conv_impl", CONV_IMPLS),
                             ("feature_map", FEATURE_MAPS)):
            if getattr(self, key) not in choices:
                fail(key, f"choose one of {choices}")
        if self.performer_redraw_every < 0:
            fail("performer_redraw_every", "choose 0 (the init draw) or N >= 1 (new "
                 "features every N training steps)")
        if self.hedgehog_map not in ("softmax", "exp"):
            fail("hedgehog_map", "choose 'softmax' (fla's) or 'exp' (the paper's)")
        if not self.hedgehog_distill >= 0:
            fail("hedgehog_distill", "must be >= 0 (0: no distillation loss)")
        if self.hedgehog_distill and self.scan_layers:
            fail("hedgehog_distill", "needs scan_layers=False (the layers' losses are "
                 "collected with nnx.capture, which the layer scan does not carry)")
        for key, valid in (("norm", NORMS), ("mlp_type", MLP_TYPES),
                           ("positions", POSITIONS), ("rope_scaling", ROPE_SCALINGS)):
            if getattr(self, key) not in valid:
                fail(key, f"choose one of {valid}")
        if self.positions == "learned" and self.num_positions <= 0:
            fail("num_positions", "positions='learned' needs the table's length > 0")
        if self.rope_scaling != "none" and self.rope_factor <= 0:
            fail("rope_factor", "must be > 0")
        if self.rope_scaling == "llama3" and not (
                self.rope_high_freq_factor > self.rope_low_freq_factor > 0
                and self.rope_original_max_len > 0):
            fail("rope_high_freq_factor", "llama3 scaling needs rope_high_freq_factor > "
                 "rope_low_freq_factor > 0 and rope_original_max_len > 0")
        if self.remat_policy not in REMAT_POLICIES:
            fail("remat_policy", f"choose one of {REMAT_POLICIES} (remat=True alone "
                 f"means \"full\")")

    # Derived sizes (properties, so dataclasses.replace never leaves them stale).
    @property
    def resolved_kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.d_model // self.num_heads

    @property
    def resolved_d_ff(self) -> int:
        if self.d_ff:
            return self.d_ff
        if self.mlp_type != "swiglu":
            return 4 * self.d_model
        return -(-int(8 * self.d_model / 3) // 32) * 32

    @property
    def has_auxiliary_loss(self) -> bool:
        """Whether training adds a loss the layers sow (models.auxiliary)."""
        return self.hedgehog_distill > 0

    @property
    def resolved_remat_policy(self) -> str:
        """remat_policy, with remat=True standing for "full" when no policy is named."""
        if self.remat_policy == "none" and self.remat:
            return "full"
        return self.remat_policy

    def layer_mixers(self) -> list[str]:
        """The mixer name of every layer: layer_pattern expanded, else cfg.mixer with
        "softmax" on every softmax_every-th layer."""
        if self.layer_pattern:
            return expand_layer_pattern(self.layer_pattern, self.num_layers, self.mixer)
        return ["softmax" if self.softmax_every > 0 and (i + 1) % self.softmax_every == 0
                else self.mixer for i in range(self.num_layers)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def runtime_keys(cls) -> frozenset[str]:
        """The fields marked runtime (dtype, remat, impl, ...): a resume may change them."""
        return frozenset(f.name for f in dataclasses.fields(cls)
                         if f.metadata.get("runtime"))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
        """Build from a mapping; unknown keys and wrongly typed values raise ValueError.
        A key the mapping lacks takes its SAVED_DEFAULTS value if it has one (the model a
        config written before the key existed meant), else the field's default."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        d = {**{k: v for k, v in SAVED_DEFAULTS.items() if k not in d}, **d}
        for key, value in d.items():
            if key not in fields:
                near = difflib.get_close_matches(key, list(fields), n=3, cutoff=0.5)
                hint = f" Did you mean {', '.join(near)}?" if near else ""
                raise ValueError(
                    f"Unknown model config key {key!r}.{hint} Valid keys: "
                    f"{', '.join(sorted(fields))}.")
            kwargs[key] = _check_type(key, value, type(getattr(cls, key)))
        return cls(**kwargs)


# --- Configs written before a key existed ------------------------------------------------
# A checkpoint's config.json must build the model it was trained as. Two rules, both here:
#  - SAVED_DEFAULTS: for a key added later, the value that reproduces the older model when
#    a mapping (config.json) lacks the key; from_dict applies it. short_conv: before it
#    existed no feature-map mixer had a conv (False is also today's default; stated here so
#    a later change of the default cannot silently change old checkpoints).
#    performer_redraw_every: 0, the fixed init draw every Performer trained with before
#    redraw existed (evaluating such a checkpoint builds that model; resuming its training
#    from a configs file takes the file's value, so pass performer_redraw_every=0 to keep
#    its features); performer_qk_norm: False. The block options of imported checkpoints
#    (norm ... feature_rope): this repository's blocks, as before they existed.
#  - layer_pattern letters: before mixer names, a pattern was one "L" (cfg.mixer) or "S"
#    (softmax) per layer; expand_layer_pattern still reads that form, as that model.
SAVED_DEFAULTS: dict[str, Any] = {"short_conv": False, "performer_redraw_every": 0,
                                  "performer_qk_norm": False,
                                  "norm": "rmsnorm", "mlp_type": "swiglu", "qkv_bias": False,
                                  "o_bias": False, "mlp_bias": False, "positions": "rope",
                                  "num_positions": 0, "rope_scaling": "none",
                                  "rope_factor": 1.0, "rope_low_freq_factor": 1.0,
                                  "rope_high_freq_factor": 4.0,
                                  "rope_original_max_len": 8192, "feature_rope": False}
_LEGACY_LETTERS = frozenset("LS")


def expand_layer_pattern(pattern: str, num_layers: int, mixer: str) -> list[str]:
    """A layer_pattern -> one mixer name per layer (ValueError saying what is wrong).

    "a,b,c": names, one per layer or a group repeated to num_layers (the group's length
    must divide it); "N*name" stands for N copies of name; the name "mixer" for `mixer`
    (cfg.mixer, so a sweep over model.mixer keeps the layout); spaces are ignored. A pattern
    of only the letters L and S and no comma is the old form: L = mixer, S = softmax,
    exactly one letter per layer.
    """
    text = pattern.replace(" ", "")
    if text and "," not in text and set(text) <= _LEGACY_LETTERS:
        if len(text) != num_layers:
            raise ValueError(f"the letter form needs one 'L' (mixer) or 'S' (softmax) per "
                             f"layer: {len(text)} letters for num_layers={num_layers}")
        return ["softmax" if c == "S" else mixer for c in text]
    group = []
    for item in text.split(","):
        count, star, name = item.rpartition("*")
        if not name:
            raise ValueError(f"empty mixer name in {pattern!r}; write names separated by "
                             f"commas, e.g. 'base_conv,linear' or '7*gated_deltanet,softmax'")
        if star and not (count.isdigit() and int(count) > 0):
            raise ValueError(f"{item!r}: a repeat is a positive count, e.g. '7*{name}'")
        group += [mixer if name == "mixer" else name] * (int(count) if star else 1)
    if num_layers % len(group):
        raise ValueError(f"{pattern!r} names {len(group)} layers, which neither equals nor "
                         f"divides num_layers={num_layers}")
    return group * (num_layers // len(group))


def _check_type(key: str, value: Any, want: type) -> Any:
    """Accept value for a field whose default has type `want` (ints pass as floats)."""
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[want]
    if not ok:
        raise ValueError(
            f"Model config key {key!r} must be {want.__name__}, got {value!r} "
            f"({type(value).__name__}).")
    return float(value) if want is float else value
