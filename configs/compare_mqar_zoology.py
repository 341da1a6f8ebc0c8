"""Zoology's MQAR protocol as sweeps: every mixer after a BaseConv layer, three widths,
Zoology's four lrs, three seeds; each point the best lr's mean with a 95% interval.

    python -m sweeps.run --config=configs/compare_mqar_zoology.py:paper --workdir=runs/zp
    python -m sweeps.run --config=configs/compare_mqar_zoology.py:based --workdir=runs/zb
    python -m sweeps.run --config=configs/compare_mqar_zoology.py:tiny --workdir=/tmp/z  # CPU
    python -m sweeps.run --config=configs/compare_mqar_zoology.py:based_tiny --workdir=...

`paper`: the Zoology paper's recipe (configs/mqar_zoology_paper.py): train and test at
(256, 16), lr over logspace(-4, -2, 4), 64 epochs' worth of examples; judged by held-out
accuracy at (256, 16) over 3,008 examples. `based`: the Based era's
(configs/mqar_zoology_based.py): a mixture of five settings, lr over
logspace(-3, -1.5, 4), 32 epochs' worth; judged by `settings_mean`, the mean accuracy
over Zoology's seven test settings (64, 4) ... (1024, 256), 1,000 examples each, which
its recall-memory figure plots against state in bytes measured at length 1,024.

Each grid cell (a mixer at a width) trains its 4 lrs x 3 seeds = 12 runs together as one
population (training.population: one jitted program, members vmapped), `population`
below; every member still gets a run record of its own, as a separate run would
(sweeps.populations). --config.population=False trains them one by one instead.

Heads, as Zoology's configs give them (models_repo.py): attention and Based 1
(MHA / Based num_heads=1), DeltaNet and gated delta net 2; the GLA entry there also 2,
so lightning (our decayed linear attention) gets 2; the other feature-map mixers
(linear, performer, hedgehog, based) follow Zoology's linear-attention family: 1.
`hedgehog_distill` is hedgehog trained with its paper's attention distillation beside the
next-token loss (model.hedgehog_distill = 1; trained on the next-token loss alone it stays
near MQAR's floor, sessions 22-26).
Zoology's "Based" is Taylor linear attention after a BaseConv: our `taylor`; our `based`
adds a sliding window in the same layer (no Zoology counterpart). Sliding window: sized
by its window as Zoology sizes it (models_repo.py: windows 8 ... 1024 at d128): window 64
at d64 and d128, and windows 16, 32 and 128 at d128 (a width alone does not move it: at
(256, 16) d64 and d128 with window 64 answered the same queries, 0.5964 both, session 25).

Zoology's paper Figure 2 at (256, 16), read off the plot (ANCHORS.md; its models are
two layers of the mixer, Based excepted): attention about 1.0 at d 64 ... 512; BaseConv
0.15 / 0.33 / 0.80 / 0.92 at d 64 / 128 / 256 / 512; H3 0.06 / 0.63 / 0.61 / 0.66; Hyena
0.05 / 0.13 / 0.53 / 0.68. None of those but attention is a mixer here; they are not
drawn.
"""
import ml_collections

from configs import mqar_zoology_based as based_recipe
from configs import mqar_zoology_paper as paper_recipe
from models import mixers

# softmax, the delta rules and Based first: the checks, kept by a sweep cut short
FIRST = [mixers.SOFTMAX, mixers.GATED_DELTANET, mixers.DELTANET, mixers.TAYLOR]
MIXERS = FIRST + [m for m in mixers.ALL if m not in FIRST]
HEADS = {mixers.DELTANET: 2, mixers.GATED_DELTANET: 2, mixers.LIGHTNING: 2}  # others 1
WIDTHS = [64, 128, 256]
SEEDS = [0, 1, 2]

# Zoology's recall-memory figure (the Based-era models, trained on the mixture), read off
# it in NUMBERS per sequence (its axis is bytes = numbers x 4, zoology/model.py), against
# the mean accuracy over the seven test settings (ANCHORS.md, issue 18). An earlier
# reading took them for numbers at (256, 16), 4x too far right and a different measure.
# GLA has no mixer here (its own colour); Zoology's Based is our taylor; the Based and
# sliding-window entries are the ends of their curves.
ZOOLOGY_RECALL_MEMORY = [
    {"mixer": mixers.GATED_DELTANET, "state_size": 4.3e3, "value": 0.89},
    {"mixer": mixers.GATED_DELTANET, "state_size": 1.7e4, "value": 0.99},
    {"mixer": mixers.GATED_DELTANET, "state_size": 6.6e4, "value": 0.995},
    {"mixer": mixers.DELTANET, "state_size": 2.2e3, "value": 0.79},
    {"mixer": mixers.DELTANET, "state_size": 8.6e3, "value": 0.965},
    {"mixer": mixers.DELTANET, "state_size": 3.4e4, "value": 0.995},
    {"mixer": "gla", "label": "GLA", "state_size": 1.2e3, "value": 0.53},
    {"mixer": "gla", "label": "GLA", "state_size": 4.5e3, "value": 0.77},
    {"mixer": "gla", "label": "GLA", "state_size": 1.7e4, "value": 0.95},
    {"mixer": mixers.TAYLOR, "label": "Based", "state_size": 2.4e3, "value": 0.67},
    {"mixer": mixers.TAYLOR, "label": "Based", "state_size": 3.8e4, "value": 0.99},
    {"mixer": mixers.SLIDING_WINDOW, "state_size": 2.4e3, "value": 0.08},
    {"mixer": mixers.SLIDING_WINDOW, "state_size": 1.3e5, "value": 0.94},
]
SOURCE = "Zoology, 7-setting mean, approx."


def _mixer(name):
    entry = {"name": name, "overrides": {"model.mixer": name,
                                         "model.num_heads": HEADS.get(name, 1)}}
    if name == mixers.SLIDING_WINDOW:
        entry["sizes"] = SLIDING_WINDOW_SIZES
    return entry


def _hedgehog_distilled():
    """Hedgehog trained as its paper trains the maps: beside the next-token loss, each
    layer's attention distillation against the softmax attention of its own q, k
    (weight 1); otherwise hedgehog's entry."""
    entry = _mixer(mixers.HEDGEHOG)
    return {"name": "hedgehog_distill",
            "overrides": {**entry["overrides"], "model.hedgehog_distill": 1.0}}


def _width(d):
    return {"name": f"d{d}", "overrides": {"model.d_model": d}}


# The sliding window's cells: its window at one width, as Zoology sweeps it (d64 and d128
# at the default window 64 keep their names from before the windows were added).
SLIDING_WINDOW_SIZES = [
    {"name": "d64", "overrides": {"model.d_model": 64, "model.window": 64}},
    {"name": "d128", "overrides": {"model.d_model": 128, "model.window": 64}},
] + [{"name": f"d128_w{w}", "overrides": {"model.d_model": 128, "model.window": w}}
     for w in (16, 32, 128)]


def _setting(name, seq_len=None, kv=None):
    over = {} if seq_len is None else {"data.seq_len": seq_len, "data.num_kv_pairs": kv}
    return {"name": name, "overrides": over}


def get_config(arg: str = "paper"):
    arg = arg or "paper"
    if arg not in ("paper", "based", "tiny", "based_tiny"):
        raise ValueError(f"compare_mqar_zoology: unknown variant {arg!r}; use 'paper', "
                         "'based', 'tiny' or 'based_tiny'")
    based = arg.startswith("based")
    recipe = based_recipe if based else paper_recipe
    c = ml_collections.ConfigDict()
    c.task = "mqar"
    c.base_config = f"configs/{recipe.__name__.rsplit('.', 1)[-1]}.py"
    c.lr_key = "train.lr"
    c.seed_key = "train.seed"
    # The budget is a setting of the sweep (--config.overrides.train.steps=1955 for 5 of
    # the paper's 64 epochs); grad_accum splits each step's batch to fit 12 members of
    # vocabulary 8,192 beside another population on one GPU (same gradient).
    recipe_train = recipe.get_config().train
    c.overrides = {"logging": {"wandb": "disabled"},
                   "train": {"steps": recipe_train.steps,
                             "grad_accum": recipe_train.grad_accum}}
    c.mixers = [_mixer(m) for m in MIXERS] + [_hedgehog_distilled()]
    c.sizes = [_width(d) for d in WIDTHS]
    c.lrs = tuple(recipe.LRS)  # tuples, so that --config.lrs="(0.01,)" can pick some
    c.seeds = tuple(SEEDS)  # --config.seeds="(3, 4, 5)": a re-run with new seeds
    c.population = True
    # --config.population_max_members=6: a cell's members in populations of at most 6,
    # one after another, where all of them at once would not fit in GPU memory
    c.population_max_members = 0
    c.runner = "subprocess"
    # per training process: one population of 12 members (or one run)
    c.train_timeout_s = 6 * 3600
    if based:
        c.title = ("MQAR, Zoology's Based-era recipe (mixture of settings): mean accuracy "
                   "over the seven test settings at the best lr")
        c.settings = [_setting("mixture")]
        c.metric = "settings_mean"
        c.eval = {"batch_size": 64, "num_batches": 16,
                  "settings": [list(s) for s in based_recipe.TEST_SETTINGS],
                  "settings_examples": based_recipe.TEST_EXAMPLES,
                  "settings_batch_size": 32, "state_seq_len": based_recipe.STATE_SEQ_LEN}
        c.references = [dict(p, setting="mixture", source=SOURCE)
                        for p in ZOOLOGY_RECALL_MEMORY]
    else:
        c.title = "MQAR, the Zoology paper's recipe at (256, 16): accuracy at the best lr"
        c.settings = [_setting("T256_kv16")]
        c.metric = "accuracy"
        c.eval = {"batch_size": 64, "num_batches": 47}  # 3,008 held-out examples
        c.references = []
    if arg in ("tiny", "based_tiny"):  # CPU check of the machinery: seconds per run
        c.mixers = [_mixer(mixers.SOFTMAX), _mixer(mixers.GATED_DELTANET)]
        c.sizes = [{"name": "d16", "overrides": {"model.d_model": 16}}]
        c.lrs = (1e-3, 3e-2)
        c.population = False  # the separate runs; tests compare both
        c.runner = "inprocess"
        c.train_timeout_s = 600
        c.overrides = {"logging": {"wandb": "disabled"},
                       "data": {"vocab_size": 128},
                       "train": {"steps": 3, "batch_size": 4, "log_every": 1,
                                 "eval_every": 2, "eval_batches": 2,
                                 "checkpoint_every": 0}}
        if based:
            c.overrides["data"]["num_kv_pairs"] = [[16, 2, 2], [32, 4, 1]]
            c.overrides["data"]["seq_len"] = 32
            c.eval = {"batch_size": 8, "num_batches": 2, "settings": [[16, 2], [32, 4],
                                                                      [64, 8]],
                      "settings_examples": 16, "settings_batch_size": 8,
                      "state_seq_len": 64}
        else:
            c.settings = [_setting("T32_kv2", 32, 2)]
            c.eval = {"batch_size": 8, "num_batches": 2}
    return c
