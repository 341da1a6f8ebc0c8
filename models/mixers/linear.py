"""Linear attention with a feature map: `linear` (elu+1 / relu / identity / dpfp),
`performer` (FAVOR+), `hedgehog` (learned maps). All are FeatureMapAttention: each gives
its map phi and its feature count F; the exponential maps (FAVOR+, Hedgehog's exp form)
make their features inside the op call with a causal running-max stabiliser."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from kernels import context_parallel
from kernels.common import run_ids, visible_keys
from models import feature_maps as fm
from models.auxiliary import sow_auxiliary_loss
from models.config import ModelConfig
from models.layers import Buffer, meta, dtypes
from models.mixers.feature_attention import FeatureMapAttention
from models.mixers.registry import HEDGEHOG, LINEAR, PERFORMER, register


@register(LINEAR)
class LinearAttention(FeatureMapAttention):
    """Katharopoulos et al. (2020) with phi = cfg.feature_map (elu, relu, identity, dpfp).

    elu+1, relu and DPFP (Schlag et al. 2021, nu = 1: 2 d sparse features) are normalised
    by the usual denominator. identity has negative
    features, so a denominator could cross zero (seed 000's warning): it runs without one
    and normalises the output per head with an RMSNorm instead (TransNormer, RetNet).
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        self.phi = fm.dpfp if cfg.feature_map == "dpfp" else fm.SIMPLE_MAPS[cfg.feature_map]
        self.normalize = cfg.feature_map != "identity"
        if not self.normalize:
            dtype, param_dtype = dtypes(cfg)
            self.o_norm = nnx.RMSNorm(self.head_dim, epsilon=cfg.norm_eps, dtype=dtype,
                                      param_dtype=param_dtype, scale_metadata=meta("norm"),
                                      rngs=rngs)

    @classmethod
    def has_attention_weights(cls, cfg: ModelConfig) -> bool:
        return cfg.feature_map != "identity"  # identity is left unnormalised

    @classmethod
    def feature_dim(cls, cfg: ModelConfig) -> int:
        d = cfg.resolved_head_dim
        return 2 * d if cfg.feature_map == "dpfp" else d

    def _phi(self, x, *, query: bool):
        return self.phi(x)

    def _output(self, o, x, inputs):
        if not self.normalize:
            o = self.o_norm(o)
        return super()._output(o, x, inputs)


class _StabilisedExpAttention(FeatureMapAttention):
    """Normalised linear attention with exponential features exp(l), l from
    `_log_features`, made inside the op call in float32 (never cast to the compute dtype
    first: a bfloat16 exponent near -100 is off by 0.5). Queries subtract their own max
    over features; keys a running max over the causal prefix (running_max_features),
    carried in the decode state as c (B, H) beside S and z, and applied as a per-token
    log decay c_{t-1} - c_t of the linear-attention state: every form of
    kernels.ops.linear_attention (parallel, recurrent, chunk; Pallas, which takes a
    (B, T, H) log decay too, for 16-bit inputs only, so these float32 features take the
    chunk form under impl="auto") gives the same exact, causal result, and no exponent
    exceeds 0 whatever the head dim and input scale. _phi passes q and k through.

    The limit of one shift per head: a query whose largest features meet only keys far
    below the prefix's largest (the maximum set by another key, on other features) gets
    a normaliser that can fall under float32's range; FAVOR+'s feature eps then floors it
    (as google-research's does), the eps-free exp form reads a shrunken output. A
    per-feature running max would remove that, but needs a per-feature (GLA-style)
    decay, which kernels.ops.linear_attention does not take."""

    feature_eps = 0.0  # added to every feature after the shift
    # kernels.ops.linear_attention's eps, o = num / (den + eps). The shifts make den as
    # small as exp(-(the query's and keys' distance from their own maxima)), 1e-13 and
    # less at large inputs where the true output is still v-sized, so a fixed 1e-6
    # would swamp it (token 0's output v_0 read as ~1e-7 v_0). 1e-18 keeps den + eps and
    # its square (the gradient's) normal float32 numbers, so a den that underflows to 0
    # gives o = 0 and finite gradients, not NaN.
    denominator_eps = 1e-18

    def _log_features(self, x, *, query: bool, omega):
        raise NotImplementedError

    def _ratio(self) -> float:
        return 1.0

    def _phi(self, x, *, query: bool):
        return x

    def _weight_features(self, inputs, run):
        # the op's own features: queries shifted by their own max, keys by the running
        # max of their document's prefix, whose log decay keeps every key exact
        lq = self._log_features(inputs["q"], query=True, omega=inputs.get("omega"))
        lk = self._log_features(inputs["k"], query=False, omega=inputs.get("omega"))
        phi_q = fm.per_token_max_features(lq, eps=self.feature_eps)
        c0 = jnp.full((lk.shape[0], self.num_heads), -jnp.inf, jnp.float32)
        phi_k, log_decay, _ = fm.running_max_features(lk, run, c0, eps=self.feature_eps)
        return phi_q, phi_k, log_decay

    def _op_state(self, batch: int):
        s, z = super()._op_state(batch)
        return s, z, jnp.full((batch, self.num_heads), -jnp.inf, jnp.float32)

    def _op(self, inputs, *, segment_ids, initial_state, return_state, impl):
        b, t = inputs["v"].shape[:2]
        omega = inputs.get("omega")
        lq = self._log_features(inputs["q"], query=True, omega=omega)
        lk = self._log_features(inputs["k"], query=False, omega=omega)
        if initial_state is None:
            c0 = jnp.full((b, self.num_heads), -jnp.inf, jnp.float32)
        else:
            s0, z0, c0 = initial_state
            initial_state = (s0, z0)
        ratio = self._ratio()
        q = ratio * fm.per_token_max_features(lq, eps=self.feature_eps)
        run = None if segment_ids is None else run_ids(segment_ids, b, t)
        k, log_decay, c = fm.running_max_features(lk, run, c0, eps=self.feature_eps)
        res = context_parallel.linear_attention(
            q, ratio * k, inputs["v"], normalize=True, eps=self.denominator_eps,
            log_decay=log_decay, segment_ids=segment_ids, initial_state=initial_state,
            return_state=return_state, impl=impl, chunk_size=self.cfg.chunk_size)
        if not return_state:
            return res.astype(inputs["v"].dtype)
        o, (s, z) = res
        return o.astype(inputs["v"].dtype), (s, z, c)


@register(PERFORMER)
class Performer(_StabilisedExpAttention):
    """FAVOR+ (Choromanski et al. 2020; google-research performer/fast_attention/jax):
    m positive orthogonal random features (1/sqrt(m)) (exp(omega . x' - |x'|^2/2) + eps)
    of x' = q, k / d^(1/4), normalised, causal, stabilised as _StabilisedExpAttention
    says. eps = 1e-6 as make_fast_softmax_attention passes (its numerical_stabilizer;
    the feature creator's own default 1e-4 is overridden there). google-research
    shifts queries by max_f omega . x' and keys by one max over all tokens and features
    (a future key moves it); ours shifts by the max of the whole exponent, per query
    token and over each key's causal prefix: the same estimator, never overflowing.

    Features: omega is drawn at init from the params stream and kept as a Buffer, which
    evaluation, prefill and decode use; while training (deterministic=False) with
    cfg.performer_redraw_every = N >= 1 a fresh omega is drawn every call from the
    layer's own RNG stream (`feature_rngs`), which training re-keys every step from
    (seed, step // N) (training.model_state.rekey's feature_key), so the draw changes
    every N steps and a resumed run draws the same features.

    cfg.performer_qk_norm: q, k L2-normalised per head and scaled by sqrt(tau), tau a
    learned per-head temperature (log_temperature, init log sqrt(d): the scale of
    q . k / sqrt(d) for unit-variance entries), so the kernel is exp(tau q^.k^)."""

    # Every feature >= eps / sqrt(m) and the prefix's largest key at 1 / sqrt(m): the
    # normaliser is >= eps / m (4e-9 at m = 256), far above denominator_eps.
    feature_eps = 1e-6

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        self.omega = Buffer(fm.gaussian_projection(
            rngs.params(), cfg.num_random_features, self.head_dim, orthogonal=True))
        self.qk_norm = cfg.performer_qk_norm
        if self.qk_norm:
            self.log_temperature = nnx.Param(
                jnp.full((self.num_heads,), 0.5 * math.log(self.head_dim), jnp.float32),
                sharding_names=("heads",), eager_sharding=False)
        # Built only when redrawing, so a fixed-feature model keeps its state as before.
        self.redraw = cfg.performer_redraw_every >= 1
        if self.redraw:
            self.feature_rngs = rngs["features"].fork()

    takes_deterministic = True  # redraw while training only

    @classmethod
    def feature_dim(cls, cfg: ModelConfig) -> int:
        return cfg.num_random_features

    def _ratio(self) -> float:
        return self.cfg.num_random_features ** -0.5

    def _omega(self, deterministic: bool):
        if self.redraw and not deterministic:
            return fm.gaussian_projection(self.feature_rngs(), self.cfg.num_random_features,
                                          self.head_dim, orthogonal=True)
        return self.omega[...]

    def __call__(self, x, *, segment_ids=None, deterministic: bool = True):
        inputs, _ = self._inputs(x, segment_ids=segment_ids, conv_state=None)
        inputs["omega"] = self._omega(deterministic)
        o = self._op(inputs, segment_ids=segment_ids, initial_state=None,
                     return_state=False, impl=self.cfg.impl)
        return self._output(o, x, inputs)

    def _log_features(self, x, *, query: bool, omega):
        omega = self.omega[...] if omega is None else omega
        if not self.qk_norm:
            return fm.favor_logits(x, omega, scale=self.head_dim ** -0.25)
        x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
        x = x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + self.cfg.norm_eps)
        x = x * jnp.exp(0.5 * self.log_temperature[...].astype(x.dtype))[:, None]
        return fm.favor_logits(x, omega)


@register(HEDGEHOG)
class Hedgehog(_StabilisedExpAttention):
    """Hedgehog (Zhang et al. 2024): separate learned maps for queries and keys
    (feature_map_q, feature_map_k; fla's LinearAttention default tie_feature_map_qk=False),
    each W x + b per head at the identity, 2 d features, normalised (fla's
    do_feature_map_norm). cfg.hedgehog_map "softmax": fla's softmax([2a, -2a]) (bounded,
    made by _phi as for any feature map); "exp": the paper's [exp(a), exp(-a)], made
    inside the op with the running-max stabiliser (no feature eps; the paper has none).
    The map weights are never weight-decayed (training.optim.NO_DECAY_MODULES).

    cfg.hedgehog_distill > 0 trains the maps as the paper does, by attention
    distillation: while training, each layer adds that weight times distillation_loss,
    its attention weights' cross-entropy against the softmax attention of its own q and
    k, to the loss (models.auxiliary). Without it the maps learn from the next-token loss
    alone.

    Checkpoints from before the maps were split (one shared `feature_map/kernel`, a
    softmax over each half separately, no bias) do not load: the loader names the missing
    `feature_map_q/kernel` and the rest."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        param_dtype = dtypes(cfg)[1]
        self.map_form = cfg.hedgehog_map
        if self.map_form == "softmax":  # bounded features: the plain op's eps (fla's)
            self.denominator_eps = FeatureMapAttention.denominator_eps
        self.feature_map_q = fm.HedgehogFeatureMap(self.num_heads, self.head_dim,
                                                   param_dtype=param_dtype)
        self.feature_map_k = fm.HedgehogFeatureMap(self.num_heads, self.head_dim,
                                                   param_dtype=param_dtype)

    @classmethod
    def feature_dim(cls, cfg: ModelConfig) -> int:
        return 2 * cfg.resolved_head_dim

    def _map(self, query: bool):
        return self.feature_map_q if query else self.feature_map_k

    takes_deterministic = True  # the distillation loss is added while training only

    def __call__(self, x, *, segment_ids=None, deterministic: bool = True):
        pre, _ = self._projections(x, segment_ids=segment_ids, conv_state=None)
        inputs = self._mapped(pre)
        o = self._op(inputs, segment_ids=segment_ids, initial_state=None,
                     return_state=False, impl=self.cfg.impl)
        if self.cfg.hedgehog_distill and not deterministic:
            loss = self.distillation_loss(pre["q"], pre["k"], segment_ids)
            sow_auxiliary_loss(self, self.cfg.hedgehog_distill * loss)
        return self._output(o, x, inputs)

    def log_features(self, x, *, query: bool):
        """log phi(x), (..., H, 2 D) float32: log_softmax([2a, -2a]) for the softmax
        map, [a, -a] for the exp map."""
        a = self._map(query).log_features(x)
        return jax.nn.log_softmax(2.0 * a, axis=-1) if self.map_form == "softmax" else a

    def distillation_loss(self, q, k, segment_ids=None):
        """Hedgehog's attention distillation (Zhang et al. 2024): the cross-entropy
        -sum_s A_ts log B_ts, mean over batch, heads and query tokens, between

          A = softmax(q k^T / sqrt(D)) of q, k (B, T, H, D) as they enter the maps
              (causal, within each document; held out of the gradient: the target), and
          B_ts = phi(q_t) . phi(k_s) / sum_s' phi(q_t) . phi(k_s'), the weights this
              layer's normalised linear attention applies.

        In log space, so no feature's underflow gives log 0: log phi(q_t) . phi(k_s) =
        m_t + m_s + log sum_f exp(lq_tf - m_t) exp(lk_sf - m_s), m the max over
        features; a shifted sum below 1e-30 (the two maps' peaks on different features)
        counts as 1e-30."""
        b, t = q.shape[:2]
        visible = visible_keys(t, run_ids(segment_ids, b, t))            # (B|1, 1, T, S)
        q32, k32 = q.astype(jnp.float32), k.astype(jnp.float32)
        scores = jnp.einsum("bthd,bshd->bhts", q32, k32, precision=jax.lax.Precision.HIGHEST)
        target = jax.lax.stop_gradient(jax.nn.softmax(
            jnp.where(visible, scores * q.shape[-1] ** -0.5, -jnp.inf), axis=-1))
        lq, lk = self.log_features(q32, query=True), self.log_features(k32, query=False)
        mq = jnp.max(lq, axis=-1, keepdims=True)
        mk = jnp.max(lk, axis=-1, keepdims=True)
        shifted = jnp.einsum("bthf,bshf->bhts", jnp.exp(lq - mq), jnp.exp(lk - mk),
                             precision=jax.lax.Precision.HIGHEST)
        log_dot = (jnp.log(jnp.maximum(shifted, 1e-30))
                   + jnp.moveaxis(mq[..., 0], 1, 2)[..., None]        # (B, H, T, 1)
                   + jnp.moveaxis(mk[..., 0], 1, 2)[:, :, None, :])   # (B, H, 1, S)
        log_norm = jax.nn.logsumexp(jnp.where(visible, log_dot, -jnp.inf), axis=-1)
        read = jnp.sum(target * jnp.where(visible, log_dot, 0.0), axis=-1)
        return jnp.mean(log_norm - read)

    def _phi(self, x, *, query: bool):
        return self._map(query)(x) if self.map_form == "softmax" else x

    def _log_features(self, x, *, query: bool, omega):
        return self._map(query).log_features(x)

    def _op_state(self, batch: int):
        if self.map_form == "softmax":
            return FeatureMapAttention._op_state(self, batch)
        return super()._op_state(batch)

    def _weight_features(self, inputs, run):
        if self.map_form == "softmax":
            return FeatureMapAttention._weight_features(self, inputs, run)
        return super()._weight_features(inputs, run)

    def _op(self, inputs, **kwargs):
        if self.map_form == "softmax":
            return FeatureMapAttention._op(self, inputs, **kwargs)
        return super()._op(inputs, **kwargs)
