"""Metric sinks: WORKDIR/metrics.jsonl (always), Weights & Biases (offline by default) and
the terminal (a tqdm bar, or a line per logged step); `Sinks` writes to all three.

metrics.jsonl holds one JSON object per line: training entries
{"step", "loss", "lr", "tokens_per_s", ...} and eval entries {"step", "eval_loss", ...}.
"step" is the number of optimizer updates done: a training entry at step s reports the
loss of update s, an eval entry at step s evaluates the parameters after s updates, and
a checkpoint at step s holds them. On resume from step s, entries with step > s belong
to work that is about to be redone, so they are dropped first: the file never holds a
step twice.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import sys
import uuid
import warnings
from typing import Any, Mapping

METRICS_FILE = "metrics.jsonl"


def _clean(value):
    """JSON-safe scalars (NaN/inf become strings JSON can hold)."""
    try:
        value = value.item() if hasattr(value, "item") else value
    except Exception:
        pass
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def read_metrics(workdir: str | os.PathLike) -> list[dict]:
    path = pathlib.Path(workdir) / METRICS_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a kill: drop it
            continue
    return out


class MetricsFile:
    def __init__(self, workdir: str | os.PathLike, *, resume_step: int | None = None,
                 enabled: bool = True):
        self.path = pathlib.Path(workdir) / METRICS_FILE
        self.enabled = enabled
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:  # a fresh run: an old file would mix two runs
            keep = []
        else:
            keep = [e for e in read_metrics(self.path.parent)
                    if e.get("step", 0) <= resume_step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(e) + "\n" for e in keep))
        os.replace(tmp, self.path)
        self._file = open(self.path, "a", buffering=1)

    def write(self, entry: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps({k: _clean(v) for k, v in entry.items()}) + "\n")
        self._file.flush()

    def close(self):
        if self.enabled:
            self._file.close()


def wandb_mode(configured: str) -> str:
    """WANDB_MODE in the environment wins over logging.wandb, except over an explicit
    logging.wandb=disabled: a run told to log nowhere must not go online (and upload its
    config) because of a variable left in the shell."""
    if (configured or "").lower() == "disabled":
        return "disabled"
    mode = os.environ.get("WANDB_MODE", configured or "offline").lower()
    return {"dryrun": "offline", "run": "online"}.get(mode, mode)


class WandbLogger:
    """wandb.init(mode=offline|online, dir=workdir); silent no-op when disabled or missing.
    The run id is kept in WORKDIR/wandb_id.txt so a resumed run continues the same run."""

    def __init__(self, workdir, *, mode: str, project: str, name: str, config: dict,
                 enabled: bool = True):
        self.run = None
        mode = wandb_mode(mode)
        if not enabled or mode == "disabled":
            return
        try:
            import wandb
        except ImportError:
            print("wandb is not installed; logging to metrics.jsonl only", file=sys.stderr)
            return
        workdir = pathlib.Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        id_file = workdir / "wandb_id.txt"
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.run = wandb.init(mode=mode, dir=str(workdir), project=project,
                                      name=name or None, id=run_id, resume="allow",
                                      config=config, settings=wandb.Settings(silent=True))
        except Exception as e:  # never lose a training run to a logging backend
            print(f"wandb.init failed ({e}); logging to metrics.jsonl only",
                  file=sys.stderr)
            self.run = None

    def log(self, entry: Mapping[str, Any]) -> None:
        if self.run is not None:
            entry = {k: _clean(v) for k, v in entry.items()}
            self.run.log({k: v for k, v in entry.items() if k != "step"},
                         step=int(entry["step"]))

    def close(self):
        if self.run is not None:
            self.run.finish()
            self.run = None


class Progress:
    """tqdm when asked for and available; otherwise a line per logged step."""

    def __init__(self, enabled: bool, start: int, total: int):
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, initial=start, dynamic_ncols=True, unit="step",
                                file=sys.stderr, mininterval=0.5)
            except ImportError:
                pass

    def update(self, n=1):
        if self.bar is not None:
            self.bar.update(n)

    def show(self, entry: Mapping[str, Any]):
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{entry['loss']:.4f}",
                                 tok_s=f"{entry['tokens_per_s']:.0f}", refresh=False)
        else:
            mfu = f", mfu {100 * entry['mfu']:.2f}%" if "mfu" in entry else ""
            print(f"step {entry['step']}: loss {entry['loss']:.4f}, lr {entry['lr']:.2e}, "
                  f"{entry['tokens_per_s']:.0f} tok/s{mfu}", flush=True)

    def write(self, text: str):
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


class Sinks:
    """metrics.jsonl, wandb and the terminal, written together; whoever opened them
    closes them."""

    def __init__(self, file: MetricsFile, wandb: WandbLogger, progress: Progress):
        self.file, self.wandb, self.progress = file, wandb, progress

    def record(self, entry: Mapping[str, Any]) -> None:
        """An entry for metrics.jsonl and wandb (evaluations)."""
        self.file.write(entry)
        self.wandb.log(entry)

    def show(self, entry: Mapping[str, Any]) -> None:
        """A training entry: recorded, and shown on the terminal."""
        self.record(entry)
        self.progress.show(entry)
