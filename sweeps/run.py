"""Architecture comparison sweep: train and evaluate a grid of runs, then tables and plots.

    python -m sweeps.run --config=configs/compare_mqar.py --workdir=runs/compare_mqar
    python -m sweeps.run --config=configs/compare_mqar.py:tiny --workdir=/tmp/cmp  # CPU

The grid is the product of the config's `settings x mixers x sizes x lrs x seeds`
(sweeps.grid); each run trains through train.py and is measured (sweeps.runner,
sweeps.tasks). It first prints its run count and an estimate of its time
(sweeps.estimate). Ctrl-C or SIGTERM reaches the run in progress, which saves a
checkpoint; the sweep exits with one line (128 + the signal). A second invocation skips
runs with `done.json` and resumes the stopped one, so a killed sweep carries on where it
stopped; `results.jsonl`, `results.md` (tables at the best lr per
setting, mixer and size) and the PNG plots are rewritten after every run
(sweeps.outputs). `--report_only --records=a/results.jsonl,b/results.jsonl` rebuilds
them with the records of other copies of the sweep (say, calls on different machines) for
the runs that have no record file here. The `speed` task trains nothing: it times each
mixer's train.py step and decoding in-process (eval.speed).
"""
from __future__ import annotations

import os
import sys

from eval import common


# A sweep estimated to take longer than this asks before it starts (on a terminal; --yes
# or a non-interactive stdin skips the question).
ASK_ABOVE_S = 3600.0


def _ask_if_long(est) -> bool:
    if est.seconds is None or est.seconds <= ASK_ABOVE_S:
        return True
    try:
        answer = input("start it? [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


@common.user_errors
def main(argv):
    del argv
    from absl import flags

    from sweeps import runner
    from training import config_tools

    f = flags.FLAGS
    cfg = config_tools.to_plain(f.config)
    if f.runner:
        cfg["runner"] = f.runner
    confirm = None if f.yes or not sys.stdin.isatty() else _ask_if_long
    if f.records and not f.report_only:
        raise ValueError("--records goes with --report_only (it only rebuilds the tables)")
    try:
        records = runner.sweep(cfg, f.workdir, max_wall_s=f.max_wall_s, only=f.only,
                               shard=f.shard, report_only=f.report_only, confirm=confirm,
                               records_from=tuple(f.records))
    except runner.SweepInterrupted as e:
        print(f"{e}.", file=sys.stderr, flush=True)
        sys.exit(128 + e.signum)
    common.print_json({"workdir": f.workdir, "finished_runs": len(records),
                       "results": os.path.join(f.workdir, "results.md")})


def precheck_argv(argv) -> None:
    """A missing config, an unknown --config.KEY or a wrong type: one line before absl
    parses the flags (as train.py checks its own)."""
    from training import config_tools

    path, overrides = config_tools.overrides_from_argv(argv[1:])
    if path is None:
        sys.exit("error: --config is required, e.g. --config=configs/compare_mqar.py:tiny")
    try:
        config_tools.check_overrides(config_tools.load_config_file(path), overrides)
    except (config_tools.ConfigError, ValueError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    from absl import app, flags
    from ml_collections import config_flags

    precheck_argv(sys.argv)

    config_flags.DEFINE_config_file("config", None,
                                    "Sweep config, e.g. configs/compare_mqar.py[:tiny].")
    flags.DEFINE_string("workdir", None,
                        "Directory of the sweep (one subdirectory per run).", required=True)
    flags.DEFINE_float("max_wall_s", 0.0,
                       "Start no new run after this many seconds (0: no limit).")
    flags.DEFINE_string("only", "", "Run only grid entries whose name contains this string "
                        "(or any of several, comma-separated).")
    flags.DEFINE_string("shard", "0/1", "i/n: run grid entries i, i+n, ... (n processes "
                        "sharing one sweep directory).")
    flags.DEFINE_bool("report_only", False, "Run nothing; rebuild the tables and plots.")
    flags.DEFINE_list("records", [], "With --report_only: results.jsonl files (e.g. of "
                      "other copies of this sweep) whose records fill in the grid's runs "
                      "that have no record file in --workdir.")
    flags.DEFINE_bool("yes", False, "Start without asking, however long the estimate (a "
                      "terminal is asked when the estimate passes an hour).")
    flags.DEFINE_enum("runner", None, ["subprocess", "inprocess"],
                      "How to train each run (default: the config's `runner`, else "
                      "subprocess).")
    flags.mark_flags_as_required(["config"])
    app.run(main)
