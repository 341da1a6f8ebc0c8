"""Architecture comparison sweep: train and evaluate a grid of runs, then tables and plots.

    python -m eval.compare --config=configs/compare_mqar.py --workdir=runs/compare_mqar
    python -m eval.compare --config=configs/compare_mqar.py:tiny --workdir=/tmp/cmp   # CPU check

The grid is the product of the config's `settings x mixers x sizes x lrs x seeds`; each
entry is a dict of `--config.KEY=VALUE` overrides for `train.py` on top of
`base_config`. Every run trains in its own subdirectory through `train.py` in a
subprocess (a crash or an out-of-memory in one run cannot take the sweep down, and
train.py's own checkpoints make a killed run resume), is then evaluated here, and
leaves `done.json` holding its record. A second invocation skips runs with `done.json`,
so a killed sweep carries on where it stopped. After every run the sweep rewrites
`results.jsonl` (one record per finished run, in grid order), `results.md` (tables at the
best lr per setting, mixer and size) and the PNG plots, so partial results are always
on disk. The `speed` task trains nothing: it times each mixer in-process (eval.speed).
"""
from __future__ import annotations

import itertools
import json
import math
import os
import pathlib
import subprocess
import sys
import time
from typing import Any, Mapping

from eval import common

ROOT = pathlib.Path(__file__).resolve().parents[1]
TASKS = ("lm", "mqar", "niah", "speed")


# ----------------------------------------------------------------------------- the grid
def flatten(d: Mapping[str, Any] | None, prefix: str = "") -> dict[str, Any]:
    """{"model": {"mixer": "x"}} and {"model.mixer": "x"} both -> {"model.mixer": "x"};
    None values (unset placeholders) are dropped."""
    out: dict[str, Any] = {}
    for k, v in (d or {}).items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        elif v is None:
            continue  # an unset placeholder: leave the training config's own value
        else:
            out[f"{prefix}{k}"] = v
    return out


def _axis(cfg: Mapping, name: str, default):
    values = cfg.get(name)
    return list(values) if values else [default]


def expand_grid(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Runs of the sweep, in order: each {name, setting, mixer, size, lr, seed, overrides}.

    `settings`, `mixers` and `sizes` are lists of {"name": str, "overrides": {KEY: VALUE}};
    `lrs` and `seeds` lists of numbers written to the keys `lr_key` and `seed_key`.
    """
    task = cfg.get("task")
    if task not in TASKS:
        raise ValueError(f"compare config: task={task!r}; choose one of {TASKS}")
    blank = {"name": "default", "overrides": {}}
    runs = []
    for setting, mixer, size, lr, seed in itertools.product(
            _axis(cfg, "settings", blank), _axis(cfg, "mixers", blank),
            _axis(cfg, "sizes", blank), _axis(cfg, "lrs", None), _axis(cfg, "seeds", 0)):
        overrides = flatten(cfg.get("overrides"))
        for part in (setting, mixer, size):
            overrides.update(flatten(part.get("overrides")))
        if lr is not None:
            overrides[cfg["lr_key"]] = lr
        if task != "speed":
            overrides[cfg["seed_key"]] = seed
        parts = [setting["name"], mixer["name"], size["name"],
                 None if lr is None else f"lr{lr:g}", None if task == "speed" else f"s{seed}"]
        name = "__".join(p for p in parts if p and p != "default")
        runs.append({"name": name, "setting": setting["name"], "mixer": mixer["name"],
                     "size": size["name"], "lr": lr, "seed": seed, "overrides": overrides})
    names = [r["name"] for r in runs]
    if len(set(names)) != len(names):
        raise ValueError("compare config: two grid entries share a name; give every setting, "
                         "mixer and size a distinct `name`")
    return runs


def _flag_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (tuple, list)):
        return repr(tuple(v))
    return str(v)


def train_command(cfg: Mapping, run: Mapping, run_dir: str, python: str) -> list[str]:
    cmd = [python, str(ROOT / "train.py"), f"--config={ROOT / cfg['base_config']}",
           f"--workdir={run_dir}"]
    cmd += [f"--config.{k}={_flag_value(v)}" for k, v in sorted(run["overrides"].items())]
    return cmd


# ----------------------------------------------------------------------------- one run
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
    from eval import perplexity, recall

    model, config, dataset, step = common.load_run(run_dir)
    stats_fn = common.token_stats_fn(common.make_logits_fn(model))
    bs, nb = int(ecfg.get("batch_size", 16)), int(ecfg.get("num_batches", 20))
    if task == "lm":
        r = perplexity.evaluate(stats_fn, dataset.eval_batches(bs, nb),
                                perplexity.byte_counter(dataset.tokenizer))
        metrics = {"val_loss": r["loss"], "perplexity": r["perplexity"],
                   "bits_per_byte": r["bits_per_byte"], "eval_tokens": r["tokens"]}
    elif task == "mqar":
        correct, total = recall.masked_accuracy(stats_fn, dataset.eval_batches(bs, nb))
        metrics = {"accuracy": correct / max(total, 1), "queries": total}
    elif task == "niah":
        metrics = {}
        for i, kind in enumerate(ecfg.get("kinds") or (None,)):
            grid = recall.niah_grid(stats_fn, config, dataset, kind=kind,
                                    **dict(ecfg.get("niah", {})))
            suffix = "" if i == 0 else f"_{kind}"  # the first kind is the headline number
            metrics.update({f"exact{suffix}": grid["exact"],
                            f"per_digit{suffix}": grid["per_digit"], f"grid{suffix}": grid})
    else:
        raise ValueError(f"evaluate_run: no evaluation for task {task!r}")
    from eval.speed import count_params

    seq_len = int(common.cfg_get(config, "data.seq_len", 1))
    return {"metrics": metrics, "step": int(step), "params": count_params(model),
            "state_size": state_size_at(model, seq_len), "seq_len": seq_len,
            "d_model": common.cfg_get(config, "model.d_model"),
            "layers": common.cfg_get(config, "model.num_layers")}


def state_size_at(model, seq_len: int) -> int:
    """Numbers held per sequence while decoding after `seq_len` tokens (Zoology's x-axis):
    the KV cache grows with seq_len, linear states do not."""
    try:
        return int(model.state_size(seq_len))
    except TypeError:  # a model whose state_size() takes no length
        return int(model.state_size())


def run_speed(cfg: Mapping, run: Mapping, deadline: float | None, log) -> dict[str, Any]:
    from eval import speed

    model_cfg = dict(flatten(cfg.get("model")))
    for k, v in run["overrides"].items():
        if not k.startswith("model."):
            raise ValueError(f"speed task: override {k!r} is not a model.* key")
        model_cfg[k[len("model."):]] = v
    s = dict(cfg.get("speed") or {})
    m = speed.measure(model_cfg, train_lengths=s.get("train_lengths", ()),
                      train_batch=s.get("train_batch", 8), train_steps=s.get("train_steps", 5),
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
    why = ([f"the time budget ran out before {', '.join(skipped)}"] if skipped else []) + failed
    return {"metrics": {"train": m["train"], "decode": m["decode"]}, "params": m["params"],
            "state_size": m["state_size"], "d_model": model_cfg.get("d_model"),
            "layers": model_cfg.get("num_layers"), "step": 0,
            "tokens_per_s": max(tps) if tps else None,
            "partial": "; ".join(why) if why else None}


def train_subprocess(cfg: Mapping, run: Mapping, run_dir: str, python: str) -> None:
    """`python train.py ...` for one run, output appended to RUN_DIR/train.log."""
    cmd = train_command(cfg, run, run_dir, python)
    with open(os.path.join(run_dir, "train.log"), "a") as logf:
        logf.write("$ " + " ".join(cmd) + "\n")
        logf.flush()
        timeout = cfg.get("train_timeout_s") or None
        proc = subprocess.run(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT,
                              timeout=timeout, env=_child_env(cfg))
    if proc.returncode != 0:
        tail = pathlib.Path(run_dir, "train.log").read_text()[-1500:]
        raise RuntimeError(f"train.py exited with {proc.returncode}; end of "
                           f"{run_dir}/train.log:\n{tail}")


def train_inprocess(cfg: Mapping, run: Mapping, run_dir: str) -> None:
    """The same training through `training.loop.train` in this process.

    Saves the interpreter start and device initialisation per run (seconds on a GPU),
    at the price of isolation; a kill (SIGINT/SIGTERM) stops the sweep, not just the run.
    """
    from training import config_tools, loop

    config = config_tools.load_config_file(str(ROOT / cfg["base_config"]))
    overrides = dict(run["overrides"])
    if "logging.progress" in config_tools.flat_keys(config):
        overrides.setdefault("logging.progress", False)  # the sweep has its own bar
    config_tools.check_overrides(config, {k: _flag_value(v) for k, v in overrides.items()})
    for key, value in overrides.items():
        *path, leaf = key.split(".")
        node = config
        for part in path:
            node = node[part]
        node[leaf] = value
    try:
        loop.train(config, run_dir)
    except loop.Interrupted as e:
        raise KeyboardInterrupt(f"{run['name']}: {e}") from e


def do_run(cfg: Mapping, run: Mapping, workdir: str, python: str, deadline: float | None,
           log) -> dict[str, Any]:
    """Trains (unless task == speed) and evaluates one run; returns its record."""
    task = cfg["task"]
    run_dir = os.path.join(workdir, run["name"])
    os.makedirs(run_dir, exist_ok=True)
    t0 = time.time()
    if task == "speed":
        rec = run_speed(cfg, run, deadline, log)
    else:
        if cfg.get("runner", "subprocess") == "inprocess":
            train_inprocess(cfg, run, run_dir)
        else:
            train_subprocess(cfg, run, run_dir, python)
        train_wall = time.time() - t0
        rec = evaluate_run(task, run_dir, dict(cfg.get("eval") or {}))
        logged = read_train_log(run_dir)
        if "curve" in logged:
            rec["metrics"]["curve"] = logged["curve"]
            rec["metrics"]["best_val_loss"] = logged["best_val_loss"]
        rec["tokens_per_s"] = logged.get("tokens_per_s")
        rec["train_wall_s"] = train_wall
    rec.update({"run": run["name"], "task": task, "setting": run["setting"],
                "mixer": run["mixer"], "size": run["size"], "lr": run["lr"],
                "seed": run["seed"], "steps": rec.pop("step"), "wall_s": time.time() - t0,
                "overrides": run["overrides"]})
    return rec


def _child_env(cfg: Mapping) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("WANDB_MODE", "disabled")
    for k, v in dict(cfg.get("env") or {}).items():
        env[str(k)] = str(v)
    return env


# ----------------------------------------------------------------------------- outputs
def write_outputs(cfg: Mapping, runs: list[dict], workdir: str) -> list[dict]:
    """results.jsonl, results.md and plots from every run's done.json, in grid order."""
    from eval import plots, report

    records, failed = [], []
    for run in runs:
        done = os.path.join(workdir, run["name"], "done.json")
        fail = os.path.join(workdir, run["name"], "failed.json")
        if os.path.isfile(done):
            with open(done) as f:
                records.append(json.load(f))
        elif os.path.isfile(fail):
            with open(fail) as f:
                failed.append(f"{run['name']}: {json.load(f).get('error', '')[:300]}")
        elif os.path.isfile(os.path.join(workdir, run["name"], "partial.json")):
            with open(os.path.join(workdir, run["name"], "partial.json")) as f:
                rec = json.load(f)
            records.append(rec)  # in the tables, flagged; not `done`
            failed.append(f"{run['name']} (incomplete, its numbers are in the tables): "
                          f"{rec.get('partial')}")
    _write_atomic(os.path.join(workdir, "results.jsonl"),
                  "".join(json.dumps(r) + "\n" for r in records))

    written = []
    task = cfg["task"]
    best = report.best_lr(records)
    try:
        if task == "lm":
            curves = {f"{k[2]} {k[3]} lr={b['lr']:g}": b["records"][0]["metrics"].get("curve", [])
                      for k, b in best.items()}
            if any(curves.values()):
                written.append(plots.loss_curves(curves, os.path.join(workdir, "loss_curves.png")))
        elif task in ("mqar", "niah"):
            metric, _ = report.primary(task)
            pts = [{"setting": k[1], "mixer": k[2], "state_size": b["records"][0].get("state_size"),
                    "value": b["value"]} for k, b in best.items() if not math.isnan(b["value"])]
            if pts:
                written.append(plots.recall_vs_state(
                    pts, os.path.join(workdir, "recall_vs_state.png"),
                    metric_label=f"{task.upper()} {metric}",
                    references=[dict(r) for r in cfg.get("references", [])]))
            if task == "niah":
                for k, b in best.items():
                    cells = b["records"][0]["metrics"].get("grid", {}).get("cells")
                    if cells:
                        written.append(plots.niah_heatmap(
                            cells, os.path.join(workdir, f"niah_{k[2]}_{k[3]}.png"),
                            title=f"{k[2]} {k[3]} (lr {b['lr']:g})"))
        elif task == "speed":
            if records:
                written.append(plots.speed_plot(speed_series(records),
                                                os.path.join(workdir, "speed.png")))
    except Exception as e:  # noqa: BLE001 (a plot must never lose the tables)
        print(f"compare: plotting failed: {type(e).__name__}: {e}", file=sys.stderr)
    md = report.markdown(records, title=cfg.get("title", f"Comparison: {task}"),
                         settings_order=[s["name"] for s in cfg.get("settings") or []],
                         plots=[os.path.basename(p) for p in written], failed=failed)
    _write_atomic(os.path.join(workdir, "results.md"), md)
    return records


def _write_atomic(path: str, text: str) -> None:
    """Whole file or nothing, also with several sweep processes (--shard) in one workdir."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def speed_series(records: list[dict]) -> dict[str, dict]:
    """{"train"|"decode": {mixer: [(T, seconds), ...]}}: training time per token, decode
    time per step, from speed records (several records of one mixer are merged)."""
    series: dict[str, dict] = {"train": {}, "decode": {}}
    for r in records:
        for kind in ("train", "decode"):
            pts = series[kind].setdefault(r["mixer"], [])
            pts += [(int(n), c["step_s"] / (int(n) if kind == "train" else 1))
                    for n, c in r["metrics"].get(kind, {}).items() if "step_s" in c]
    return series


def parse_shard(text: str) -> tuple[int, int]:
    """"i/n" -> (i, n): this process takes grid entries i, i+n, i+2n, ..."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        i, n = -1, 0
    if not 0 <= i < n:
        raise ValueError(f"--shard={text!r}: use i/n with 0 <= i < n, e.g. 0/2 and 1/2 for "
                         "two processes")
    return i, n


def sweep(cfg: Mapping[str, Any], workdir: str, *, python: str = sys.executable,
          max_wall_s: float = 0.0, only: str = "", progress: bool = True,
          shard: str = "0/1", report_only: bool = False) -> list[dict]:
    """Runs every unfinished run of the grid, one after another; returns all records.

    shard "i/n": run only every n-th grid entry from the i-th, so n processes (on one GPU
    or several) share a sweep directory; the tables cover every finished run.
    only: run only grid entries whose name contains it, or (comma-separated) any of them.
    report_only: run nothing, rebuild results.jsonl / results.md / plots.
    The tables and plots cover every finished run of the grid, whatever only/shard say.
    """
    grid = expand_grid(cfg)
    # `only` and `shard` choose what this invocation runs; the tables always cover every
    # finished run of the grid (other invocations may have run the rest)
    wanted = [part for part in only.split(",") if part]
    runs = [r for r in grid if any(part in r["name"] for part in wanted)] if wanted else grid
    i, n = parse_shard(shard)
    os.makedirs(workdir, exist_ok=True)
    if report_only:
        return write_outputs(cfg, grid, workdir)
    start = time.time()
    deadline = start + max_wall_s if max_wall_s else None
    todo = [r for r in runs[i::n]
            if not os.path.isfile(os.path.join(workdir, r["name"], "done.json"))]
    from tqdm import tqdm

    mine = len(runs[i::n])
    bar = tqdm(total=mine, initial=mine - len(todo), desc="compare", unit="run",
               disable=not progress)
    log = bar.write
    for run in todo:
        if deadline is not None and time.time() > deadline:
            log(f"compare: time budget of {max_wall_s:.0f}s spent; {run['name']} and later "
                "runs are left for the next invocation")
            break
        bar.set_postfix_str(run["name"][:60])
        run_dir = os.path.join(workdir, run["name"])
        try:
            rec = do_run(cfg, run, workdir, python, deadline, log)
        except Exception as e:  # noqa: BLE001 (one failed run must not stop the sweep)
            os.makedirs(run_dir, exist_ok=True)
            common.write_json(os.path.join(run_dir, "failed.json"),
                              {"error": f"{type(e).__name__}: {e}"})
            log(f"compare: {run['name']} FAILED: {type(e).__name__}: {str(e)[:500]}")
        else:
            if rec.get("partial"):  # cut by the time budget, or a failed length: shown,
                # but measured again by the next invocation (the loop's deadline check
                # stops the sweep when the budget is spent)
                common.write_json(os.path.join(run_dir, "partial.json"), rec)
                log(f"compare: {run['name']}: {rec['partial']}; kept as partial.json, "
                    "redone by the next invocation")
                write_outputs(cfg, grid, workdir)
                bar.update(1)
                continue
            for stale in ("failed.json", "partial.json"):
                if os.path.exists(os.path.join(run_dir, stale)):
                    os.remove(os.path.join(run_dir, stale))
            common.write_json(os.path.join(run_dir, "done.json"), rec)
            metrics = {k: v for k, v in rec["metrics"].items() if isinstance(v, (int, float))}
            log(f"compare: {run['name']} done in {rec['wall_s']:.0f}s: {metrics}")
        write_outputs(cfg, grid, workdir)
        bar.update(1)
    bar.close()
    return write_outputs(cfg, grid, workdir)


@common.user_errors
def main(argv):
    del argv
    from absl import flags

    from absl import logging
    logging.set_verbosity(logging.WARNING)  # orbax logs every file it touches at INFO
    f = flags.FLAGS
    cfg = common.to_plain(f.config)
    if f.runner:
        cfg["runner"] = f.runner
    records = sweep(cfg, f.workdir, max_wall_s=f.max_wall_s, only=f.only, shard=f.shard,
                    report_only=f.report_only)
    common.print_json({"workdir": f.workdir, "finished_runs": len(records),
                       "results": os.path.join(f.workdir, "results.md")})


if __name__ == "__main__":
    from absl import app, flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "Sweep config, e.g. configs/compare_mqar.py[:tiny].")
    flags.DEFINE_string("workdir", None, "Directory of the sweep (one subdirectory per run).",
                        required=True)
    flags.DEFINE_float("max_wall_s", 0.0, "Start no new run after this many seconds (0: no limit).")
    flags.DEFINE_string("only", "", "Run only grid entries whose name contains this string "
                      "(or any of several, comma-separated).")
    flags.DEFINE_string("shard", "0/1", "i/n: run grid entries i, i+n, ... (n processes "
                        "sharing one sweep directory).")
    flags.DEFINE_bool("report_only", False, "Run nothing; rebuild the tables and plots.")
    flags.DEFINE_enum("runner", None, ["subprocess", "inprocess"],
                      "How to train each run (default: the config's `runner`, else subprocess).")
    flags.mark_flags_as_required(["config"])
    app.run(main)
