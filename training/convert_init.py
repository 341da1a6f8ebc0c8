"""The converted model: its config from the teacher's, its first parameters from the
teacher's, and which of them stage 1 trains.

Every layer whose mixer the conversion changes starts from that softmax layer's
projections (unrolled names, layer i's under "blocks/{i}/mixer/"):

  linear, performer, hedgehog,  q_proj, k_proj, v_proj, o_proj copied (biases too);
  hedgehog_window               grouped-query k, v repeated to every query head
                                (hedgehog_window's window is then the teacher's softmax
                                over it, exactly, beside the new linear part)
  taylor                        v_proj, o_proj copied; q_proj, k_proj the first
                                based_feature_dim dims of each head's q, k
  based                         window/* copied (its sliding window is the teacher's
                                softmax, exactly); linear/* as taylor, with its o_proj
                                zero, so the layer starts as the windowed softmax
  deltanet, gated_deltanet      q, k, v, o projections copied; the short convs start
                                as the identity (last tap 1) before their SiLU
  lightning                     qkv_proj = [q | k | v], out_proj = o

Every other parameter (embeddings, norms, MLPs, the head, layers kept as they are)
is the teacher's. Stage 1 trains the converted mixers' parameters that were not copied
(feature maps, gates, decays, convs, norms; for taylor and based also the truncated or
zeroed projections above); a mixer with none (linear's fixed maps) trains its q_proj and
k_proj. convert.stage1_params (name fragments) replaces that choice.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from models.config import ModelConfig, expand_layer_pattern

# ModelConfig keys the conversion config may set on the student (the rest is the
# teacher's): what a new mixer needs, and how it is computed.
STUDENT_KEYS = ("hedgehog_map", "feature_map", "feature_rope", "window", "based_feature_dim",
                "num_random_features", "performer_redraw_every", "performer_qk_norm",
                "short_conv", "conv_size", "impl", "chunk_size", "remat", "remat_policy",
                "dropout")
CONVERTIBLE = ("softmax", "sliding_window")


def student_config(teacher: ModelConfig, mixer: str, layers: str,
                   overrides: dict) -> tuple[ModelConfig, list[int]]:
    """(the student's ModelConfig, the indices of the layers it converts).

    layers: "all" (every softmax or sliding-window layer becomes `mixer`), or a layer
    pattern as model.layer_pattern writes it, where "mixer" is `mixer` and "keep" (or the
    teacher's own mixer name) keeps that layer, e.g. "mixer,mixer,keep" or
    "3*mixer,keep"."""
    from models.mixers import MIXERS
    if mixer not in MIXERS:
        raise ValueError(f"convert.mixer={mixer!r} is not a mixer; valid: "
                         f"{', '.join(sorted(MIXERS))}")
    old = teacher.layer_mixers()
    if layers in ("", "all"):
        new = [mixer if m in CONVERTIBLE else m for m in old]
    else:
        try:
            new = expand_layer_pattern(layers.replace("keep", "_keep_"), len(old), mixer)
        except ValueError as e:
            raise ValueError(f"convert.layers={layers!r}: {e}") from None
        new = [o if n == "_keep_" else n for n, o in zip(new, old)]
    converted = [i for i, (n, o) in enumerate(zip(new, old)) if n != o]
    if not converted:
        raise ValueError(f"convert.layers={layers!r} converts no layer of the teacher "
                         f"(its layers: {old})")
    bad = [i for i in converted if old[i] not in CONVERTIBLE]
    if bad:
        raise ValueError(f"layers {bad} of the teacher are {[old[i] for i in bad]}, not "
                         f"softmax attention: only softmax layers are converted")
    unknown = sorted(set(overrides) - set(STUDENT_KEYS))
    if unknown:
        raise ValueError(f"model keys {unknown} are the teacher's; the conversion sets "
                         f"only {', '.join(STUDENT_KEYS)}")
    cfg = dataclasses.replace(teacher, layer_pattern=",".join(new), softmax_every=0,
                              scan_layers=False, attention_dropout=0.0, **overrides)
    if new[0] == mixer and all(n == mixer for n in new):
        cfg = dataclasses.replace(cfg, mixer=mixer, layer_pattern="")
    return cfg, converted


def _heads(w, heads: int, d: int):
    return w.reshape(w.shape[:-1] + (heads, d))


def _expand_kv(w, cfg: ModelConfig):
    """A (.., KV * D) k or v projection with every kv head repeated to its query heads
    (query head h reads kv head h // (H / KV), as kernels.attention does)."""
    kv, d = cfg.resolved_kv_heads, cfg.resolved_head_dim
    rep = cfg.num_heads // kv
    return np.repeat(_heads(w, kv, d), rep, axis=-2).reshape(w.shape[:-1] + (-1,))


def _truncate(w, cfg: ModelConfig, dims: int):
    heads, d = cfg.num_heads, cfg.resolved_head_dim
    if dims > d:
        raise ValueError(f"based_feature_dim={dims} is wider than the teacher's head_dim "
                         f"{d}: its q, k cannot be taken from the teacher's")
    return np.ascontiguousarray(_heads(w, heads, d)[..., :dims]).reshape(
        w.shape[:-1] + (-1,))


def _projections(teacher: dict, prefix: str, cfg: ModelConfig, *, expand: bool) -> dict:
    """{"q": {"kernel": .., "bias": ..}, "k", "v", "o"} of the teacher's layer."""
    out = {}
    for p in "qkvo":
        parts = {}
        for leaf in ("kernel", "bias"):
            name = f"{prefix}{p}_proj/{leaf}"
            if name in teacher:
                w = teacher[name]
                parts[leaf] = _expand_kv(w, cfg) if expand and p in "kv" else w
        out[p] = parts
    return out


def mixer_copies(mixer: str, teacher: dict, i: int, tcfg: ModelConfig,
                 scfg: ModelConfig) -> tuple[dict, set]:
    """({student name: array} copied or derived from the teacher's layer i, the names of
    those derived arrays that stage 1 should still train)."""
    pre = f"blocks/{i}/mixer/"
    full = _projections(teacher, pre, tcfg, expand=True)
    out, train = {}, set()

    def put(dst, parts):
        for leaf, w in parts.items():
            out[f"{dst}/{leaf}"] = w

    if mixer in ("linear", "performer", "hedgehog", "hedgehog_window", "deltanet",
                 "gated_deltanet"):
        for p in "qkvo":
            put(f"{pre}{p}_proj", full[p])
    elif mixer in ("taylor", "based"):
        lin = pre if mixer == "taylor" else pre + "linear/"
        dims = scfg.based_feature_dim
        for p in "qk":
            put(f"{lin}{p}_proj", {k: _truncate(w, tcfg, dims) for k, w in full[p].items()})
            train.update(f"{lin}{p}_proj/{k}" for k in full[p])
        put(f"{lin}v_proj", full["v"])
        put(f"{lin}o_proj", full["o"])
        if mixer == "based":
            for p, parts in _projections(teacher, pre, tcfg, expand=False).items():
                put(f"{pre}window/{p}_proj", parts)
            out[f"{lin}o_proj/kernel"] = np.zeros_like(full["o"]["kernel"])
            if "bias" in full["o"]:
                out[f"{lin}o_proj/bias"] = np.zeros_like(full["o"]["bias"])
            train.update(k for k in out if k.startswith(lin))
    elif mixer == "lightning":
        for leaf in full["q"]:
            out[f"{pre}qkv_proj/{leaf}"] = np.concatenate(
                [full[p][leaf] for p in "qkv"], axis=-1)
        put(f"{pre}out_proj", full["o"])
    else:
        raise ValueError(f"convert.mixer={mixer!r}: conversion knows linear, performer, "
                         f"hedgehog, hedgehog_window, taylor, based, deltanet, "
                         f"gated_deltanet, lightning")
    return out, train


def _identity_conv(shape) -> np.ndarray:
    w = np.zeros(shape, np.float32)
    w[-1] = 1.0  # the tap reading x_t
    return w


def student_params(teacher: dict, tcfg: ModelConfig, student: dict, scfg: ModelConfig,
                   converted: list[int], stage1_params: str = "") -> tuple[dict, set]:
    """(the student's first parameters: `student` (its fresh init, unrolled names) with
    the teacher's copied in, the names stage 1 trains)."""
    out = dict(student)
    trainable = set()
    mixers = scfg.layer_mixers()
    in_converted = lambda name: any(name.startswith(f"blocks/{i}/mixer/") for i in converted)
    for i in converted:
        copies, extra = mixer_copies(mixers[i], teacher, i, tcfg, scfg)
        for name, w in copies.items():
            if name not in out:
                raise ValueError(f"internal: {name} is not a parameter of the student")
            if tuple(out[name].shape) != tuple(w.shape):
                raise ValueError(f"{name}: teacher's {w.shape} != student's "
                                 f"{out[name].shape}")
            out[name] = np.asarray(w, out[name].dtype)
        pre = f"blocks/{i}/mixer/"
        for name in out:
            if name.startswith(pre) and name.endswith("_conv/kernel"):
                out[name] = _identity_conv(out[name].shape)
        own = {n for n in out if n.startswith(pre)}
        new = (own - set(copies)) | extra
        if not new:  # fixed feature maps: learn the maps' inputs
            new = {n for n in own if n.startswith((pre + "q_proj/", pre + "k_proj/"))}
        trainable |= new
    for name in out:
        if not in_converted(name):
            if name not in teacher or tuple(teacher[name].shape) != tuple(out[name].shape):
                raise ValueError(f"internal: the student's {name} has no teacher copy")
            out[name] = np.asarray(teacher[name], out[name].dtype)
    if stage1_params:
        frags = [f.strip() for f in stage1_params.split(",") if f.strip()]
        trainable = {n for n in out if in_converted(n) and any(f in n for f in frags)}
        if not trainable:
            raise ValueError(f"convert.stage1_params={stage1_params!r} names no parameter "
                             f"of the converted layers")
    return out, trainable
