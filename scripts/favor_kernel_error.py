"""FAVOR+'s kernel estimate exp(q . k / sqrt(d)) under three treatments of the exponent,
on random q, k (entries of std `--stds`), m random features, causal pairs s <= t:

  pure      the estimator itself in float64, no shift, no eps (what the others should be);
  constant  keys shifted by one constant max_j |w_j|^2 / 2 (the bound of the exponent),
            float32 features + eps 1e-4, shifts added back (the reverted attempt);
  running   this repository's Performer: queries by their own max, keys by the running
            max over the prefix (models.feature_maps.running_max_features), float32
            features + eps 1e-6, shifts added back.

Prints the median and 99th percentile of |estimate - exp(q.k/sqrt d)| / exp(q.k/sqrt d)
per (head dim, std) and writes them as JSON (--out).

  python scripts/favor_kernel_error.py --out favor_kernel_error.json
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from models import feature_maps as fm  # noqa: E402


def relative_errors(d, std, m, t, seed):
    kq, kk, ko = jax.random.split(jax.random.key(seed), 3)
    q, k = (std * jax.random.normal(key, (t, d)) for key in (kq, kk))
    omega = fm.gaussian_projection(ko, m, d)
    lq = np.asarray(fm.favor_logits(q, omega, scale=d ** -0.25), np.float64)
    lk = np.asarray(fm.favor_logits(k, omega, scale=d ** -0.25), np.float64)
    truth = np.exp(np.asarray(q, np.float64) @ np.asarray(k, np.float64).T / math.sqrt(d))
    causal = np.tril(np.ones((t, t), bool))
    mq = lq.max(-1, keepdims=True)

    def f32_exp(x, eps):  # a float32 feature, as the model makes it
        return (np.exp(x.astype(np.float32)) + np.float32(eps)).astype(np.float64)

    shift = 0.5 * float(np.max(np.sum(np.asarray(omega, np.float64) ** 2, -1)))
    c = np.maximum.accumulate(lk.max(-1))
    estimates = {
        "pure": np.exp(lq) @ np.exp(lk).T / m,
        "constant": (f32_exp(lq - mq, 1e-4) @ f32_exp(lk - shift, 1e-4).T / m
                     * np.exp(mq + shift)),
        "running": (f32_exp(lq - mq, 1e-6) @ f32_exp(lk - c[:, None], 1e-6).T / m
                    * np.exp(mq + c[None, :])),
    }
    return {name: (np.abs(est - truth) / truth)[causal] for name, est in estimates.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--stds", type=float, nargs="+", default=[0.25, 1.0])
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    rows = []
    print(f"{'d':>4} {'std':>5}  " + "  ".join(f"{n + ' median, p99':>22}"
                                               for n in ("pure", "constant", "running")))
    for d in args.dims:
        for std in args.stds:
            errs = [relative_errors(d, std, args.features, args.tokens, s)
                    for s in range(args.seeds)]
            row = {"head_dim": d, "std": std}
            for name in ("pure", "constant", "running"):
                e = np.concatenate([x[name] for x in errs])
                row[name] = {"median": float(np.median(e)), "p99": float(np.quantile(e, 0.99))}
            rows.append(row)
            print(f"{d:>4} {std:>5}  " + "  ".join(
                f"{row[n]['median']:>10.3g} {row[n]['p99']:>11.3g}"
                for n in ("pure", "constant", "running")))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
