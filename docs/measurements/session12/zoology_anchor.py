"""Anchor: HazyResearch/zoology's own MQAR code (model, data, Trainer, metric), run as a
reference for our JAX MQAR (configs/mqar_zoology_paper.py).

Zoology's source is not vendored: it is .jobs/zoology (git archive of HazyResearch/zoology
at the commit in .jobs/zoology/COMMIT, dbcb60d). Its Python dependencies that the GPU
machine lacks are wheels in .whl2 (einops, pydantic + pydantic-core + annotated-types +
typing-inspection + typing-extensions, tqdm, opt_einsum, pandas + python-dateutil + pytz +
tzdata, fla-core + flash-linear-attention 0.4.2). Run from the repo root:

    pip install --no-index --no-deps --target /tmp/site .whl2/*.whl
    PYTHONPATH=/tmp/site:.jobs/zoology python docs/measurements/session12/zoology_anchor.py \\
        --mixers=attention,based,gated_delta_net --seeds=0 --lrs=2.1544347e-3 \\
        --steps=25024 --epochs=64 --parallel=3 --budget_s=540 --out=$OUT

Two modules are stubbed here, not carried: `wandb` (zoology/logger.py imports it at top
level; with LoggerConfig's project_name None Zoology's WandbLogger never calls it, and we
pass our own recording logger to the Trainer), and `torchvision` only if it does not
import (zoology/model.py takes StochasticDepth from torchvision.ops; the stub is
torchvision's StochasticDepth, and with Zoology's drop_path=0.0 it is the identity).

What is Zoology's and where each value comes from (paths under .jobs/zoology/zoology/):
- model: experiments/models_repo.py's own builders are called (add_attention, add_based,
  add_gated_delta_net) with the conv_mixer of experiments/mqar_example_configs/
  original_mqar_configs.py (= paper_configs/arxiv24_based_figure2/configs.py):
  BaseConv(l_max=input_seq_len, kernel_size=3, implicit_long_conv=True); each model is
  Hybrid([BaseConv, mixer]) with n_layers=2 (layer 0 BaseConv, layer 1 the mixer),
  state_mixer torch.nn.Identity (no MLP), max_position_embeddings=0, vocab 8,192, and
  ModelConfig defaults (config.py): embed_dropout 0.1, resid_dropout 0, LayerNorm eps 1e-5,
  tied lm_head, init N(0, 0.02). The row with --d_model (default 128) is kept:
  * attention: MHA(num_heads=1, dropout=0.1)                          (models_repo.py)
  * based: Based(feature_dim=--based_feature_dim, default 8 as in iclr24_zoology_figure2/
    configs.py; the Based-era sweep has 8/16/24), feature_name taylor_exp,
    num_heads=1, num_key_value_heads=1, train_view quadratic          (models_repo.py)
  * delta_net: DeltaNet(num_heads=2, use_beta=True, use_gate=False, use_short_conv=True,
    conv_size=4)                                                      (models_repo.py)
  * gated_delta_net: GatedDeltaNet(num_heads=2, use_gate=False, use_short_conv=True,
    conv_size=4; class defaults expand_v=2, mode chunk, norm_eps 1e-5) (models_repo.py;
    mixers/gated_delta_net.py, which needs fla)
- data: data/multiquery_ar.py's MQARConfig / multiquery_ar, vocab 8,192, train and test
  (input_seq_len 256, num_kv_pairs 16), power_a 0.01, random_non_queries=False and 3,000
  test examples (iclr24_zoology_figure2/configs.py; the Based-era files use the default
  random_non_queries=True and 1,000 test examples: --random_non_queries, --test_examples);
  built and batched by data/utils.py's prepare_data with DataConfig.seed 123 (config.py
  default; --data_seed). Training examples: --train_examples, or by default
  round(steps / epochs) * batch_size, so that an epoch is steps/epochs batches and the run
  is --steps steps (Zoology's figure 2: 100,000 examples = 391 batches x 64 epochs =
  25,024 steps).
- batch size 256 train and test (iclr24_zoology_figure2/configs.py: 256 at
  input_seq_len 256; the Based-era files: 256 train, 32 test).
- training: train.py's Trainer (its train_epoch and test, unchanged): AdamW(lr, weight
  decay 0.1 [config.py TrainConfig default], torch betas (0.9, 0.999), eps 1e-8) on every
  parameter, CrossEntropyLoss, CosineAnnealingLR(T_max=max_epochs, eta_min=0) stepped once
  an epoch, no warmup, no clipping, float32, evaluation after every epoch, early stop once
  valid/accuracy > 0.99 (TrainConfig defaults; --early_stop 0 turns it off).
  lr grid: iclr24_zoology_figure2/configs.py numpy.logspace(-4, -2, 4) = 1e-4, 4.64e-4,
  2.15e-3, 1e-2 (the default --lrs); the Based-era files use logspace(-3, -1.5, 4) =
  1e-3, 3.16e-3, 1e-2, 3.16e-2. max_epochs 64 (figure 2; Based-era 32).
  fit() is re-stated here (same optimizer, scheduler, loop order, early stop) only to add
  the wall deadline and the curve; utils.set_determinism(seed) then prepare_data then
  LanguageModel, in the order of train.py's train().
- metric: train.py's compute_metrics via Trainer.test: per test example, the fraction of
  query positions (label != -100) predicted right; valid/accuracy is the mean over
  examples.

Output: OUT/zoology_anchor.json (one record per run: mixer, d_model, seed, lr,
steps_done, epochs_done, wall_s, val_accuracy, best_val_accuracy, val_loss, curve of
{step, epoch, loss, val_loss, acc} per epoch, loss_curve of (step, mean loss) every
--log_every steps, error with traceback tail), OUT/runs/*.json, OUT/logs/*.log, and a
printed table. Each run is a subprocess (--parallel at once, all on one GPU), so a
failing mixer (an fla import error, say) only fails its own runs.
"""
import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
import traceback
import types

HERE = os.path.abspath(__file__)
MIXERS = ("attention", "based", "delta_net", "gated_delta_net")


# ---------------------------------------------------------------- stubs (no wandb) -----
def install_stubs():
    if "wandb" not in sys.modules:
        wandb = types.ModuleType("wandb")
        wandb.__doc__ = "stub: Zoology's WandbLogger is never active here"

        def _unavailable(*a, **k):
            raise RuntimeError("wandb stub: logging to wandb is not available")
        wandb.init = wandb.log = wandb.watch = wandb.Api = _unavailable
        sys.modules["wandb"] = wandb
    try:
        from torchvision.ops import StochasticDepth  # noqa: F401
    except Exception:
        for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[k]
        import torch
        from torch import nn

        def stochastic_depth(input, p, mode, training=True):
            # torchvision.ops.stochastic_depth
            if p < 0.0 or p > 1.0:
                raise ValueError(f"drop probability has to be between 0 and 1, but got {p}")
            if mode not in ["batch", "row"]:
                raise ValueError(f"mode has to be either 'batch' or 'row', but got {mode}")
            if not training or p == 0.0:
                return input
            survival_rate = 1.0 - p
            if mode == "row":
                size = [input.shape[0]] + [1] * (input.ndim - 1)
            else:
                size = [1] * input.ndim
            noise = torch.empty(size, dtype=input.dtype, device=input.device)
            noise = noise.bernoulli_(survival_rate)
            if survival_rate > 0.0:
                noise.div_(survival_rate)
            return input * noise

        class StochasticDepth(nn.Module):
            def __init__(self, p: float, mode: str) -> None:
                super().__init__()
                self.p, self.mode = p, mode

            def forward(self, input):
                return stochastic_depth(input, self.p, self.mode, self.training)

        tv = types.ModuleType("torchvision")
        ops = types.ModuleType("torchvision.ops")
        ops.StochasticDepth, ops.stochastic_depth = StochasticDepth, stochastic_depth
        tv.ops = ops
        sys.modules["torchvision"], sys.modules["torchvision.ops"] = tv, ops
        print("torchvision not importable: using the StochasticDepth stub", flush=True)


# ------------------------------------------------------------- Zoology's configs -------
def build_configs(a, mixer, lr, seed, train_examples, epochs):
    """TrainConfig for one run, built by Zoology's own config code."""
    from zoology.config import TrainConfig, DataConfig, LoggerConfig
    from zoology.data.multiquery_ar import MQARConfig
    from zoology.experiments import models_repo

    L, kv, V = a.input_seq_len, a.num_kv_pairs, a.vocab_size
    mq = dict(vocab_size=V, input_seq_len=L, num_kv_pairs=kv, power_a=0.01,
              random_non_queries=bool(a.random_non_queries))
    data = DataConfig(
        train_configs=[MQARConfig(num_examples=train_examples, **mq)],
        test_configs=[MQARConfig(num_examples=a.test_examples, **mq)],
        batch_size=(a.batch_size, a.test_batch_size),
        seed=a.data_seed,
        # DataConfig.cache_dir is `str = None`: pydantic refuses an explicit None
        **({"cache_dir": a.cache_dir} if a.cache_dir else {}),
    )
    # original_mqar_configs.py: input_seq_len = max over its train/test configs
    input_seq_len = max(c.input_seq_len for c in data.train_configs + data.test_configs)
    model_factory_kwargs = {
        "state_mixer": dict(name="torch.nn.Identity", kwargs={}), "vocab_size": V,
    }
    conv_mixer = dict(
        name="zoology.mixers.base_conv.BaseConv",
        kwargs={"l_max": input_seq_len, "kernel_size": 3, "implicit_long_conv": True},
    )
    add = {"attention": models_repo.add_attention, "based": models_repo.add_based,
           "delta_net": models_repo.add_delta_net,
           "gated_delta_net": models_repo.add_gated_delta_net}[mixer]
    models = add([], conv_mixer, input_seq_len, model_factory_kwargs)
    models = [m for m in models if m.d_model == a.d_model and m.name == mixer]
    if mixer == "based":
        models = [m for m in models if m.sequence_mixer.kwargs["configs"][1]["kwargs"]
                  ["feature_dim"] == a.based_feature_dim]
    if len(models) != 1:
        raise ValueError(f"models_repo has {len(models)} {mixer} models at d_model "
                         f"{a.d_model} (feature_dim {a.based_feature_dim})")
    config = TrainConfig(
        model=models[0], data=data, learning_rate=lr, max_epochs=epochs, seed=seed,
        logger=LoggerConfig(),  # project_name None: Zoology's WandbLogger stays off
        early_stopping_metric="valid/accuracy" if a.early_stop > 0 else None,
        early_stopping_threshold=a.early_stop if a.early_stop > 0 else None,
        run_id=f"{mixer}-d{a.d_model}-lr{lr:.3e}-s{seed}",
    )
    return config


def plan(a):
    """(train_examples, epochs, steps per epoch)."""
    if a.train_examples:
        epochs = a.epochs
        n = a.train_examples
    else:
        epochs = max(1, min(a.epochs, a.steps))
        n = max(1, round(a.steps / epochs)) * a.batch_size
    return n, epochs, math.ceil(n / a.batch_size)


# ------------------------------------------------------------------ one run ------------
class Recorder:
    """Stands in for zoology.logger.WandbLogger: keeps what Trainer logs."""

    def __init__(self, log_every):
        self.step, self.log_every = 0, log_every
        self.win, self.epoch_losses = [], []
        self.loss_curve, self.evals = [], []
        self.t_step1 = None

    def log(self, metrics):
        if "train/loss" in metrics:
            self.step += 1
            if self.step == 1:
                self.t_step1 = time.time()
            x = float(metrics["train/loss"])  # Trainer already synced it (loss.item())
            self.win.append(x)
            self.epoch_losses.append(x)
            if self.step % self.log_every == 0:
                self.loss_curve.append((self.step, sum(self.win) / len(self.win)))
                self.win = []
        elif "valid/accuracy" in metrics:
            ep = self.epoch_losses
            self.evals.append(dict(step=self.step, epoch=int(metrics["epoch"]),
                                   loss=(sum(ep) / len(ep)) if ep else None,
                                   val_loss=float(metrics["valid/loss"]),
                                   acc=float(metrics["valid/accuracy"])))
            self.epoch_losses = []

    def finish(self):
        pass


class Stop:
    flag = False


class DeadlineLoader:
    """The train DataLoader, ending an epoch early once the deadline (or SIGTERM) comes."""

    def __init__(self, loader, deadline):
        self.loader, self.deadline = loader, deadline
        self.cut = False

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            if Stop.flag or time.time() >= self.deadline:
                self.cut = True
                return
            yield batch


def child(a):
    t0 = time.time()
    rec = dict(mixer=a.mixer, d_model=a.d_model, seed=a.seed, lr=a.lr, steps_done=0,
               epochs_done=0, wall_s=None, val_accuracy=None, best_val_accuracy=None,
               val_loss=None, curve=[], loss_curve=[], error=None)
    signal.signal(signal.SIGTERM, lambda *_: setattr(Stop, "flag", True))
    try:
        install_stubs()
        import torch
        from torch import nn, optim
        from zoology.train import Trainer
        from zoology.model import LanguageModel
        from zoology.data.utils import prepare_data
        from zoology.utils import set_determinism

        if a.mixer in ("delta_net", "gated_delta_net"):
            # zoology/mixers/gated_delta_net.py hides fla's import error behind an
            # `assert 0`; import what it imports first, so the real error shows
            import fla
            from fla.modules import FusedRMSNormSwishGate, RMSNorm, ShortConvolution  # noqa
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: F401
            rec["fla_version"] = getattr(fla, "__version__", None)
        if a.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(a.device))
            if a.mem_fraction:
                torch.cuda.set_per_process_memory_fraction(a.mem_fraction)
        train_examples, epochs, spe = plan(a)
        config = build_configs(a, a.mixer, a.lr, a.seed, train_examples, epochs)
        rec.update(train_examples=train_examples, max_epochs=epochs, steps_per_epoch=spe,
                   steps_planned=epochs * spe, batch_size=a.batch_size,
                   config=config.model_dump())
        print(f"[{config.run_id}] {train_examples} train examples, {epochs} epochs x "
              f"{spe} steps = {epochs * spe} steps", flush=True)

        # the order of zoology/train.py train()
        set_determinism(config.seed)
        train_dl, test_dl = prepare_data(config.data)
        model = LanguageModel(config=config.model)
        rec["n_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        logger = Recorder(a.log_every)
        trainer = Trainer(
            model=model, train_dataloader=train_dl, test_dataloader=test_dl,
            max_epochs=config.max_epochs, learning_rate=config.learning_rate,
            weight_decay=config.weight_decay,
            early_stopping_metric=config.early_stopping_metric,
            early_stopping_threshold=config.early_stopping_threshold,
            slice_keys=config.slice_keys, device=a.device, logger=logger,
        )
        deadline = min(a.deadline - a.eval_reserve_s, time.time() + a.run_budget_s) \
            if a.run_budget_s else a.deadline - a.eval_reserve_s
        trainer.train_dataloader = DeadlineLoader(train_dl, deadline)

        # Trainer.fit, with the deadline and the curve added
        t_train = time.time()
        trainer.model.to(trainer.device)
        trainer.loss_fn = nn.CrossEntropyLoss()
        trainer.optimizer = optim.AdamW(trainer.model.parameters(),
                                        lr=trainer.learning_rate,
                                        weight_decay=trainer.weight_decay)
        trainer.scheduler = optim.lr_scheduler.CosineAnnealingLR(
            trainer.optimizer, T_max=trainer.max_epochs, eta_min=0.0)
        early = False
        for epoch_idx in range(trainer.max_epochs):
            trainer.train_epoch(epoch_idx)
            metrics = trainer.test(epoch_idx)
            rec["epochs_done"] = epoch_idx + 1
            last = logger.evals[-1]
            print(f"[{config.run_id}] epoch {epoch_idx} step {last['step']} loss "
                  f"{last['loss'] if last['loss'] is None else round(last['loss'], 4)} "
                  f"val_loss {last['val_loss']:.4f} acc {last['acc']:.4f} "
                  f"t {time.time() - t0:.0f}s", flush=True)
            if trainer.train_dataloader.cut:
                break
            if (trainer.early_stopping_metric is not None) and metrics[
                    trainer.early_stopping_metric] > trainer.early_stopping_threshold:
                print(f"[{config.run_id}] early stopping at epoch {epoch_idx}: "
                      f"{metrics[trainer.early_stopping_metric]:.4f}", flush=True)
                early = True
                break
            trainer.scheduler.step()
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()
        t_end = time.time()
        rec.update(steps_done=logger.step, train_s=t_end - t_train,
                   first_step_s=(logger.t_step1 - t_train) if logger.t_step1 else None,
                   early_stopped=early, cut_by_deadline=trainer.train_dataloader.cut,
                   stopped_by_signal=Stop.flag,
                   val_accuracy=logger.evals[-1]["acc"] if logger.evals else None,
                   val_loss=logger.evals[-1]["val_loss"] if logger.evals else None,
                   best_val_accuracy=max(e["acc"] for e in logger.evals)
                   if logger.evals else None,
                   curve=logger.evals, loss_curve=logger.loss_curve)
        if a.device.startswith("cuda"):
            rec["max_mem_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
    except BaseException:
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        rec["error"] = "\n".join(tb.strip().splitlines()[-25:])
    rec["wall_s"] = time.time() - t0
    with open(a.result_file + ".tmp", "w") as f:
        json.dump(rec, f, indent=1, default=str)
    os.replace(a.result_file + ".tmp", a.result_file)
    return 0 if rec["error"] is None else 1


# --------------------------------------------------------------- the parent ------------
def common_args(a):
    return [f"--d_model={a.d_model}", f"--steps={a.steps}", f"--epochs={a.epochs}",
            f"--train_examples={a.train_examples}", f"--test_examples={a.test_examples}",
            f"--batch_size={a.batch_size}", f"--test_batch_size={a.test_batch_size}",
            f"--input_seq_len={a.input_seq_len}", f"--num_kv_pairs={a.num_kv_pairs}",
            f"--vocab_size={a.vocab_size}", f"--random_non_queries={a.random_non_queries}",
            f"--data_seed={a.data_seed}", f"--based_feature_dim={a.based_feature_dim}",
            f"--early_stop={a.early_stop}", f"--log_every={a.log_every}",
            f"--eval_reserve_s={a.eval_reserve_s}", f"--run_budget_s={a.run_budget_s}",
            f"--device={a.device}", f"--mem_fraction={a.mem_fraction}",
            f"--cache_dir={a.cache_dir}"]


def tail(path, n=25):
    try:
        with open(path, errors="replace") as f:
            return "\n".join(f.read().replace("\r", "\n").strip().splitlines()[-n:])
    except OSError:
        return ""


def table(results):
    rows = [("mixer", "d", "seed", "lr", "steps", "epochs", "wall_s", "val_acc", "best",
             "val_loss", "status")]
    for r in results:
        st = "ERROR" if r.get("error") else ("early" if r.get("early_stopped") else
                                             ("cut" if r.get("cut_by_deadline") else "done"))
        f = lambda v, p: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
        rows.append((r["mixer"], str(r["d_model"]), str(r["seed"]), f"{r['lr']:.3g}",
                     str(r.get("steps_done", 0)), str(r.get("epochs_done", 0)),
                     f(r.get("wall_s"), 0), f(r.get("val_accuracy"), 4),
                     f(r.get("best_val_accuracy"), 4), f(r.get("val_loss"), 4), st))
    w = [max(len(x[i]) for x in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w[i]) for i, c in enumerate(row)) for row in rows)


def parent(a):
    t0 = time.time()
    deadline = t0 + a.budget_s
    os.makedirs(os.path.join(a.out, "runs"), exist_ok=True)
    os.makedirs(os.path.join(a.out, "logs"), exist_ok=True)
    if not a.cache_dir:  # not under OUT: 100k examples are ~0.4 GB
        a.cache_dir = "/tmp/zoology_anchor_data"
    mixers = [m for m in a.mixers.split(",") if m]
    for m in mixers:
        if m not in MIXERS:
            raise SystemExit(f"unknown mixer {m}; known: {MIXERS}")
    seeds = [int(s) for s in a.seeds.split(",") if s]
    lrs = [float(x) for x in a.lrs.split(",") if x]
    jobs = [(m, s, lr) for m in mixers for lr in lrs for s in seeds]
    n, epochs, spe = plan(a)
    print(f"zoology anchor: {len(jobs)} runs, {n} train examples, {epochs} epochs x {spe} "
          f"steps = {epochs * spe} steps, batch {a.batch_size}, parallel {a.parallel}, "
          f"budget {a.budget_s:.0f}s", flush=True)
    try:
        with open(os.path.join(os.path.dirname(HERE), "../../../.jobs/zoology/COMMIT")) as f:
            commit = f.read().strip()
    except OSError:
        commit = None
    meta = dict(zoology_commit=commit, argv=sys.argv, train_examples=n, epochs=epochs,
                steps_per_epoch=spe, budget_s=a.budget_s)
    env = dict(os.environ)
    if not a.tqdm:
        env["TQDM_DISABLE"] = "1"

    # generate the data once (Zoology's on-disk cache, keyed by its config and seed), so
    # that the runs load it instead of each drawing 100k examples at once
    if not a.no_pregen:
        cmd = [sys.executable, HERE, "--pregen", *common_args(a)]
        rc = subprocess.run(cmd, env=env).returncode
        print(f"data pre-generation rc={rc} ({time.time() - t0:.0f}s)", flush=True)

    results, running, queue = {}, {}, list(jobs)

    def name(job):
        m, s, lr = job
        return f"{m}_d{a.d_model}_lr{lr:.3e}_s{s}"

    def collect(job, p, rc):
        nm = name(job)
        rf = os.path.join(a.out, "runs", nm + ".json")
        try:
            with open(rf) as f:
                r = json.load(f)
        except (OSError, ValueError):
            m, s, lr = job
            r = dict(mixer=m, d_model=a.d_model, seed=s, lr=lr, steps_done=0,
                     wall_s=time.time() - p["t"], val_accuracy=None, curve=[],
                     error=f"no result file (rc={rc})\n" + tail(p["log"]))
        r["rc"] = rc
        results[job] = r
        if r.get("error"):
            print(f"--- {nm} FAILED (rc={rc}); traceback tail:\n{r['error']}\n--- log "
                  f"tail:\n{tail(p['log'], 12)}\n---", flush=True)
        else:
            print(f"--- {nm}: {r['steps_done']} steps, val_accuracy {r['val_accuracy']:.4f}"
                  f", {r['wall_s']:.0f}s", flush=True)
        write(meta, results, jobs, a)

    while queue or running:
        now = time.time()
        while queue and len(running) < a.parallel and now < deadline - a.min_start_s:
            job = queue.pop(0)
            m, s, lr = job
            nm = name(job)
            log = os.path.join(a.out, "logs", nm + ".log")
            cmd = [sys.executable, HERE, "--child", f"--mixer={m}", f"--seed={s}",
                   f"--lr={lr}", f"--deadline={deadline}",
                   f"--result_file={os.path.join(a.out, 'runs', nm + '.json')}",
                   *common_args(a)]
            fh = open(log, "w")
            pr = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
            running[job] = dict(p=pr, fh=fh, log=log, t=time.time(), term=None)
            print(f"start {nm} (pid {pr.pid})", flush=True)
        if queue and time.time() >= deadline - a.min_start_s and not running:
            break
        time.sleep(0.5)
        for job, p in list(running.items()):
            rc = p["p"].poll()
            if rc is None:
                # past the deadline plus grace: ask it to stop (SIGTERM: it ends its epoch,
                # evaluates and writes), then kill it
                if time.time() > deadline + a.grace_s and p["term"] is None:
                    p["p"].send_signal(signal.SIGTERM)
                    p["term"] = time.time()
                elif p["term"] is not None and time.time() > p["term"] + a.grace_s:
                    p["p"].kill()
                continue
            p["fh"].close()
            del running[job]
            collect(job, p, rc)
    for job in queue:
        m, s, lr = job
        results[job] = dict(mixer=m, d_model=a.d_model, seed=s, lr=lr, steps_done=0,
                            wall_s=0.0, val_accuracy=None, curve=[],
                            error="not started: budget")
    write(meta, results, jobs, a)
    print(table([results[j] for j in jobs if j in results]), flush=True)
    print(f"total {time.time() - t0:.0f}s; {os.path.join(a.out, 'zoology_anchor.json')}")
    return 0


def write(meta, results, jobs, a):
    out = dict(meta, runs=[results[j] for j in jobs if j in results])
    p = os.path.join(a.out, "zoology_anchor.json")
    with open(p + ".tmp", "w") as f:
        json.dump(out, f, indent=1, default=str)
    os.replace(p + ".tmp", p)


def pregen(a):
    install_stubs()
    from zoology.data.utils import prepare_data
    n, epochs, _ = plan(a)
    config = build_configs(a, "attention", 1e-3, 0, n, epochs)
    t = time.time()
    prepare_data(config.data)  # builds (and caches) every segment
    print(f"data ready in {time.time() - t:.0f}s at {config.data.cache_dir}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mixers", default="attention,based,gated_delta_net")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--lrs", default="1e-4,4.6415888e-4,2.1544347e-3,1e-2",
                    help="default: iclr24_zoology_figure2 numpy.logspace(-4, -2, 4)")
    ap.add_argument("--steps", type=int, default=25024,
                    help="training steps (sets the number of training examples)")
    ap.add_argument("--epochs", type=int, default=64, help="Zoology max_epochs")
    ap.add_argument("--train_examples", type=int, default=0,
                    help="if set, overrides --steps (Zoology figure 2: 100000)")
    ap.add_argument("--test_examples", type=int, default=3000)
    ap.add_argument("--batch_size", type=int, default=256)
    ap.add_argument("--test_batch_size", type=int, default=256)
    ap.add_argument("--d_model", type=int, default=128)
    ap.add_argument("--input_seq_len", type=int, default=256)
    ap.add_argument("--num_kv_pairs", type=int, default=16)
    ap.add_argument("--vocab_size", type=int, default=8192)
    ap.add_argument("--random_non_queries", type=int, default=0)
    ap.add_argument("--data_seed", type=int, default=123)
    ap.add_argument("--based_feature_dim", type=int, default=8)
    ap.add_argument("--early_stop", type=float, default=0.99,
                    help="Zoology's early_stopping_threshold on valid/accuracy; 0: off")
    ap.add_argument("--budget_s", type=float, default=540.0)
    ap.add_argument("--min_start_s", type=float, default=30.0,
                    help="start no run later than this before the budget ends")
    ap.add_argument("--eval_reserve_s", type=float, default=10.0,
                    help="a run stops training this long before the deadline")
    ap.add_argument("--run_budget_s", type=float, default=0.0,
                    help="per-run wall limit (0: only the global budget)")
    ap.add_argument("--grace_s", type=float, default=20.0)
    ap.add_argument("--parallel", type=int, default=3)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--mem_fraction", type=float, default=0.0)
    ap.add_argument("--log_every", type=int, default=100)
    ap.add_argument("--cache_dir", default="")
    ap.add_argument("--no_pregen", action="store_true")
    ap.add_argument("--tqdm", action="store_true", help="keep Zoology's tqdm bars")
    ap.add_argument("--out", default="runs/zoology_anchor")
    # internal
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--pregen", action="store_true")
    ap.add_argument("--mixer")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--deadline", type=float, default=float("inf"))
    ap.add_argument("--result_file")
    a = ap.parse_args()
    a.cache_dir = a.cache_dir or None if (a.child or a.pregen) else a.cache_dir
    if a.child:
        return child(a)
    if a.pregen:
        return pregen(a)
    return parent(a)


if __name__ == "__main__":
    sys.exit(main())
