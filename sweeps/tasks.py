"""What one run of each task records: a trained run's metrics (lm, mqar, niah) through
eval/, or a mixer's throughput (speed) through eval.speed.

A record holds `metrics` plus the model's `params`, `state_size`, `d_model`, `layers`
and the training `step` it was measured at; the runner adds the run's grid fields.
"""
from __future__ import annotations

import json
import pathlib
from typing import Any, Mapping

from data.base import cfg_get
from sweeps import grid

# The speed task's train.py config when the sweep config names none: the defaults every
# experiment config starts from.
SPEED_BASE_CONFIG = "configs/base.py"
# Its text when the config names none: the repository's own Markdown as bytes, which
# every checkout has (token values do not change a step's time). Without an
# end-of-document id the vocabulary stays the byte tokenizer's 256.
SPEED_TEXT = "docs/*.md"


def read_train_log(run_dir: str) -> dict[str, Any]:
    """Loss curve, best validation loss and training tokens/s from train.py's metrics file.

    Reads `metrics.jsonl` (one JSON object per logged step); keys are matched leniently
    (eval_loss / val_loss, tokens_per_s / tokens_per_sec) since only their meaning is
    fixed. Missing file -> empty dict.
    """
    path = pathlib.Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return {}
    curve, tps = [], []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        step = row.get("step")
        for key in ("eval_loss", "val_loss", "eval/loss", "val/loss"):
            if key in row and step is not None:
                curve.append((int(step), float(row[key])))
                break
        for key in ("tokens_per_s", "tokens_per_sec", "train/tokens_per_s", "throughput"):
            if key in row:
                tps.append(float(row[key]))
                break
    out: dict[str, Any] = {}
    if curve:
        curve = sorted(dict(curve).items())
        out["curve"] = curve
        out["best_val_loss"] = min(v for _, v in curve)
    if tps:
        tail = tps[len(tps) // 2:] or tps  # steady state: drop the compile-heavy start
        out["tokens_per_s"] = sorted(tail)[len(tail) // 2]
    return out


def evaluate_run(task: str, run_dir: str, ecfg: Mapping[str, Any]) -> dict[str, Any]:
    """Loads a trained run and measures the task's metrics; also the model's sizes."""
    from flax import nnx

    from eval import common, perplexity, recall
    from training import model_state

    model, config, dataset, step = common.load_run(run_dir)
    stats_fn = common.token_stats_fn(common.make_logits_fn(model),
                                     common.rows_packed(dataset))
    bs, nb = int(ecfg.get("batch_size", 16)), int(ecfg.get("num_batches", 20))
    if task == "lm":
        r = perplexity.evaluate(stats_fn, dataset.eval_batches(bs, nb),
                                perplexity.byte_counter(dataset.tokenizer))
        metrics = {"val_loss": r["loss"], "perplexity": r["perplexity"],
                   "bits_per_byte": r["bits_per_byte"], "eval_tokens": r["tokens"]}
    elif task == "mqar":
        correct, total = recall.masked_accuracy(stats_fn, dataset.eval_batches(bs, nb))
        metrics = {"accuracy": correct / max(total, 1), "queries": total}
        if ecfg.get("settings"):
            metrics.update(mqar_settings(stats_fn, config, dataset, ecfg))
    elif task == "niah":
        metrics = {}
        for i, kind in enumerate(ecfg.get("kinds") or (None,)):
            niah = recall.niah_grid(stats_fn, config, dataset, kind=kind,
                                    **dict(ecfg.get("niah", {})))
            suffix = "" if i == 0 else f"_{kind}"  # the first kind is the headline number
            metrics.update({f"exact{suffix}": niah["exact"],
                            f"per_digit{suffix}": niah["per_digit"], f"grid{suffix}": niah})
    else:
        raise ValueError(f"evaluate_run: no evaluation for task {task!r}")
    params = model_state.flat_params(nnx.state(model, nnx.Param))
    seq_len = int(cfg_get(config, "data.seq_len", 1))
    # the length the decode state is measured at: the training length, or the sweep's
    # (Zoology's recall-memory figure: its longest test length)
    state_len = int(ecfg.get("state_seq_len") or seq_len)
    return {"metrics": metrics, "step": int(step),
            "params": model_state.num_params({k: v.shape for k, v in params.items()}),
            "state_size": state_size_at(model, state_len), "state_seq_len": state_len,
            "seq_len": seq_len,
            "d_model": cfg_get(config, "model.d_model"),
            "layers": cfg_get(config, "model.num_layers")}


def saved_step(run_dir) -> int:
    """The newest step folder in a train.py workdir's checkpoints/ (0: none yet), read
    from the folder names alone (a damaged newest step is set aside when training
    resumes)."""
    ckpts = pathlib.Path(run_dir) / "checkpoints"
    steps = [int(p.name) for p in ckpts.iterdir() if p.is_dir() and p.name.isdigit()] \
        if ckpts.is_dir() else []
    return max(steps, default=0)


def trained_record(task: str, run_dir: str, ecfg: Mapping[str, Any],
                   train_wall: float, resumed_from_step: int = 0) -> dict[str, Any]:
    """evaluate_run's record of a trained run, with what its training log says: the loss
    curve and best validation loss (when it evaluated), its tokens/s, train_wall (s: this
    invocation's training, so only what was left of a resumed run) and
    resumed_from_step (the step this invocation's training started from; 0: the whole
    run trained in it)."""
    rec = evaluate_run(task, run_dir, ecfg)
    logged = read_train_log(run_dir)
    if "curve" in logged:
        rec["metrics"]["curve"] = logged["curve"]
        rec["metrics"]["best_val_loss"] = logged["best_val_loss"]
    rec["tokens_per_s"] = logged.get("tokens_per_s")
    rec["train_wall_s"] = train_wall
    rec["resumed_from_step"] = int(resumed_from_step)
    return rec


def with_run_fields(rec: dict[str, Any], run: Mapping, task: str,
                    wall_s: float) -> dict[str, Any]:
    """rec with the run's grid fields (name, setting, mixer, size, lr, seed, overrides),
    its step count under "steps" (evaluate_run's "step") and wall_s; rec itself."""
    rec.update({"run": run["name"], "task": task, "setting": run["setting"],
                "mixer": run["mixer"], "size": run["size"], "lr": run["lr"],
                "seed": run["seed"], "steps": rec.pop("step"), "wall_s": wall_s,
                "overrides": run["overrides"]})
    return rec


def setting_name(seq_len: int, kv: int) -> str:
    return f"T{int(seq_len)}_kv{int(kv)}"


def mqar_settings(stats_fn, config, dataset, ecfg: Mapping[str, Any]) -> dict[str, Any]:
    """Accuracy at each of the sweep's test settings `eval.settings` ((seq_len, kv)
    pairs; `eval.settings_examples` fresh examples each, default 1,000, drawn as the run's
    own data: vocabulary, power law, filler) and their plain mean, `settings_mean`: with
    the seven of configs/mqar_zoology_based.py, Zoology's valid/accuracy (the mean over
    equal numbers of examples of each setting). A setting the model's vocabulary cannot
    hold (seq_len >= vocabulary) fails loudly rather than leave the mean short."""
    from eval import recall

    settings = [(int(t), int(k)) for t, k in ecfg["settings"]]
    task = recall.mqar_task(config, dataset)
    got = recall.mqar_grid(stats_fn, task, settings,
                           num_examples=int(ecfg.get("settings_examples", 1000)),
                           batch_size=int(ecfg.get("settings_batch_size", 32)),
                           seed=int(ecfg.get("settings_seed", 1234)), progress=False)
    cells = {setting_name(c["seq_len"], c["kv_pairs"]): c["accuracy"] for c in got["cells"]}
    missing = [setting_name(t, k) for t, k in settings if setting_name(t, k) not in cells]
    if missing:
        raise ValueError(f"eval.settings {missing}: no MQAR example of that shape fits the "
                         f"run's task vocabulary {task['vocab_size']}")
    return {"settings": cells, "settings_mean": sum(cells.values()) / len(cells)}


def state_size_at(model, seq_len: int) -> int:
    """Numbers held per sequence while decoding after `seq_len` tokens (Zoology's x-axis):
    the KV cache grows with seq_len, linear states do not."""
    try:
        return int(model.state_size(seq_len))
    except TypeError:  # a model whose state_size() takes no length
        return int(model.state_size())


def speed_config(cfg: Mapping, run: Mapping):
    """The train.py config a speed run is timed at: `base_config` (SPEED_BASE_CONFIG if
    none) with the sweep's `model` section (a ModelConfig dict) as model.* keys under the
    run's own overrides. Where its source is files and no file is named: SPEED_TEXT as
    bytes, and a model vocabulary smaller than the bytes' widened to theirs (every byte
    must be a token)."""
    from data.tokenizers import ByteTokenizer
    from training import config_tools

    overrides = {f"model.{k}": v for k, v in grid.flatten(cfg.get("model")).items()}
    overrides.update(run["overrides"])
    config = grid.training_config(cfg.get("base_config") or SPEED_BASE_CONFIG, overrides)
    if cfg_get(config, "data.source") == "files" and not cfg_get(config, "data.files"):
        text = {"data.files": str(grid.ROOT / SPEED_TEXT), "data.tokenizer": "byte"}
        if cfg_get(config, "data.eod") is None:
            text["data.eod"] = False
        if 0 < config.model.vocab_size < ByteTokenizer.vocab_size:
            text["model.vocab_size"] = 0  # 0: the dataset's
        config_tools.set_values(config, text)
    return config


def run_speed(cfg: Mapping, run: Mapping, deadline: float | None, log) -> dict[str, Any]:
    """Times one mixer (eval.speed) at the sweep's lengths; nothing is trained."""
    from eval import speed

    config = speed_config(cfg, run)
    s = dict(cfg.get("speed") or {})
    m = speed.measure(config, train_lengths=s.get("train_lengths", ()),
                      train_batch=s.get("train_batch", 8),
                      train_steps=s.get("train_steps", 5),
                      decode_contexts=s.get("decode_contexts", ()),
                      decode_batch=s.get("decode_batch", 1),
                      decode_tokens=s.get("decode_tokens", 32), deadline=deadline, log=log)
    tps = [c.get("tokens_per_s") for c in m["train"].values() if "tokens_per_s" in c]
    errors = {f"{kind} {n}": str(c["error"]) for kind in ("train", "decode")
              for n, c in m[kind].items() if "error" in c}
    skipped = [cell for cell, err in errors.items() if err.startswith("skipped")]
    failed = [f"{cell} failed ({err.split(':')[0]})" for cell, err in errors.items()
              if cell not in skipped]
    # A failed or skipped length leaves the run partial: shown, and measured again by the
    # next invocation (after a fix, say), like a run cut by the time budget.
    why = [f"the time budget ran out before {', '.join(skipped)}"] if skipped else []
    why += failed
    return {"metrics": {"train": m["train"], "decode": m["decode"]}, "params": m["params"],
            "state_size": m["state_size"], "d_model": cfg_get(config, "model.d_model"),
            "layers": cfg_get(config, "model.num_layers"), "step": 0,
            "tokens_per_s": max(tps) if tps else None,
            "partial": "; ".join(why) if why else None}
