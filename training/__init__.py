"""Training: config checking, mesh and sharding, optimizer, checkpoints, metrics, the loop.

    python train.py --config=configs/NAME.py --workdir=DIR [--config.KEY=VALUE ...]

Modules (each with one job):
  config_tools  load/check/save configs; unknown keys, wrong types and impossible values
                named early; a resume with changed seed/schedule/data refused (or recorded)
  builders      config -> dataset -> ModelConfig -> model constructor
  model_state   NNX model <-> flat {name: array} params; RNG streams keyed by (seed, step)
  sharding      mesh ("data", "fsdp", "tensor"), logical-axis rules, global batches
  optim         AdamW, warmup + cosine, clipping, weight-decay mask
  checkpoint    orbax checkpoints (atomic, async, verified, the newest k and the best)
                and load_for_eval(workdir, step=None | N | "best")
  checksum      a checksum per saved array, the same on any sharding
  workdir_lock  one writer per workdir (WORKDIR/lock: pid and host)
  metrics       metrics.jsonl, wandb (offline by default) and the terminal
  flops         FLOPs per token per mixer and MFU
  step          the train and eval steps as pure functions (also timed by eval/speed.py)
  loop          train(config, workdir): the jitted, donated, sharded steps in a loop

Known limitation (jaxlib 0.10 on CPU): gated_deltanet / deltanet with impl=chunk or
parallel can hang in XLA:CPU on a 2-core machine when batched LAPACK triangular solves run
concurrently (thread-pool starvation); `taskset -c 0 python train.py ...` or
--config.model.impl=recurrent avoids it.
"""
