"""Every launch setting of the Pallas GPU programs, as one frozen (hashable) value.

A `Tuning` is passed from `kernels.ops` through the Pallas entry points into the custom
VJPs' static configuration, so the jit cache keys on it: two Tunings give two traces,
and no setting can change under a cached trace. The benchmark scripts build variants
(`dataclasses.replace(DEFAULT, ...)`); nothing here reads the environment.

Each default is the fastest setting measured on an H200 (docs/benchmarks.md has the
timings). The TPU programs take none of these: their grid holds one chunk per step.
"""
from __future__ import annotations

import dataclasses

SOLVE_PRECISIONS = ("high", "highest")


@dataclasses.dataclass(frozen=True)
class Tuning:
    """Launch settings of the GPU programs: warps and pipeline stages per kernel, the
    value block of the sequential kernels, the UT solve's product precision. Equal
    Tunings hash equal, so the jit cache keys on the value."""
    # Sequential kernels (the loop over chunks: forward, the split forward's state pass,
    # the backward's dS pass). Warps per program, 0 = 4 up to a 128 x 64 float32 state
    # slice and 8 past it (the slice lives in registers).
    seq_warps: int = 0
    # Pipeline stages of the sequential kernels; capped at 2 past 128 keys, where each
    # stage's C x K tiles no longer fit three times in the H200's shared memory.
    seq_stages: int = 3
    # The value dim is split into blocks until the sequential kernels run at least this
    # many programs (one per SM keeps the loop's latency the only cost), but no block
    # narrower than min_block_v columns.
    seq_programs: int = 128
    min_block_v: int = 16
    # Value columns per sequential program, forced (None: chosen from the two above).
    block_v: int | None = None
    # Packed documents on a grid short of seq_programs: the sequential kernels split
    # each row into pieces of this many chunks, each piece's walk starting at a document
    # start (documents.piece_bounds), so a long row of short documents runs as many
    # short loops, not one long one. 0: no split.
    piece_chunks: int = 16
    # Warps of the split forward's chunk-parallel output kernel.
    output_warps: int = 4
    # Warps of the backward's chunk-parallel gradient kernel.
    grads_warps: int = 8
    # Gated delta rule preparation: the K K^T + UT-solve kernel (a chain of small 16 x 16
    # products: one warp lets many programs share an SM), the W, Ut, P kernel, and the
    # preparation's backward.
    kkt_solve_warps: int = 1
    wu_warps: int = 8
    prep_bwd_warps: int = 4
    # Products of the UT solve for bf16 / fp16 inputs: "high" runs them as one TF32
    # tensor-core pass (its ~1e-3 error is below the bf16 rounding X gets next);
    # "highest" as IEEE float32 FMAs, for accuracy checks that must rule TF32 out.
    # Float32 inputs always get IEEE float32.
    solve_precision: str = "high"

    def __post_init__(self):
        counts = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name not in ("solve_precision", "block_v")}
        for name, value in counts.items():
            least = 0 if name in ("seq_warps", "piece_chunks") else 1
            if not isinstance(value, int) or value < least:
                raise ValueError(f"Tuning.{name} must be an integer >= {least}, "
                                 f"got {value!r}")
        if self.block_v is not None and (not isinstance(self.block_v, int)
                                         or self.block_v < 1):
            raise ValueError(f"Tuning.block_v must be None or a positive integer, "
                             f"got {self.block_v!r}")
        if self.solve_precision not in SOLVE_PRECISIONS:
            raise ValueError(f"Tuning.solve_precision must be one of {SOLVE_PRECISIONS}, "
                             f"got {self.solve_precision!r}")


DEFAULT = Tuning()
