"""What train.py runs on a GPU: a training step of every linear mixer calls the Pallas
kernels, with the batch's segment ids where rows hold several documents and without
them where every row is one example (MQAR). The backend reads as "gpu" and a stand-in
kernels.pallas counts the calls (running the chunk form, and the delta rules' fused conv
kernel in interpret mode), at the default precision (bfloat16 there). Every mixer's train
step (training.step.make_train_step, built and sharded as training builds it, on a
pipeline batch) is traced; one step of train.py's own loop (training.loop.train) runs for
gated_deltanet, and for the others under -m slow.
"""
import sys
import types

import pytest

import jax

from kernels import ops
from kernels.pallas import common, short_conv
from models import mixers
from tests.training.conftest import tiny_config
from eval import speed
from training import builders, config_tools, loop
from training import sharding as shd

LINEAR = [m for m in mixers.FIXED_STATE if m != mixers.SLIDING_WINDOW]
DELTA = (mixers.DELTANET, mixers.GATED_DELTANET)


def stand_in_kernels(monkeypatch):
    """A kernels.pallas whose two entry points record (op, segment ids given, dtype) and
    return the chunk form's result, and whose conv kernel records ("conv_silu_norm",
    None, dtype) and runs the real kernel in interpret mode; and a backend that reads as
    "gpu"."""
    calls = []

    def linear_attention(q, k, v, *, segment_ids=None, **kwargs):
        calls.append(("linear_attention", segment_ids is not None, str(q.dtype)))
        return ops.linear_attention(q, k, v, segment_ids=segment_ids, impl="chunk", **kwargs)

    def gated_delta_rule(q, k, v, log_alpha, beta, *, segment_ids=None, **kwargs):
        calls.append(("gated_delta_rule", segment_ids is not None, str(q.dtype)))
        return ops.gated_delta_rule(q, k, v, log_alpha, beta, segment_ids=segment_ids,
                                    impl="chunk", **kwargs)

    def conv_silu_norm(x, kernel, positions, **settings):
        calls.append(("conv_silu_norm", None, str(x.dtype)))
        return short_conv.conv_silu_norm(x, kernel, positions, **settings)

    module = types.ModuleType("kernels.pallas")
    module.linear_attention, module.gated_delta_rule = linear_attention, gated_delta_rule
    module.conv_silu_norm = conv_silu_norm
    monkeypatch.setattr(common, "interpret", lambda: True)
    monkeypatch.setitem(sys.modules, "kernels.pallas", module)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    return calls


def packed_text_config(tmp_path, mixer):
    """Byte-level text, one document per line, rows of 32 tokens: rows hold several."""
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(f"line {i} of a small corpus, {'ab' * (i % 7)}"
                              for i in range(200)))
    c = config_tools.load_config_file("configs/lm_files.py")
    config_tools.set_values(c, {
        "data.files": str(text), "data.sample_by": "line", "data.seq_len": 32,
        "model.mixer": mixer, "model.d_model": 32, "model.num_layers": 1,
        "model.num_heads": 2, "train.steps": 1, "train.batch_size": 4,
        "train.warmup_steps": 0, "train.log_every": 1, "train.eval_every": 0,
        "train.eval_batches": 1, "train.checkpoint_every": 0,
        "logging.wandb": "disabled", "logging.progress": False})
    return c


def check_calls(calls, mixer):
    if mixer == mixers.PERFORMER:
        # FAVOR+'s features stay float32 into the op (issue 17: a bfloat16 feature loses
        # its low digits before the sums), and impl="auto" takes the chunk form for
        # float32 inputs, where the Pallas kernels' IEEE float32 products are slower.
        assert calls == [], calls
        return
    op = "gated_delta_rule" if mixer in DELTA else "linear_attention"
    convs = [c for c in calls if c[0] == "conv_silu_norm"]
    calls = [c for c in calls if c[0] != "conv_silu_norm"]
    # the delta rules' input path runs the fused conv kernel (model.conv_impl's default)
    assert bool(convs) == (mixer in DELTA), (mixer, convs)
    assert all(dtype == "bfloat16" for _, _, dtype in convs), convs
    assert calls, f"{mixer}: no kernel call"
    assert {c[0] for c in calls} == {op}
    # packed documents reach the kernels, at the GPU default precision
    assert all(packed and dtype == "bfloat16" for _, packed, dtype in calls), calls


@pytest.mark.parametrize("mixer", LINEAR)
def test_traced_train_step_calls_the_pallas_kernels_on_gpu(mixer, monkeypatch, tmp_path):
    calls = stand_in_kernels(monkeypatch)
    config = packed_text_config(tmp_path, mixer)
    with jax.default_prng_impl(config.train.prng_impl):
        dataset = builders.build_dataset(config)
        steps, params, opt_state, batch_sharding = speed.jitted_train_step(config, dataset)
        batch = shd.global_batch(dataset.batch(0, config.train.batch_size), batch_sharding)
        steps.train.trace(params, opt_state, batch, steps.key(0), steps.feature_key(0))
    check_calls(calls, mixer)


@pytest.mark.parametrize("mixer", [pytest.param(m, marks=() if m == mixers.GATED_DELTANET
                                                else pytest.mark.slow) for m in LINEAR])
def test_train_py_loop_calls_the_pallas_kernels_on_gpu(mixer, monkeypatch, tmp_path):
    calls = stand_in_kernels(monkeypatch)
    loop.train(packed_text_config(tmp_path, mixer), str(tmp_path / "run"))
    check_calls(calls, mixer)


def test_single_document_rows_pass_no_segment_ids(monkeypatch, tmp_path):
    """MQAR rows are one example each (data.Dataset.packed is False): the kernels get no
    segment ids."""
    calls = stand_in_kernels(monkeypatch)
    c = tiny_config(**{"model.mixer": mixers.GATED_DELTANET, "train.steps": 1,
                       "train.checkpoint_every": 0, "train.eval_every": 0})
    loop.train(c, str(tmp_path / "run"))
    kernel_calls = [c for c in calls if c[0] != "conv_silu_norm"]
    assert kernel_calls and not any(packed for _, packed, _ in kernel_calls), calls
