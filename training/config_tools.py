"""Config plumbing: load a config file, check command-line overrides and values, save
and reload, and refuse a resume that would change the run's losses (check_resume).

An experiment config is an `ml_collections.ConfigDict` returned by `get_config()` in a
Python file under configs/. It is locked, so a misspelled key fails; this module turns
those failures into one line that names the key and the nearest valid ones, *before*
anything expensive (data, model, devices) is built.
"""
from __future__ import annotations

import ast
import datetime
import difflib
import importlib.util
import json
import os
import pathlib
from typing import Any, Iterable, Mapping

CONFIG_JSON = "config.json"
CONFIG_YAML = "config.yaml"


class ConfigError(ValueError):
    """A user mistake in a config file or a --config.KEY=VALUE override."""


# ----------------------------------------------------------------------------- loading
def load_config_file(spec: str):
    """Imports `path[:arg]` and returns its `get_config([arg])`, locked."""
    path, _, arg = spec.partition(":")
    file = pathlib.Path(path)
    if not file.is_file():
        raise ConfigError(f"config file {path!r} not found; pass e.g. "
                          f"--config=configs/mqar.py")
    module_spec = importlib.util.spec_from_file_location(f"_config_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {path!r} defines no get_config()")
    config = module.get_config(arg) if arg else module.get_config()
    config.lock()
    return config


def config_with_overrides(spec: str, items: Iterable[str]):
    """The config file `spec` (load_config_file) with the scripts' short overrides,
    "SECTION.KEY=VALUE" (train.py's --config.SECTION.KEY=VALUE): checked as train.py
    checks its flags (check_overrides: unknown keys and wrong types raise ConfigError),
    each VALUE read as its key's declared type (parse_value), then the whole config
    checked (check_config)."""
    config = load_config_file(spec)
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r} is not KEY=VALUE, e.g. train.lr=1e-3")
        overrides[key] = value
    check_overrides(config, overrides)
    set_values(config, {key: parse_value(text, _field_type(config, key)[0])
                        for key, text in overrides.items()})
    check_config(config)
    return config


def parse_value(text: str, field_type):
    """An override's text as its key's declared type (what _check_value accepts):
    booleans as true/false, 1/0 or yes/no; tuples and lists as Python literals; a key of
    no declared type (object) as a Python literal where it reads as one (3, (1, 2)),
    else as the string."""
    if field_type is bool:
        return text.lower() in ("true", "1", "yes")
    if field_type in (int, float, str):
        return field_type(text)
    if field_type in (tuple, list):
        return field_type(ast.literal_eval(text))
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def flat_keys(config, prefix: str = "") -> dict[str, Any]:
    """{"train.lr": 1e-3, ...} for every leaf of a (nested) ConfigDict or mapping."""
    out = {}
    items = config.items() if hasattr(config, "items") else []
    for key, value in items:
        name = f"{prefix}{key}"
        if hasattr(value, "items") and not isinstance(value, (str, bytes)):
            out.update(flat_keys(value, name + "."))
        else:
            out[name] = value
    return out


def nearest(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    candidates = list(candidates)
    close = difflib.get_close_matches(name, candidates, n=n, cutoff=0.5)
    if not close:  # a wrong section but a right leaf name: suggest by the last component
        leaf = name.rsplit(".", 1)[-1]
        close = [c for c in candidates if c.rsplit(".", 1)[-1] == leaf][:n]
    return close


def unknown_key_message(name: str, candidates: Iterable[str]) -> str:
    close = nearest(name, candidates)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"unknown config key {name!r}{hint}"


# ----------------------------------------------------------------------------- overrides
def _parent(config, dotted: str):
    """(the section holding a dotted key, the key's last component)."""
    *sections, leaf = dotted.split(".")
    for s in sections:
        config = config[s]
    return config, leaf


def set_values(config, values: Mapping[str, Any]) -> None:
    """Sets each dotted key of `values` ({"train.lr": 1e-3}) in place, values as given."""
    for dotted, value in values.items():
        parent, leaf = _parent(config, dotted)
        parent[leaf] = value


def _field_type(config, dotted: str):
    """The declared type of a leaf: placeholders carry it in their FieldReference."""
    parent, leaf = _parent(config, dotted)
    ref = parent.get_ref(leaf) if hasattr(parent, "get_ref") else None
    if ref is not None:
        return ref.get_type(), ref.get()
    value = parent[leaf]
    return type(value), value


def _check_value(dotted: str, text: str, field_type, default) -> None:
    def fail(expected):
        raise ConfigError(
            f"--config.{dotted}={text!r}: expected {expected} (the default is {default!r})")

    if field_type is bool:
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            fail("a boolean, true or false")
    elif field_type is int:
        try:
            int(text)
        except ValueError:
            fail("an integer")
    elif field_type is float:
        try:
            float(text)
        except ValueError:
            fail("a number")
    elif field_type in (tuple, list):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            fail("a Python tuple such as (1, 2)")
        if not isinstance(value, (tuple, list)):
            fail("a Python tuple such as (1, 2)")


def check_overrides(config, overrides: Mapping[str, str]) -> None:
    """Raises ConfigError for an override naming no key, or with a value of the wrong
    type."""
    keys = flat_keys(config)
    sections = {k.rsplit(".", 1)[0] for k in keys if "." in k}
    for dotted, text in overrides.items():
        if dotted in sections:
            raise ConfigError(
                f"--config.{dotted} is a section, not a value; set one of its keys, "
                f"e.g. {', '.join(k for k in keys if k.startswith(dotted + '.'))[:200]}")
        if dotted not in keys:
            raise ConfigError(unknown_key_message(dotted, keys))
        field_type, default = _field_type(config, dotted)
        _check_value(dotted, text, field_type, default)


def overrides_from_argv(argv: Iterable[str],
                        flag: str = "config") -> tuple[str | None, dict]:
    """Finds --config=FILE and --config.KEY=VALUE (or '--config.KEY VALUE') in argv."""
    path, overrides = None, {}
    argv = list(argv)
    i = 0
    while i < len(argv):
        arg = argv[i]
        for prefix in (f"--{flag}", f"-{flag}"):
            if arg.startswith(prefix + "=") and path is None:
                path = arg[len(prefix) + 1:]
            elif arg == prefix and i + 1 < len(argv):
                path = argv[i + 1]
                i += 1
            elif arg.startswith(prefix + "."):
                body = arg[len(prefix) + 1:]
                if "=" in body:
                    key, value = body.split("=", 1)
                elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                    key, value = body, argv[i + 1]
                    i += 1
                else:  # a bare boolean flag: --config.train.remat
                    key, value = body, "true"
                overrides[key] = value
            else:
                continue
            break
        i += 1
    return path, overrides


# ----------------------------------------------------------------------------- sanity
PRNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")


def prng_impl(config) -> str:
    """The run's train.prng_impl (threefry2x32 where unset): the generator its init,
    dropout and random features draw from, so whatever rebuilds its model uses it too."""
    return config.train.get("prng_impl", PRNG_IMPLS[0])


# Keys that must be > 0, and >= 0, with what a wrong value would do (the reason a run
# refuses it rather than going on).
_POSITIVE = {
    "train.steps": "",
    "train.batch_size": "",
    "train.log_every": " (log every N steps)",
    "train.eval_batches": " (an evaluation over no batches would report a loss of 0)",
}
_NON_NEGATIVE = {
    "train.lr": " (a negative rate climbs the loss)",
    "train.checkpoint_every": " (0: only at the end)",
    "train.eval_every": " (0: only at the end)",
    "train.keep_checkpoints": " (0: keep every step)",
    "train.warmup_steps": "",
    "train.min_lr_ratio": "",
    "train.weight_decay": "",
    "train.grad_clip": " (0: no clipping)",
    "train.early_stop_patience": " (0: never stop early)",
    "data.max_documents": " (0: every document)",
}
# Data sources whose held-out set is the tail of their text (data.val_fraction).
_TEXT_SOURCES = ("files", "hf", "tfds", "store")


def _check_data(d) -> None:
    import data as data_pkg  # the list of sources is the data package's

    source = d.get("source")
    if source not in data_pkg.SOURCES:
        raise ConfigError(f"data.source={source!r}: use one of {', '.join(data_pkg.SOURCES)}")
    vf = d.get("val_fraction")
    if vf is not None:
        if not 0.0 <= vf < 1.0:
            raise ConfigError(f"data.val_fraction={vf}: must be in [0, 1)")
        if vf == 0.0 and source in _TEXT_SOURCES and not d.get("val_split"):
            raise ConfigError(
                "data.val_fraction=0 holds no text out, and the run evaluates on held-out "
                "text (every train.eval_every steps and at the end): use e.g. 0.1, or name "
                "a held-out set with data.val_split")
    kv = d.get("num_kv_pairs")
    if kv is not None:
        values = list(kv) if isinstance(kv, (list, tuple)) else [kv]
        count = lambda k: isinstance(k, int) and not isinstance(k, bool) and k > 0  # noqa
        if any(isinstance(k, (list, tuple)) for k in values):
            # Zoology's mixture of settings (data/mqar.py): [[seq_len, kv(, weight)], ...]
            ok = all(isinstance(k, (list, tuple)) and len(k) in (2, 3)
                     and count(k[0]) and count(k[1])
                     and (len(k) == 2 or (isinstance(k[2], (int, float))
                                          and not isinstance(k[2], bool) and k[2] > 0))
                     for k in values)
        else:
            ok = bool(values) and all(count(k) for k in values)
        if not ok:
            raise ConfigError(f"data.num_kv_pairs={kv!r}: use a positive integer or a list "
                              f"of them, e.g. 4 or [2, 4], or a list of [seq_len, kv, "
                              f"weight] settings, e.g. [[64, 4, 5], [256, 16, 1]]")
    errors = d.get("encoding_errors")
    if errors is not None and errors not in ("strict", "replace"):
        raise ConfigError(f"data.encoding_errors={errors!r}: use strict (stop at invalid "
                          "UTF-8, naming the file and line) or replace (read bad bytes as "
                          "U+FFFD)")
    rnq = d.get("random_non_queries")
    if rnq is not None and not isinstance(rnq, bool):
        raise ConfigError(f"data.random_non_queries={rnq!r}: use true or false")
    _check_store_keys(d, source)
    _check_task_keys(d)


def _check_store_keys(d, source) -> None:
    """data.source=store's keys (data/store_dataset.py), when set; the store itself is
    checked when it is opened (data.store.StoreError names the file)."""
    if source == "store" and not d.get("store"):
        raise ConfigError("data.source=store needs data.store=PATH, a directory written by "
                          "python -m data.prepare --files=... --out=PATH")
    depth = d.get("prefetch")
    if depth is not None and not (isinstance(depth, int) and not isinstance(depth, bool)
                                  and depth >= 0):
        raise ConfigError(f"data.prefetch={depth!r}: use a number of batches >= 0 "
                          "(0: no reading ahead)")
    verify = d.get("verify_store")
    if verify is not None and not isinstance(verify, bool):
        raise ConfigError(f"data.verify_store={verify!r}: use true or false")


# Task keys that must be positive integers when set (0 or less builds no task).
_POSITIVE_DATA_INTS = ("mqar_vocab_size", "num_keys", "key_vocab", "key_len", "num_digits",
                       "filler_vocab", "num_values")
_FILLER_SOURCES = ("files", "hf", "tfds")


def _check_task_keys(d) -> None:
    """The MQAR, NIAH and mixture keys data/__init__.py documents, when set."""
    from data import niah  # its kinds are the data package's

    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    def is_number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    for key in _POSITIVE_DATA_INTS:
        v = d.get(key)
        if v is not None and not (is_int(v) and v > 0):
            raise ConfigError(f"data.{key}={v!r}: use a positive integer")
    a = d.get("power_a")
    if a is not None and not (is_number(a) and a > 0):
        # The gap probabilities are proportional to a * i^(a - 1): all zero at a = 0,
        # negative below.
        raise ConfigError(f"data.power_a={a!r}: use a positive number, e.g. 0.01")
    kind = d.get("niah_kind")
    if kind is not None and kind not in niah.KINDS:
        raise ConfigError(f"data.niah_kind={kind!r}: use one of {', '.join(niah.KINDS)}")
    haystack = d.get("niah_haystack")
    if haystack is not None and haystack not in niah.HAYSTACKS:
        raise ConfigError(f"data.niah_haystack={haystack!r}: use one of "
                          f"{', '.join(niah.HAYSTACKS)}")
    depths = d.get("niah_depths")
    if depths is not None:
        values = list(depths) if isinstance(depths, (list, tuple)) else None
        if not values or not all(is_number(x) and 0 <= x <= 1 for x in values):
            raise ConfigError(f"data.niah_depths={depths!r}: use a list of fractions in "
                              f"[0, 1], e.g. [0.1, 0.5, 0.9]")
    filler = d.get("filler_source")
    if filler is not None and filler not in _FILLER_SOURCES:
        raise ConfigError(f"data.filler_source={filler!r}: use one of "
                          f"{', '.join(_FILLER_SOURCES)}")
    comps = d.get("components")
    if comps is not None and not (isinstance(comps, (list, tuple)) or hasattr(comps, "items")):
        raise ConfigError(f"data.components={comps!r}: use a list of sub-configs, each "
                          f"with a `source` (and a `weight`), or a dict name -> sub-config")


def _check_mixer(m) -> None:
    from models.mixers import MIXERS  # registered by importing the package

    if m.get("mixer") not in MIXERS:
        raise ConfigError(f"model.mixer={m.get('mixer')!r} is not a mixer; valid mixers: "
                          f"{', '.join(sorted(MIXERS))}")


def check_config(config) -> None:
    """Values that are well-typed but impossible; named with the key and a fix."""
    t = config.train
    keys = flat_keys(config)
    for key, why in _POSITIVE.items():
        if key in keys and keys[key] is not None and keys[key] <= 0:
            raise ConfigError(f"{key}={keys[key]}: must be positive{why}")
    for key, why in _NON_NEGATIVE.items():
        if key in keys and keys[key] is not None and keys[key] < 0:
            raise ConfigError(f"{key}={keys[key]}: must be >= 0{why}")
    _check_mixer(config.model)
    _check_data(config.data)
    if t.grad_accum <= 0 or t.batch_size % t.grad_accum:
        raise ConfigError(f"train.batch_size={t.batch_size} must be a multiple of "
                          f"train.grad_accum={t.grad_accum}")
    accuracy = t.get("early_stop_accuracy") or 0.0
    if not 0.0 <= accuracy < 1.0:
        raise ConfigError(f"train.early_stop_accuracy={accuracy}: use a fraction in [0, 1) "
                          f"(0: never; Zoology stops MQAR runs at 0.99)")
    if t.get("precision") not in (None, *PRECISIONS):
        raise ConfigError(f"train.precision={t.precision!r}: use one of "
                          f"{', '.join(repr(p) for p in PRECISIONS)}")
    if prng_impl(config) not in PRNG_IMPLS:
        raise ConfigError(f"train.prng_impl={t.prng_impl!r}: use one of "
                          f"{', '.join(PRNG_IMPLS)}")
    if config.logging.wandb not in ("offline", "online", "disabled"):
        raise ConfigError(f"logging.wandb={config.logging.wandb!r}: use offline, online or "
                          f"disabled")


# ----------------------------------------------------------------------------- resume
# What a resumed run may not change without saying so: the keys that decide the losses
# from here on (the data order and content, the random streams, the lr schedule). The
# run's other keys (logging, intervals, precision, the mesh) are free to change; model
# keys are the checkpoint's to check (training.checkpoint.check_compatible).
RESUME_KEYS = ("train.seed", "train.prng_impl", "train.lr", "train.min_lr_ratio",
               "train.warmup_steps", "train.steps", "train.batch_size")
RESUME_SECTIONS = ("data.",)
# Where a cache lives, how far ahead batches are read and whether shards are hashed
# change no data.
RESUME_FREE = ("data.cache_dir", "data.prefetch", "data.verify_store")
CONFIG_HISTORY = "config_history.jsonl"


def resume_changes(saved: Mapping | None, config) -> dict[str, tuple]:
    """{key: (saved value, new value)} for the guarded keys that differ. Keys the saved
    config lacks (added to the code since) are not changes."""
    if not saved:
        return {}
    old, new = flat_keys(saved), flat_keys(to_plain(config))
    return {k: (old[k], new[k]) for k in sorted(set(old) & set(new))
            if (k in RESUME_KEYS or k.startswith(RESUME_SECTIONS)) and k not in RESUME_FREE
            and old[k] != new[k]}


def check_resume(saved: Mapping | None, config, workdir: str | os.PathLike, step: int, *,
                 record: bool = True) -> None:
    """Refuses (ConfigError) to resume `step` with guarded keys changed, unless
    train.allow_config_change; then each change is appended to WORKDIR/
    config_history.jsonl (config.json then holds the new values; the history, the old)."""
    changes = resume_changes(saved, config)
    if not changes:
        return
    listed = ", ".join(f"{k} {o!r} -> {n!r}" for k, (o, n) in changes.items())
    if not config.train.get("allow_config_change", False):
        raise ConfigError(
            f"resuming step {step} in {workdir} with changed settings: {listed}; from here "
            f"on the run would compute other losses than the one it continues. Resume "
            f"with the values it was started with, use a fresh --workdir, or pass "
            f"--config.train.allow_config_change=True to go on with the new ones "
            f"(recorded in {CONFIG_HISTORY})")
    if record:
        entry = {"step": int(step),
                 "time": datetime.datetime.now().isoformat(timespec="seconds"),
                 "changes": {k: {"old": o, "new": n} for k, (o, n) in changes.items()}}
        with open(pathlib.Path(workdir) / CONFIG_HISTORY, "a") as f:
            f.write(json.dumps(entry) + "\n")


# ----------------------------------------------------------------------------- workdir
def save_config(config, workdir: str | os.PathLike) -> None:
    """Writes the resolved config as config.json (what load_config reads) and
    config.yaml."""
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    tmp = workdir / (CONFIG_JSON + ".tmp")
    tmp.write_text(json.dumps(to_plain(config), indent=2, sort_keys=True))
    os.replace(tmp, workdir / CONFIG_JSON)  # atomic: a reader never sees half a file
    try:
        import yaml
        (workdir / CONFIG_YAML).write_text(yaml.safe_dump(to_plain(config), sort_keys=True))
    except Exception:  # yaml is a convenience copy for people; json is what code reads
        pass


def to_plain(config) -> dict:
    return (json.loads(config.to_json_best_effort())
            if hasattr(config, "to_json_best_effort")
            else json.loads(json.dumps(dict(config))))


def load_config(workdir: str | os.PathLike):
    """The ConfigDict that a run in `workdir` was started with (locked)."""
    import ml_collections  # only where used: the GPU machine lacks it

    path = pathlib.Path(workdir) / CONFIG_JSON
    if not path.is_file():
        raise ConfigError(f"{path} not found: is {workdir!r} the --workdir of a training "
                          f"run?")
    config = ml_collections.ConfigDict(json.loads(path.read_text()))
    config.lock()
    return config


# train.precision: "auto" computes in bfloat16 on GPU and TPU (tensor cores, and the
# Pallas kernels' fast path) and in float32 on CPU (which has no fast bfloat16 matmuls).
PRECISIONS = ("auto", "float32", "bfloat16")


def compute_dtype(precision: str) -> str:
    """The model's compute dtype for train.precision on this process's backend."""
    if precision != "auto":
        return precision
    import jax
    return "bfloat16" if jax.default_backend() in ("gpu", "tpu") else "float32"


def model_config_dict(config, vocab_size: int) -> dict:
    """The model section as a plain dict, vocab filled from the dataset when 0/None and
    train.precision / train.remat applied where the model has those fields."""
    d = dict(config.model.to_dict() if hasattr(config.model, "to_dict") else config.model)
    train = config.train
    # The compute dtype; parameters keep model.param_dtype (float32).
    if train.get("precision"):
        d["dtype"] = compute_dtype(train.precision)
    if train.get("remat") is not None:
        d["remat"] = bool(train.remat)
    if not d.get("vocab_size"):
        d["vocab_size"] = int(vocab_size)
    elif d["vocab_size"] < vocab_size:
        raise ConfigError(f"model.vocab_size={d['vocab_size']} is smaller than the "
                          f"dataset's vocabulary ({vocab_size}); set it to 0 to take the "
                          f"dataset's")
    return d
