"""Long context: the 1-in-8 hybrid (gated DeltaNet, one softmax layer in eight) at
T = 32,768 tokens, each sequence split along time over mesh.sequence = 8 devices
(context parallelism, kernels.context_parallel; the cost model in
docs/context_parallel.md). Each device holds 4,096 tokens of every sequence; the gated
DeltaNet layers pass one (K x V) state and one (K x K) transform per head between
devices, the softmax layer all-gathers its keys and values. A byte-level LM on local
files, like lm_files.py, with packed documents (their states reset across devices too).

    python train.py --config=configs/long_context.py --workdir=runs/long \\
        --config.data.files='corpus/*.txt'                  # 8 GPUs: data 1 x sequence 8
    # 16 GPUs: the same, with mesh.data = -1 taking the other 8 as data parallelism
    python train.py --config=configs/long_context.py:cpu ...  # T = 512 over 4 pieces

Decoding is unchanged (eval.generate prefills and steps on one device, no mesh).
"""
from configs import hybrid


def get_config(arg: str = ""):
    c = hybrid.get_config()
    c.model.update(dict(d_model=512, num_heads=4, num_layers=8, mixer="gated_deltanet",
                        softmax_every=8, chunk_size=64, remat=True, max_len=32768))
    c.data.seq_len = 32768
    c.mesh.sequence = 8
    c.train.update(dict(steps=5000, batch_size=8, lr=1e-3, warmup_steps=200,
                        log_every=10, eval_every=500, eval_batches=4,
                        checkpoint_every=500))
    if arg == "cpu":
        # The same split on a CPU with XLA_FLAGS=--xla_force_host_platform_device_count=4
        c.model.update(dict(d_model=64, num_heads=2, num_layers=8, chunk_size=16,
                            remat=False, max_len=512))
        c.data.seq_len = 512
        c.mesh.sequence = 4
        c.train.update(dict(steps=200, batch_size=4, log_every=10, eval_every=100,
                            eval_batches=2, checkpoint_every=100))
    elif arg:
        raise ValueError(f"configs/long_context.py: unknown variant {arg!r}; use no "
                         f"argument (T = 32,768 over 8 devices) or :cpu")
    return c
