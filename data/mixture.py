"""A weighted mixture of datasets sharing one sequence length and one vocabulary.

Row r of batch `step` comes from the component picked by rng([seed, step, r]) with
probability proportional to its `weight`; the rows picked for a component are that
component's own `batch(step, n, split)`, so the whole batch is still a pure function of
(seed, step, split).

The vocabulary is laid out text (+ EOD) | NIAH specials | each MQAR task's ids. Text
components share one tokenizer (that of the first text component) and always carry an
EOD id; NIAH components share one set of special ids.

Components inherit the top-level keys they do not set (seq_len, tokenizer, files, ...),
except `vocab_size`, which at the top level belongs to the text tokenizer: give an MQAR
component its task vocabulary in the component itself.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from data import tokenizers as toks
from data.base import BATCH_KEYS, Dataset, cfg_get
from data.order import derive_seed, step_rng

TEXT_SOURCES = ("files", "hf", "tfds")
_NOT_INHERITED = ("source", "components", "weight", "loss_weight")


def component_configs(cfg: Mapping) -> list[tuple[str, dict, float]]:
    """(name, merged config, weight) per component; sub-configs inherit top-level keys."""
    comps = cfg_get(cfg, "components")
    if not comps:
        raise ValueError("source='mixture' needs data.components: a list of sub-configs "
                         "with a `weight` each, or a dict name -> sub-config")
    if hasattr(comps, "items"):
        named = [(str(k), v) for k, v in comps.items()]
    else:
        named = [(f"{cfg_get(c, 'source', 'files')}{i}", c) for i, c in enumerate(comps)]
    top = {k: v for k, v in cfg.items() if k not in _NOT_INHERITED and v is not None}
    out = []
    for name, sub in named:
        sub = {k: v for k, v in sub.items() if v is not None}
        if "source" not in sub:
            raise ValueError(f"mixture component {name!r} has no `source`")
        inherited = dict(top)
        if sub["source"] not in TEXT_SOURCES:
            # a top-level vocab_size sizes the text tokenizer (SentencePiece); a task's
            # own vocabulary is set in its component
            inherited.pop("vocab_size", None)
        merged = {**inherited, **sub}
        if merged["source"] == "mixture":
            raise ValueError(f"mixture component {name!r} is itself a mixture; flatten it")
        weight = float(sub.get("weight", 1.0))
        if not np.isfinite(weight) or weight < 0:
            raise ValueError(f"mixture component {name!r} has weight {weight}; use a number >= 0")
        loss_weight = float(sub.get("loss_weight", 1.0))
        if not np.isfinite(loss_weight) or loss_weight <= 0:
            raise ValueError(f"mixture component {name!r} has loss_weight {loss_weight}; use "
                             "a number > 0")
        merged["loss_weight"] = loss_weight
        out.append((name, merged, weight))
    lens = {m.get("seq_len") for _, m, _ in out}
    if len(lens) != 1:
        raise ValueError(f"mixture components must share seq_len; got "
                         f"{ {n: m.get('seq_len') for n, m, _ in out} }. Set data.seq_len "
                         "once at the top level")
    if sum(w for _, _, w in out) <= 0:
        raise ValueError("mixture weights sum to 0; give at least one positive weight")
    return out


class MixtureDataset(Dataset):
    def __init__(self, cfg: Mapping, *, seed: int):
        import data  # the top-level build, for the components

        self.seed = int(seed)
        specs = component_configs(cfg)
        self.names = [n for n, _, _ in specs]
        weights = np.array([w for _, _, w in specs], np.float64)
        # A component's loss_weight multiplies its loss mask: the loss is the mask-weighted
        # mean, so a task whose loss covers 5 answer tokens of 512 can count as much as a
        # row of text (whose mask covers every token).
        self.loss_weights = [m["loss_weight"] for _, m, _ in specs]
        self.weights = weights / weights.sum()
        self.components: dict[str, Dataset] = {}
        tok = None
        # Text first, so task ids land after the text vocabulary; then NIAH (its haystack
        # is text); MQAR last. Without text, NIAH builds the text tokenizer itself and
        # MQAR alone starts from an empty vocabulary (ids as in a plain MQAR run).
        rank = {**{s: 0 for s in TEXT_SOURCES}, "niah": 1, "mqar": 2}
        order = sorted(range(len(specs)), key=lambda i: rank.get(specs[i][1]["source"], 3))
        for i in order:
            name, sub, _ = specs[i]
            if sub["source"] in TEXT_SOURCES:
                sub = {**sub, "eod": True}
            elif tok is None and sub["source"] == "mqar":
                tok = toks.WithSpecials(toks.IntegerTokenizer(0))
            ds = data.build(sub, seed=derive_seed(self.seed, i), tokenizer=tok)
            self.components[name] = ds
            tok = ds.tokenizer
        self.tokenizer = tok
        self.seq_len = next(iter(self.components.values())).seq_len
        for name, ds in self.components.items():
            if ds.vocab_size > self.vocab_size:
                raise AssertionError(f"component {name} exceeds the mixture vocabulary")

    @property
    def packed(self) -> bool:
        """Each row comes from one component: packed if any component's rows are."""
        return any(ds.packed for ds in self.components.values())

    @property
    def targets_per_row(self) -> int | None:
        """Each row comes from one component: the largest bound, None if one has none."""
        bounds = [ds.targets_per_row for ds in self.components.values()]
        return None if None in bounds else max(bounds)

    def choose(self, step: int, batch_size: int, split: str) -> np.ndarray:
        """The component index of each row: rng([seed, step, row]) per row."""
        cdf = np.cumsum(self.weights)
        u = np.array([step_rng(self.seed, step, split, r).random() for r in range(batch_size)])
        return np.minimum(np.searchsorted(cdf, u, side="right"), len(cdf) - 1)

    def _batch(self, step: int, batch_size: int, split: str) -> dict:
        return self._batch_rows(step, batch_size, np.arange(batch_size), split)

    def _batch_rows(self, step: int, batch_size: int, wanted: np.ndarray, split: str) -> dict:
        """Rows `wanted` of the batch: each component is asked only for the rows of its
        own batch (of all the rows it was picked for) that land in `wanted`."""
        if not len(wanted):  # no component to take the fields' shapes from
            return super()._batch_rows(step, batch_size, wanted, split)
        which = self.choose(step, batch_size, split)
        out = {k: None for k in BATCH_KEYS}
        n_out = len(wanted)
        for c, name in enumerate(self.names):
            picked = np.nonzero(which == c)[0]      # batch rows from this component
            mine = np.nonzero(which[wanted] == c)[0]  # where they go in the output
            if not len(mine):
                continue
            own = np.searchsorted(picked, wanted[mine])  # their rows in its own batch
            sub = self.components[name].batch_rows(step, len(picked), own, split)
            if self.loss_weights[c] != 1.0:
                sub = {**sub, "mask": sub["mask"] * np.float32(self.loss_weights[c])}
            for k in BATCH_KEYS:
                if out[k] is None:
                    out[k] = np.zeros((n_out,) + sub[k].shape[1:], sub[k].dtype)
                out[k][mine] = sub[k]
        return out
