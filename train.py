"""Train a language model:

    python train.py --config=configs/NAME.py --workdir=DIR [--config.KEY=VALUE ...]

Running the same command again with the same --workdir resumes from the newest complete
checkpoint. The workdir holds config.json, metrics.jsonl and checkpoints/.
Several processes (one per host): set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
JAX_PROCESS_ID (or the flags below) and start the same command on each.
"""
import os
import sys

from absl import app, flags

from training import config_tools

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Directory for config, metrics and checkpoints.")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-process).")
flags.DEFINE_integer("num_processes", None, "Number of processes (multi-process).")
flags.DEFINE_integer("process_id", None, "This process's index (multi-process).")


def _define_config_flag():
    from ml_collections import config_flags
    return config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                           lock_config=True)


def maybe_initialize_distributed():
    """jax.distributed.initialize() when flags or env ask for several processes."""
    env = os.environ
    address = FLAGS.coordinator_address or env.get("JAX_COORDINATOR_ADDRESS")
    num = FLAGS.num_processes or int(env.get("JAX_NUM_PROCESSES", "0") or 0)
    pid = FLAGS.process_id if FLAGS.process_id is not None else env.get("JAX_PROCESS_ID")
    if not address or num <= 1:
        return
    import jax
    try:  # CPU collectives across processes (jax 0.10 needs gloo said explicitly)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except Exception:
        pass
    jax.distributed.initialize(coordinator_address=address, num_processes=num,
                               process_id=int(pid) if pid is not None else None)


def precheck_argv(argv) -> None:
    """Unknown keys and wrong types, reported before absl, data or devices are touched."""
    path, overrides = config_tools.overrides_from_argv(argv[1:])
    if path is None:
        sys.exit("error: --config is required, e.g. --config=configs/mqar.py")
    try:
        config = config_tools.load_config_file(path)
        config_tools.check_overrides(config, overrides)
    except config_tools.ConfigError as e:
        sys.exit(f"error: {e}")
    if not any(a == "--workdir" or a.startswith("--workdir=") for a in argv[1:]):
        sys.exit("error: --workdir is required, e.g. --workdir=runs/mqar")


def main(argv):
    del argv
    from training import host_memory
    host_memory.keep_freed_memory()  # XLA's per-step CPU buffers stay mapped
    from absl import logging
    logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
    from training import loop

    config = FLAGS.config
    maybe_initialize_distributed()
    with loop.command_errors():
        result = loop.train(config, FLAGS.workdir)
    print(f"final: step {result['step']} eval_loss {result['eval_loss']:.4f} "
          f"eval_accuracy {result['eval_accuracy']:.4f}", flush=True)


if __name__ == "__main__":
    _define_config_flag()
    precheck_argv(sys.argv)
    flags.mark_flags_as_required(["workdir"])
    app.run(main)
