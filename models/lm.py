"""LanguageModel: embed -> pre-norm blocks (mixer + optional SwiGLU MLP) -> norm -> head.

Layer i's mixer is cfg.mixer, or softmax on the hybrid's S layers (ModelConfig.
layer_mixers). With cfg.scan_layers the repeating group of layers is held stacked and run
under one lax.scan (models.layer_stack); otherwise the blocks are a list, unrolled.
Decoding: `init_cache`, then `prefill` of a prompt and/or `decode_step` per token; a
cache is {"pos": int32 scalar, "layers": [one mixer state per layer]} in both layouts.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models import flops, layer_stack
from models.config import ModelConfig
from models.layers import block_norm, dense, dtypes, make_mlp, meta, segment_positions
from models.mixers import get_mixer


class Block(nnx.Module):
    """x + mixer(norm(x)), then x + mlp(norm(x)); dropout on each residual branch."""

    def __init__(self, cfg: ModelConfig, mixer: str, *, rngs: nnx.Rngs):
        self.mixer_norm = block_norm(cfg, cfg.d_model, rngs=rngs)
        self.mixer = get_mixer(mixer)(cfg, rngs=rngs)
        self.mlp_norm = block_norm(cfg, cfg.d_model, rngs=rngs) if cfg.mlp else None
        self.mlp = make_mlp(cfg, rngs=rngs) if cfg.mlp else None
        self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)

    # The residual stream x stays float32; branches compute in cfg.dtype. (Adding O(1)
    # bf16 branch outputs to a bf16 stream would round away small contributions such as
    # the 0.02-scale embeddings.)
    def _mlp(self, x, deterministic: bool):
        if self.mlp is None:
            return x
        h = self.dropout(self.mlp(self.mlp_norm(x)), deterministic=deterministic)
        return x + h.astype(x.dtype)

    def __call__(self, x, *, segment_ids=None, deterministic: bool = True):
        extra = {"deterministic": deterministic} if self.mixer.takes_deterministic else {}
        h = self.mixer(self.mixer_norm(x), segment_ids=segment_ids, **extra)
        x = x + self.dropout(h, deterministic=deterministic).astype(x.dtype)
        return self._mlp(x, deterministic)

    def prefill(self, x, state):
        h, state = self.mixer.prefill(self.mixer_norm(x), state)
        return self._mlp(x + h.astype(x.dtype), True), state

    def step(self, x_t, state):
        h, state = self.mixer.step(self.mixer_norm(x_t), state)
        return self._mlp(x_t + h.astype(x_t.dtype), True), state


def checkpoint_policy(name: str):
    """The jax.checkpoint policy of a ModelConfig.remat_policy other than "none".
    "save_dots" keeps matmuls without batch dimensions (the projections and the MLP,
    whose weights have none) and recomputes the elementwise work and the attention /
    chunk einsums, whose (B, H, ...) outputs are the memory remat exists to save."""
    return {"full": None,
            "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
            "save_all_dots": jax.checkpoint_policies.dots_saveable}[name]


def _remat_block(block: Block, x, segment_ids, deterministic: bool, policy: str):
    """block(x) under jax.checkpoint: the backward pass recomputes the block's inside
    (all of it, or what `policy` does not save) instead of storing it. Written
    functionally (split, checkpoint a pure function, write back the state) so the
    dropout RNG counters advance exactly as without remat."""
    graphdef, state = nnx.split(block)

    def run(state, x, segment_ids):
        blk = nnx.merge(graphdef, state)
        y = blk(x, segment_ids=segment_ids, deterministic=deterministic)
        return y, nnx.state(blk)

    y, new_state = jax.checkpoint(run, policy=checkpoint_policy(policy))(
        state, x, segment_ids)
    nnx.update(block, new_state)
    return y


def _stack_modules(modules: list[nnx.Module]) -> nnx.Module:
    """One module whose every array is the modules' arrays stacked on a new leading axis
    (the logical axis layer_stack.LAYER_AXIS). The modules must share a structure (the
    same mixer); their values are kept exactly, so a stacked model holds the parameters,
    buffers and RNG streams an unrolled model of the same seed holds."""
    graphdef, *_ = nnx.split(modules[0])
    states = [nnx.split(m)[1] for m in modules]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
    module = nnx.merge(graphdef, stacked)
    for _, var in nnx.to_flat_state(nnx.state(module, nnx.Param)):
        for key in ("out_sharding", "sharding_names", "sharding"):
            names = var.get_metadata().get(key)
            if names:
                var.set_metadata(key, (layer_stack.LAYER_AXIS,) + tuple(names))
    return module


def _unstack_module(module: nnx.Module, repeat: int) -> nnx.Module:
    """A copy of one repeat of a stacked module (for decoding, layer by layer)."""
    graphdef, state = nnx.split(module)
    return nnx.merge(graphdef, jax.tree.map(lambda a: a[repeat], state))


class LanguageModel(nnx.Module):

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dtype, param_dtype = dtypes(cfg)
        self.embed = nnx.Embed(
            cfg.vocab_size, cfg.d_model, dtype=dtype, param_dtype=param_dtype,
            embedding_init=nnx.initializers.normal(cfg.init_std),
            embedding_metadata=meta("vocab", "embed"), rngs=rngs)
        # GPT-2's learned positions (cfg.positions "learned"); built only then, so other
        # models keep their parameters as before.
        self.pos_embed = (nnx.Embed(
            cfg.num_positions, cfg.d_model, dtype=dtype, param_dtype=param_dtype,
            embedding_init=nnx.initializers.normal(cfg.init_std),
            embedding_metadata=meta(None, "embed"), rngs=rngs)
            if cfg.positions == "learned" else None)
        # Built layer by layer in both layouts (the same RNG draws), then stacked by group
        # position when scanning: scanned and unrolled models of one seed hold the same
        # values, and layer_stack.convert maps one's parameters exactly onto the other's.
        blocks = [Block(cfg, name, rngs=rngs) for name in cfg.layer_mixers()]
        self.scan = layer_stack.scan_shape(cfg.layer_mixers(), cfg.scan_layers)
        if self.scan is None:
            self.blocks = nnx.List(blocks)
        else:
            period, _ = self.scan
            self.scan_blocks = nnx.List(
                [_stack_modules(blocks[j::period]) for j in range(period)])
        self.final_norm = block_norm(cfg, cfg.d_model, rngs=rngs)
        self.head = (None if cfg.tie_embeddings else
                     dense(cfg, cfg.d_model, cfg.vocab_size, ("embed", "vocab"), rngs=rngs))
        self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)

    def layer_mixers(self) -> list[str]:
        return self.cfg.layer_mixers()

    def layers(self) -> list[Block]:
        """Every layer's Block in order; a scanned model's are copies sliced from the
        stack (read them, e.g. to decode; changing them leaves the model unchanged)."""
        if self.scan is None:
            return list(self.blocks)
        period, repeats = self.scan
        return [_unstack_module(self.scan_blocks[i % period], i // period)
                for i in range(period * repeats)]

    def _embed(self, tokens, positions=None):
        """Token embeddings (float32), plus the learned position embeddings of
        `positions` ((B|1, T), or (B,) / a scalar for one token) when cfg.positions is
        "learned" (positions past the table read its last row)."""
        x = self._token_embed(tokens)
        if self.pos_embed is None:
            return x
        if positions is None:
            positions = segment_positions(None, tokens.shape[-1])
        table = self.pos_embed.embedding[...]
        return x + jnp.take(table, positions, axis=0, mode="clip").astype(jnp.float32)

    def _token_embed(self, tokens):
        # Gathered from the float32 table straight into the float32 residual stream. (Through
        # nnx.Embed in the bf16 compute dtype the gradient is a bf16 scatter-add: thousands of
        # updates to one row - MQAR's filler token, a space - lose their precision, and on
        # GPU they contend for 16-bit atomics; float32 adds are exact-er and native.)
        table = self.embed.embedding[...]
        return jnp.take(table, tokens, axis=0).astype(jnp.float32)

    def logits(self, x):
        """Logits (..., V) float32 of residual-stream vectors x (..., d): the final norm
        and the head (the embedding's transpose when tied)."""
        x = self.final_norm(x)
        if self.head is None:
            w = self.embed.embedding[...]
            return jnp.einsum("...d,vd->...v", x, w.astype(x.dtype),
                              preferred_element_type=jnp.float32)
        return self.head(x).astype(jnp.float32)

    def __call__(self, tokens, *, segment_ids=None, deterministic: bool = True):
        """tokens (B, T) int -> logits (B, T, V) float32. segment_ids (B, T) keeps packed
        documents apart."""
        return self.logits(self.hidden(tokens, segment_ids=segment_ids,
                                       deterministic=deterministic))

    def hidden(self, tokens, *, segment_ids=None, deterministic: bool = True):
        """The residual stream after the last block, (B, T, d): `logits` of it are the
        model's output (a loss can form them a few tokens at a time)."""
        positions = (None if self.pos_embed is None
                     else segment_positions(segment_ids, tokens.shape[1]))
        x = self.dropout(self._embed(tokens, positions), deterministic=deterministic)
        policy = self.cfg.resolved_remat_policy
        if self.scan is not None:
            x = self._scanned(x, segment_ids, deterministic, policy)
        else:
            for block in self.blocks:
                if policy != "none":
                    x = _remat_block(block, x, segment_ids, deterministic, policy)
                else:
                    x = block(x, segment_ids=segment_ids, deterministic=deterministic)
        return x

    def _scanned(self, x, segment_ids, deterministic: bool, policy: str):
        """The groups under one lax.scan over the stacked state: step r runs layers
        r*period .. r*period+period-1, on their slices of the parameters and of the RNG
        streams (each layer keeps its own dropout stream, as unrolled). Remat applies to
        each step's group; the updated RNG counters are written back, as unrolled."""
        graphdef, state = nnx.split(self.scan_blocks)

        def group(x, layer_state):
            blocks = nnx.merge(graphdef, layer_state)
            for block in blocks:
                x = block(x, segment_ids=segment_ids, deterministic=deterministic)
            return x, nnx.state(blocks)

        if policy != "none":
            # prevent_cse=False: inside a scan XLA cannot merge the recomputation with
            # the forward pass, so the guard jax.checkpoint adds by default only costs.
            group = jax.checkpoint(group, policy=checkpoint_policy(policy),
                                   prevent_cse=False)
        x, state = jax.lax.scan(group, x, state)
        nnx.update(self.scan_blocks, state)
        return x

    # --- decoding ---------------------------------------------------------------------
    def init_cache(self, batch: int, max_len: int | None = None):
        max_len = max_len or self.cfg.max_len
        return {"pos": jnp.zeros((), jnp.int32),
                "layers": [b.mixer.init_state(batch, max_len) for b in self.layers()]}

    def prefill(self, tokens, cache):
        """Run a prompt (B, T) from a fresh cache: (logits (B, T, V), cache at pos T)."""
        x = self._embed(tokens)
        states = []
        for block, state in zip(self.layers(), cache["layers"]):
            x, state = block.prefill(x, state)
            states.append(state)
        pos = cache["pos"] + tokens.shape[1]
        return self.logits(x), {"pos": pos, "layers": states}

    def decode_step(self, token, cache):
        """One token per sequence (B,) -> (logits (B, V), cache one position on)."""
        x = self._embed(token, cache["pos"])
        states = []
        for block, state in zip(self.layers(), cache["layers"]):
            x, state = block.step(x, state)
            states.append(state)
        return self.logits(x), {"pos": cache["pos"] + 1, "layers": states}

    def state_size(self, seq_len: int = 1) -> int:
        """Numbers held per sequence while decoding after seq_len tokens, over all layers:
        fixed states for linear mixers, plus seq_len x per-token cache for softmax."""
        total = 0
        for block in self.layers():
            n = block.mixer.state_size()
            total += n * seq_len if block.mixer.state_grows else n
        return total

    def flops_per_token(self, seq_len: int) -> float:
        """Forward FLOPs per token at context seq_len (models.flops): 2 per parameter
        plus each layer's own mixer count, so a hybrid's softmax layers cost what softmax
        does."""
        num_params = sum(p.size for p in jax.tree.leaves(nnx.state(self, nnx.Param)))
        return flops.forward_flops_per_token(self.cfg, num_params, seq_len)
