"""Population training: the runs of one config that differ only in lr and seed, trained
together in one jitted program.

    python -m training.population --config=configs/mqar.py --workdir=runs/pop \\
        --lrs=1e-3,3e-3 --seeds=0,1,2 [--config.KEY=VALUE ...]

Member (lr, seed) is the run `train.py --config.train.lr=lr --config.train.seed=seed`
would be, and computes the same losses: it is initialised from its own seed, reads its
own seed's data stream (dataset.batch(step) of data.build(seed)), keys dropout from
(seed, step) and follows its own lr schedule. What is shared is the program: every
member's parameters and optimizer state are stacked on a new leading axis and one
jax.vmap of training.step's train step updates them all, so small models fill a GPU.

Each member has a workdir of its own, WORKDIR/lr{lr}_seed{seed}/, laid out as train.py's
(config.json, metrics.jsonl, checkpoints/): the eval commands and sweeps read a member as
they read a run, and a member can even be carried on alone by train.py. All members that
still train are saved at the same steps (when any one of them has to save), so a killed
population resumes from one step that every member has. A member that stops early, or
whose loss or parameters become non-finite, is frozen (its update masked off inside the
step) while the others go on, and leaves the stacked step at the next evaluation where
that saves more than compiling the smaller step costs (`park`; its state kept apart, so
the step computes only members still training); a non-finite member is not saved after
its last finite checkpoint (as train.py stops without saving) and is recorded in
WORKDIR/population.json so that a resume leaves it out.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import pathlib
import signal
import sys
import time
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from training import (builders, checkpoint, config_tools, loop, metrics, model_state, optim,
                      param_layout, runtime, workdir_lock, workdir_tokenizer)
from training import step as step_fns

POPULATION_FILE = "population.json"
PARK_MODES = ("auto", "always", "never")


def worth_parking(rows: int, training: int, steps_left: int, step_s: float | None,
                  compile_s: float | None, margin: float = 2.0) -> bool:
    """Whether a step of `training` rows instead of `rows` pays for its compilation:
    taking the step's time as proportional to its rows (an upper bound on the saving
    where the rows leave a GPU partly idle), the time saved, steps_left x step_s x
    (rows - training) / rows, must exceed margin x compile_s. On a GPU a population's
    step compiles in about a minute, so parking members with a few hundred steps left
    would cost more than it saves; on a CPU it compiles in seconds. Not yet measured
    (None): yes (at a start, the step compiles anyway)."""
    if step_s is None or compile_s is None:
        return True
    return steps_left * step_s * (rows - training) / rows > margin * compile_s


class Member(NamedTuple):
    """One (lr, seed) of the population: its config (train.lr and train.seed set) and
    its train.py-style workdir."""
    lr: float
    seed: int
    config: Any
    workdir: pathlib.Path


def member_name(lr: float, seed: int) -> str:
    return f"lr{lr:g}_seed{seed}"


def make_members(config, workdir, lrs: Sequence[float],
                 seeds: Sequence[int]) -> list[Member]:
    """Members in lr-major order (lrs[0] x seeds, then lrs[1] x seeds, ...)."""
    if not lrs or not seeds:
        raise config_tools.ConfigError("a population needs at least one lr and one seed")
    pairs = [(float(lr), int(seed)) for lr in lrs for seed in seeds]
    if len(set(pairs)) != len(pairs):
        raise config_tools.ConfigError(
            f"lrs {list(lrs)} x seeds {list(seeds)} repeat a member")
    members = []
    for lr, seed in pairs:
        c = config.copy_and_resolve_references()
        config_tools.set_values(c, {"train.lr": lr, "train.seed": seed})
        members.append(Member(lr, seed, c, pathlib.Path(workdir) / member_name(lr, seed)))
    return members


def train_population(config, workdir: str, lrs: Sequence[float], seeds: Sequence[int], *,
                     stop_at: int | None = None, park: str = "auto") -> list[dict]:
    """Trains (or resumes) the population in `workdir`; returns one result per member, in
    make_members' order: train.py's final eval metrics plus lr, seed, workdir and
    `status` ("done", "stopped early" or "diverged at step s").

    stop_at: after this many steps save and raise loop.Interrupted, as a SIGTERM would
    (a kill at a known step, for tests).
    park: whether members that stop leave the stacked step: "auto" where it pays for
    compiling the smaller step (worth_parking), "always", or "never" (they stay in it,
    frozen). The members' losses are the same either way."""
    if park not in PARK_MODES:
        raise config_tools.ConfigError(f"park: choose one of {PARK_MODES}, not {park!r}")
    config_tools.check_config(config)
    members = make_members(config, workdir, lrs, seeds)
    for m in members:  # a negative lr, say, is named as train.py names it
        config_tools.check_config(m.config)
    if jax.process_count() > 1:
        # The members' batches are built whole on the host and placed by jit, which is
        # right only when one process sees every device.
        raise config_tools.ConfigError("population training runs in one process; start "
                                       "one population per host instead")
    with jax.default_prng_impl(config_tools.prng_impl(config)):
        try:
            return _train_population(config, pathlib.Path(workdir), members, stop_at,
                                     park)
        except (checkpoint.CheckpointSaveFailed, workdir_lock.WorkdirLocked,
                workdir_tokenizer.TokenizerMismatch) as e:
            raise loop.TrainingError(str(e)) from e


# --------------------------------------------------------------------------- the members
class _MemberRun:
    """A member's run state on the host: its step, early stopping, saver and sinks."""

    def __init__(self, member: Member, early: loop._EarlyStop, step: int, restored: bool,
                 saver: loop._Saver, sinks: metrics.Sinks, steps: runtime.Steps, schedule):
        self.member, self.early, self.step, self.restored = member, early, step, restored
        self.start = step
        self.saver, self.sinks, self.steps, self.schedule = saver, sinks, steps, schedule
        self.diverged_at: int | None = None
        self.final_recorded = False  # its final evaluation is in metrics.jsonl

    @property
    def active(self) -> bool:
        return self.diverged_at is None and not self.early.stopped


def _read_population(workdir: pathlib.Path) -> dict:
    path = workdir / POPULATION_FILE
    return json.loads(path.read_text()) if path.exists() else {"diverged": {}}


def _write_population(workdir: pathlib.Path, record: dict) -> None:
    tmp = workdir / (POPULATION_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True))
    tmp.replace(workdir / POPULATION_FILE)  # atomic: a kill never leaves half a file


class _FreshStates:
    """A member's fresh start, as runtime.init_fresh gives its separate run, from one
    compiled init for every seed (model_state.seeded_init) and one compiled optimizer
    init; each seed's is built once and shared by its members (the lrs of one seed start
    from the same parameters). One optimizer init serves every lr: its state holds no lr
    (zero moments and counts; training.optim uses no inject_hyperparams)."""

    def __init__(self, model_cfg, model: runtime.Model, layout: runtime.Layout):
        self._init = model_state.seeded_init(builders.seeded_model_factory(model_cfg),
                                             layout.params, layout.replicated)
        self._opt_init = jax.jit(model.tx.init, out_shardings=layout.opt_state)
        self._by_seed: dict[int, tuple] = {}

    def __call__(self, seed: int) -> tuple[dict, Any, Any]:
        """(params, opt_state, rest) of a fresh start of `seed`."""
        if seed not in self._by_seed:
            params, rest = self._init(seed)
            self._by_seed[seed] = (params, self._opt_init(params), rest)
        return self._by_seed[seed]


def _restore_member(ckpt, fresh, layout: runtime.Layout, model: runtime.Model,
                    new_early, model_section: dict, at_most: int | None):
    """(loop._State, rest, meta or None) of the newest step <= at_most that passes its
    checks (all steps when at_most is None), as loop._restore_or_init restores a run;
    damaged newer steps are set aside. fresh(): the member's fresh (params, opt_state,
    rest)."""
    candidates = [s for s in ckpt.all_steps()[::-1] if at_most is None or s <= at_most]
    if not candidates:
        params, opt_state, rest = fresh()
        return loop._State(params, opt_state, 0, new_early()), rest, None
    rest = fresh()[2]
    for step in candidates:
        try:
            ckpt.check_compatible(step, model.shapes, model_section)
            params, opt_state, meta = param_layout.restore(
                ckpt, step, loop._placed(model.params, layout.params),
                loop._placed(model.opt_state, layout.opt_state))
        except checkpoint.CheckpointDamaged as e:
            moved = ckpt.set_aside(e.step)
            print(f"{e}; moved to {moved}", file=sys.stderr, flush=True)
            continue
        early = new_early(meta.get("early_stop"))
        return loop._State(params, opt_state, step, early), rest, meta
    raise loop.TrainingError(f"no checkpoint in {ckpt.directory} can be read")


def _restore_all(ckpts, freshes, models, layout, new_early, model_section,
                 diverged: list[bool]):
    """Every member restored at one population step: the newest step that all members
    still training have (a kill between two members' saves leaves some a step ahead;
    they go back to the common one). A member stopped early at or before that step
    stays at its stop; a diverged member is restored (for its results) but frozen.
    freshes[i](): member i's fresh (params, opt_state, rest)."""
    first = [_restore_member(c, f, layout, m, new_early, model_section, None)
             for c, f, m in zip(ckpts, freshes, models)]
    going = [st.step for (st, _, _), gone in zip(first, diverged)
             if not st.early.stopped and not gone]
    target = min(going) if going else None
    out = []
    for (st, rest, meta), c, f, m in zip(first, ckpts, freshes, models):
        if target is not None and st.step > target:
            st, rest, meta = _restore_member(c, f, layout, m, new_early, model_section,
                                             target)
            if st.step != target and not st.early.stopped:
                raise loop.TrainingError(
                    f"{c.directory} has no checkpoint at step {target}, the step the "
                    f"population's other members resume from; resume it alone with "
                    f"train.py, or use another --workdir")
        out.append((st, rest, meta))
    return out


# ------------------------------------------------------------------------ the steps
def _leading(sharding, mesh):
    """A member-stacked array's sharding: members on a new leading, replicated axis."""
    spec = getattr(sharding, "spec", jax.sharding.PartitionSpec())
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, *spec))


def _compile(model: runtime.Model, layout: runtime.Layout, t_cfg, mesh,
             rows: step_fns.Rows, schedules: list):
    """(train, eval): the train step vmapped over members,
    train(params, opt_state, rests, batches, slots, index, active, base_keys, step) ->
    (params, opt_state, metrics with "active"), and eval(params, rests, batch) -> [M, 3]
    loss sums. batches: one batch per seed stacked, slots[i] member i's seed's place in
    it (the members of one seed read one batch: sent once, not once per lr).
    Member i's keys of step s are its separate run's (runtime.Steps.keys
    of base_keys[i]), folded inside the program rather than one dispatch per member.

    Member i's lr is its own schedule, picked by its index: every schedule is computed
    with its Python-constant lr, exactly the ops of member i's separate run, and the
    pick is exact; a traced lr would not be (optax derives the cosine's floor as
    end / peak in Python, which a traced peak cannot do).

    Measured on CPU: a member's gradients at given parameters are bitwise its separate
    run's, but XLA compiles the vmapped (batched-shape) optimizer update into other
    loops, which round a few elements an ulp differently; tiny-MQAR losses then differ
    by at most 2 float32 ulps over 12 steps and 1.2e-6 over 150."""
    lead = lambda tree: jax.tree.map(lambda s: _leading(s, mesh), tree)
    repl = _leading(layout.replicated, mesh)

    def member_step(params, opt_state, rest, batches, slot, index, active, base_key,
                    step_index):
        batch = jax.tree.map(lambda x: x[slot], batches)  # the member's seed's batch
        # The keys a separate run's step takes, by the same rule (runtime.Steps).
        keyed = runtime.Steps(None, None, base_key, model.redraw_every)
        keys = keyed.keys(step_index)
        def schedule(count):
            return jnp.stack([s(count) for s in schedules])[index]
        tx, _ = optim.make_optimizer(t_cfg, model.params, model.logical, schedule=schedule)
        parts = model_state.ModelParts(model.graphdef, model.template, rest, model.names,
                                       model.logical, model.shapes)
        step = step_fns.make_train_step(parts, tx, t_cfg.grad_accum, mesh, rows)
        new_params, new_opt, m = step(params, opt_state, batch, *keys)
        # A frozen member (stopped early, or non-finite now or before) keeps its state:
        # where() passes an active member's new values through bit for bit.
        keep = active & m["finite"]
        pick = lambda new, old: jnp.where(keep, new, old)
        return (jax.tree.map(pick, new_params, params),
                jax.tree.map(pick, new_opt, opt_state), dict(m, active=keep))

    def member_eval(params, rest, batch):
        parts = model_state.ModelParts(model.graphdef, model.template, rest, model.names,
                                       model.logical, model.shapes)
        step = step_fns.make_eval_step(parts, rows)
        return jnp.stack(step(params, batch))

    train = jax.jit(jax.vmap(member_step, in_axes=(0, 0, 0, None, 0, 0, 0, 0, None)),
                    in_shardings=(lead(layout.params), lead(layout.opt_state), repl,
                                  _leading(layout.batch, mesh), repl, repl, repl, repl,
                                  layout.replicated),
                    out_shardings=(lead(layout.params), lead(layout.opt_state), repl),
                    donate_argnums=(0, 1))
    evaluate = jax.jit(jax.vmap(member_eval),
                       in_shardings=(lead(layout.params), repl,
                                     _leading(layout.batch, mesh)),
                       out_shardings=repl)
    return train, evaluate


def _stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _member(tree, i: int):
    return jax.tree.map(lambda x: x[i], tree)


# ------------------------------------------------------------------------- the run
def _train_population(config, workdir: pathlib.Path, members: list[Member],
                      stop_at, park: str) -> list[dict]:
    t_cfg = config.train
    lrs = sorted({m.lr for m in members})
    seeds = sorted({m.seed for m in members})
    datasets = {}
    for m in members:  # one data stream per seed, as each separate run builds it
        if m.seed not in datasets:
            datasets[m.seed], model_cfg = loop._dataset_and_model_config(m.config)
    # The members' step is vmapped: cuDNN attention needs its segment masks per head there.
    model_cfg = dataclasses.replace(model_cfg, mask_every_head=True)
    mesh = runtime.make_mesh(config)
    described = [runtime.describe_model(m.config, model_cfg, mesh) for m in members]
    models = [d[0] for d in described]
    layout = described[0][1]
    rows = step_fns.Rows.of(datasets[members[0].seed])
    new_early = loop.early_stop_rule(t_cfg)
    keep_best = bool(t_cfg.get("keep_best", True))
    n_params = model_state.num_params(models[0].shapes)

    with contextlib.ExitStack() as opened:
        opened.enter_context(workdir_lock.held(workdir))
        for m in members:  # a train.py run on a member's workdir stops at its lock
            opened.enter_context(workdir_lock.held(m.workdir))
        opened.enter_context(checkpoint.orbax_records_hidden())
        record = _read_population(workdir)
        ckpts = [opened.enter_context(contextlib.closing(checkpoint.Checkpointer(
            m.workdir, keep=t_cfg.keep_checkpoints, async_save=t_cfg.async_checkpoints,
            keep_best=keep_best))) for m in members]
        fresh = _FreshStates(model_cfg, models[0], layout)
        freshes = [functools.partial(fresh, m.seed) for m in members]
        restored = _restore_all(ckpts, freshes, models, layout, new_early,
                                config.model.to_dict(),
                                [member_name(m.lr, m.seed) in record["diverged"]
                                 for m in members])
        runs, states, rests = [], [], []
        for m, model, ckpt, (st, rest, meta) in zip(members, models, ckpts, restored):
            if meta is not None:
                config_tools.check_resume(meta.get("config"), m.config, m.workdir, st.step)
            workdir_tokenizer.check_or_save(m.workdir, datasets[m.seed].tokenizer,
                                            resuming=meta is not None, cfg_data=m.config.data)
            config_tools.save_config(m.config, m.workdir)
            log = opened.enter_context(contextlib.closing(metrics.MetricsFile(
                m.workdir, resume_step=st.step if meta is not None else None)))
            sinks = metrics.Sinks(log, metrics.WandbLogger(
                m.workdir, mode="disabled", project="", name="", config={}), _Silent())
            saver = loop._Saver(ckpt, m.config, last_saved=st.step if meta else None,
                                keep_best=keep_best)
            steps = runtime.compile_steps(model, rest, layout, m.config.train, mesh, rows)
            run = _MemberRun(m, st.early, st.step, meta is not None, saver, sinks, steps,
                             model.schedule)
            run.diverged_at = record["diverged"].get(member_name(m.lr, m.seed))
            runs.append(run)
            states.append(st)
            rests.append(rest)
        # Members on a new leading axis, replicated over it (each member's arrays keep
        # their own layout on the mesh).
        lead = lambda tree: jax.tree.map(lambda sh: _leading(sh, mesh), tree)
        params = jax.device_put(_stack([st.params for st in states]), lead(layout.params))
        opt_state = jax.device_put(_stack([st.opt_state for st in states]),
                                   lead(layout.opt_state))
        rests = jax.device_put(_stack(rests), _leading(layout.replicated, mesh))
        del states, restored
        train, evaluate = _compile(models[0], layout, t_cfg, mesh, rows,
                                   [model.schedule for model in models])
        going = [r.step for r in runs if r.active]
        start = min(going) if going else t_cfg.steps
        where = f"resuming from step {start}" if start else "starting fresh"
        print(f"population of {len(members)} (lrs {list(lrs)} x seeds {list(seeds)}; "
              f"members in order: {', '.join(m.workdir.name for m in members)}); "
              f"{n_params:,} parameters each; {where}", file=sys.stderr, flush=True)
        progress = opened.enter_context(contextlib.closing(metrics.Progress(
            config.logging.progress, start, t_cfg.steps)))
        stop = opened.enter_context(loop._signals_caught())
        pop = _Population(runs, datasets, t_cfg, train, evaluate, params, opt_state, rests,
                          workdir, record, progress,
                          loop._Speed(config, model_cfg, n_params, start),
                          (lead(layout.params), lead(layout.opt_state),
                           _leading(layout.replicated, mesh)), park)
        pop.run(start, stop, stop_at)
        return pop.finish()


class _Silent:
    """A member's terminal: silent, the population shows one line for all members."""

    def update(self, n=1):
        pass

    def show(self, entry):
        pass

    def write(self, text):
        pass


class _Population:
    """The stacked state and the loop over steps: loop._run_steps for M members.

    The stacked arrays hold the members in `live` (member order): a member that stops
    early or diverges is parked (its state kept apart) at the next evaluation where
    `park` and worth_parking say so, so that the step stops computing it; a frozen
    member inside the step costs as much as a training one, and in a sweep the members
    of the best lrs stop first. Each new member count compiles the step once."""

    def __init__(self, runs, datasets, t_cfg, train, evaluate, params, opt_state, rests,
                 workdir, record, progress, speed, shardings, park: str):
        # shardings: the stacked params', opt_state's, and [M] arrays' (replicated).
        self.param_sharding, self.opt_sharding, self.member_sharding = shardings
        self.runs, self.datasets, self.t_cfg = runs, datasets, t_cfg
        self.train, self.evaluate = train, evaluate
        self.params, self.opt_state = params, opt_state
        self.all_rests = rests
        self.workdir, self.record = workdir, record
        self.progress, self.speed = progress, speed
        self.all_base_keys = jnp.stack([r.steps.base_key for r in runs])
        self.seeds = sorted(datasets)
        self.all_slots = np.asarray([self.seeds.index(r.member.seed) for r in runs],
                                    np.int32)
        self.pending: list[tuple[int, list[bool], list[int], Any]] = []
        self._eval_batches = None
        self.live = list(range(len(runs)))  # the member of each stacked row
        self.parked: dict[int, tuple] = {}  # member -> (params, opt_state), not training
        self.park = park
        # The step's cost at the current row count, for worth_parking: the wall time of
        # its first call (compiling it) and of a step since then (measured at evaluations).
        self.compile_s: float | None = None
        self.step_s: float | None = None
        # (time, step) at the end of this row count's first step; None until it has run
        self._steady: tuple[float, int] | None = None
        self._set_rows()
        self._compact(steps_left=None)

    def _set_rows(self):
        """The per-row inputs of the step for the rows in self.live, placed as the step
        places them (an unplaced array would compile the step again)."""
        rows = np.asarray(self.live)
        put = lambda x: jax.device_put(x, self.member_sharding)
        self.index = put(rows.astype(np.int32))
        self.slots = put(self.all_slots[rows])
        self.base_keys = put(self.all_base_keys[rows])
        self.rests = put(jax.tree.map(lambda x: x[rows], self.all_rests))
        self._set_active()

    def _set_active(self):
        # Placed as the step's output `active` is, so that passing either one back in
        # finds the same compiled step.
        self.active = jax.device_put(np.asarray([self.runs[i].active for i in self.live]),
                                     self.member_sharding)

    def _compact(self, steps_left: int | None):
        """Parks the stacked rows of members no longer training (while any still is) where
        self.park says so; otherwise they stay in the step, frozen by its `active` mask.
        steps_left None: a start, before the step has compiled."""
        keep = [row for row, i in enumerate(self.live) if self.runs[i].active]
        if not keep or len(keep) == len(self.live):
            return
        if self.park == "never":
            worth = False
        elif self.park == "always" or steps_left is None:
            worth = True
        else:
            worth = worth_parking(len(self.live), len(keep), steps_left, self.step_s,
                                  self.compile_s)
        if not worth:
            self._set_active()
            return
        for row, i in enumerate(self.live):
            if not self.runs[i].active:
                self.parked[i] = (_member(self.params, row), _member(self.opt_state, row))
        rows = np.asarray(keep)
        self.params = jax.device_put(jax.tree.map(lambda x: x[rows], self.params),
                                     self.param_sharding)
        self.opt_state = jax.device_put(jax.tree.map(lambda x: x[rows], self.opt_state),
                                        self.opt_sharding)
        self.live = [self.live[row] for row in keep]
        self._set_rows()
        self._steady, self.step_s = None, None

    def _member_state(self, i: int) -> tuple:
        """(params, opt_state) of member i, parked or stacked."""
        if i in self.parked:
            return self.parked[i]
        row = self.live.index(i)
        return _member(self.params, row), _member(self.opt_state, row)

    def _all_params(self):
        """Every member's parameters stacked in member order."""
        if not self.parked:
            return self.params
        return jax.device_put(_stack([self._member_state(i)[0]
                                      for i in range(len(self.runs))]),
                              self.param_sharding)

    # -- data
    def _batches(self, s: int):
        """Step s's batch of every seed, stacked in self.seeds' order."""
        bs = self.t_cfg.batch_size
        return jax.tree.map(lambda *xs: np.stack(xs),
                            *[self.datasets[seed].batch(s, bs) for seed in self.seeds])

    def _eval_feed(self) -> list:
        """The eval batches of every member's seed, stacked (each seed's held-out set, as
        its separate run's loop._Feed.eval gives it)."""
        if self._eval_batches is None:
            bs, n = self.t_cfg.batch_size, self.t_cfg.eval_batches
            by_seed = {seed: list(d.eval_batches(bs, n))
                       for seed, d in self.datasets.items()}
            self._eval_batches = [
                jax.tree.map(lambda *xs: np.stack(xs),
                             *[by_seed[r.member.seed][j] for r in self.runs])
                for j in range(len(next(iter(by_seed.values()))))]
        return self._eval_batches

    # -- the steps
    def run(self, start: int, stop, stop_at: int | None) -> None:
        t = self.t_cfg
        for s in range(start, t.steps):
            if not any(r.active for r in self.runs):
                return
            was_active = [r.active for r in self.runs]  # by member
            called = time.perf_counter()
            self.params, self.opt_state, m = self.train(
                self.params, self.opt_state, self.rests, self._batches(s), self.slots,
                self.index, self.active, self.base_keys, np.int32(s))
            self.active = m["active"]
            step = s + 1
            if self._steady is None:  # this row count's first step: its compilation
                jax.block_until_ready(m["loss"])
                now = time.perf_counter()
                self.compile_s, self._steady = now - called, (now, step)
            for r, a in zip(self.runs, was_active):
                if a:
                    r.step = step
            self.pending.append((step, was_active, list(self.live), m))
            self.progress.update()
            signum = stop.signum
            if signum is None and stop_at is not None and step >= stop_at:
                signum = signal.SIGTERM
            log_now = step % t.log_every == 0
            eval_now = bool(t.eval_every) and step % t.eval_every == 0 and step < t.steps
            save_now = (bool(t.checkpoint_every) and step % t.checkpoint_every == 0
                        and step < t.steps)
            if s == start:
                self.flush(log_now=log_now or step == 1)
                self.speed.restart(step)
            elif log_now or eval_now or save_now or signum is not None:
                self.flush(log_now=log_now)
            for r in self.runs:
                r.saver.check()
            if eval_now:
                self._time_steps(step)
            evaluated = self._evaluate_for_early_stop(step) if eval_now else {}
            stopping = [r for r in evaluated if r.early.stopped]
            new_best = [r for r in evaluated
                        if r.early.since_best == 0 and r.saver.keep_best]
            if save_now or stopping or new_best or signum is not None:
                # Every member still training saves at this step, so that a resume finds
                # one step all of them have.
                for i, r in enumerate(self.runs):
                    if r.diverged_at is None and r.step == step:
                        self._save(i, r, evaluated.get(r))
            if eval_now:  # the stopped (and diverged) members leave the step, if it pays
                self._compact(steps_left=t.steps - step)
            if signum is not None:
                for r in self.runs:
                    r.saver.wait()
                raise loop.Interrupted(signum, step)

    def _time_steps(self, step: int) -> None:
        """self.step_s: the mean wall time of the steps since this row count's first
        (the metrics were just fetched, so they have run)."""
        if step > self._steady[1]:
            since, first = self._steady
            self.step_s = (time.perf_counter() - since) / (step - first)

    def _save(self, i: int, r: _MemberRun, eval_loss: float | None = None) -> None:
        params, opt_state = self._member_state(i)
        state = loop._State(params, opt_state, r.step, r.early)
        r.saver.save(state, eval_loss=eval_loss)

    def flush(self, *, log_now: bool) -> None:
        """Fetches the pending metrics: a member's first non-finite step freezes it (as
        train.py stops there, without saving); the newest step is logged if asked."""
        if not self.pending:
            return
        steps = [s for s, _, _, _ in self.pending]
        actives = [a for _, a, _, _ in self.pending]
        lives = [live for _, _, live, _ in self.pending]
        values = jax.device_get([m for _, _, _, m in self.pending])
        self.pending.clear()
        for step, was_active, live, m in zip(steps, actives, lives, values):
            for row, i in enumerate(live):  # m holds the stacked rows of that step
                r = self.runs[i]
                if was_active[i] and r.diverged_at is None and not bool(m["finite"][row]):
                    self._diverged(r, step, float(m["loss"][row]))
        if log_now:
            step, m = steps[-1], values[-1]
            row_of = {i: row for row, i in enumerate(lives[-1])}
            # A member's tokens/s and MFU are its own, as its separate run would log them.
            tokens_per_s = self.speed.tokens_per_s(step)
            shown, shown_losses = [], []
            for i, r in enumerate(self.runs):
                if actives[-1][i] and r.diverged_at is None:  # active: a stacked row
                    row = row_of[i]
                    loss = float(m["loss"][row])
                    r.sinks.show({"step": step, "loss": loss,
                                  "lr": float(r.schedule(step - 1)),
                                  **self.speed.entry(tokens_per_s),
                                  "grad_norm": float(m["grad_norm"][row])})
                    shown.append(f"{loss:.4f}")
                    shown_losses.append(loss)
                else:
                    shown.append("-")
            total = tokens_per_s * sum(a for a in actives[-1])
            self._show(f"step {step}: losses {' '.join(shown)} (members in order); "
                       f"{total:.0f} tok/s in all", min(shown_losses, default=math.nan))

    def _show(self, line: str, best_loss: float) -> None:
        """The progress bar's postfix (the lowest member loss), or a line per log."""
        if self.progress.bar is not None:
            self.progress.bar.set_postfix(best_loss=f"{best_loss:.4f}", refresh=False)
        else:
            print(line, flush=True)

    def _diverged(self, r: _MemberRun, step: int, loss: float) -> None:
        r.diverged_at = step
        r.step = step - 1  # its state is that after the last finite step
        self.record["diverged"][member_name(r.member.lr, r.member.seed)] = step
        _write_population(self.workdir, self.record)
        self.progress.write(f"{r.member.workdir.name}: loss {loss} or its gradients or "
                            f"parameters non-finite at step {step}; frozen, not saved "
                            f"({r.saver.last_good()})")

    def _eval_all(self) -> np.ndarray:
        """[M, 3] (eval loss, accuracy, tokens) sums, token-weighted as loop._evaluate."""
        total = np.zeros((len(self.runs), 3))
        params = self._all_params()
        for batch in self._eval_feed():
            sums = self.evaluate(params, self.all_rests, batch)
            total += np.asarray(jax.device_get(sums))
        return total

    def _evaluate_for_early_stop(self, step: int) -> dict:
        """{member run: eval loss} of the members that trained to `step`, recorded and
        counted for early stopping."""
        total = self._eval_all()
        out = {}
        for i, r in enumerate(self.runs):
            if not r.active or r.step != step:
                continue
            entry = _eval_entry(total[i], step)
            r.sinks.record(entry)
            out[r] = entry["eval_loss"]
            if r.early.update(entry["eval_loss"], step, entry["eval_accuracy"]):
                self.progress.write(f"{r.member.workdir.name} step {step}: "
                                    f"{r.early.reason}; stopping early")
                # Its separate run would end here with its final evaluation (these
                # parameters, so this entry): recorded now, so that a population killed
                # before its end has it too.
                r.sinks.record(entry)
                r.final_recorded = True
        return out

    def finish(self) -> list[dict]:
        """train.py's ending for every member: the final eval, saved and recorded."""
        self.flush(log_now=True)
        total = self._eval_all()
        results = []
        for i, r in enumerate(self.runs):
            m = r.member
            result = {"lr": m.lr, "seed": m.seed, "workdir": str(m.workdir),
                      "step": r.step}
            if r.diverged_at is not None:
                results.append(dict(result, status=f"diverged at step {r.diverged_at}",
                                    eval_loss=math.nan, eval_accuracy=math.nan))
                continue
            entry = _eval_entry(total[i], r.step)
            self._save(i, r, entry["eval_loss"])
            if (r.step > r.start or not r.restored) and not r.final_recorded:
                r.sinks.record(entry)
            r.saver.wait()
            best = r.saver.ckpt.best_step() if r.saver.keep_best else None
            status = "stopped early" if r.early.stopped else "done"
            results.append(dict(result, **entry, best_step=best, status=status))
        return results


def _eval_entry(total: np.ndarray, step: int) -> dict:
    return {"step": step, "eval_loss": total[0] / max(total[1], 1.0),
            "eval_accuracy": total[2] / max(total[1], 1.0)}


def results_table(results: list[dict]) -> str:
    """The members as a markdown table."""
    lines = ["| lr | seed | step | eval_loss | eval_accuracy | status |",
             "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['lr']:g} | {r['seed']} | {r['step']} | {r['eval_loss']:.4f} | "
                     f"{r['eval_accuracy']:.4f} | {r['status']} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- CLI
def _main(argv):
    del argv
    from absl import flags, logging
    logging.set_verbosity(logging.WARNING)
    f = flags.FLAGS
    try:
        lrs = [float(x) for x in f.lrs.split(",") if x.strip()]
        seeds = [int(x) for x in f.seeds.split(",") if x.strip()]
    except ValueError as e:
        sys.exit(f"error: --lrs takes numbers and --seeds integers, comma-separated ({e})")
    with loop.command_errors(saved="checkpoints saved"):
        results = train_population(f.config, f.workdir, lrs, seeds, park=f.park)
    print(results_table(results), flush=True)


if __name__ == "__main__":
    from absl import app, flags
    import train as train_cli  # its --workdir and --config, and their checks
    flags.DEFINE_string("lrs", None, "Comma-separated learning rates, e.g. 1e-3,3e-3.")
    flags.DEFINE_string("seeds", "0", "Comma-separated seeds, e.g. 0,1,2.")
    flags.DEFINE_enum("park", "auto", list(PARK_MODES),
                      "Whether members that stop leave the stacked step: where it pays "
                      "for compiling the smaller step (auto), always, or never.")
    train_cli._define_config_flag()
    train_cli.precheck_argv(sys.argv)
    flags.mark_flags_as_required(["workdir", "lrs"])
    app.run(_main)
