"""Perplexity and bits per byte of a trained run.

    python -m eval.perplexity --workdir=DIR [--files=GLOB] \
        [--batch_size=16 --num_batches=50]

Default data: the run's own held-out split (`dataset.eval_batches`). With --files, the
matching text files tokenised with the run's tokenizer and cut into windows of the
run's sequence length. The last line printed is JSON with `loss` (mean nats per
target token), `perplexity` (= exp(loss)), `bits_per_byte` (total nats divided by
ln 2 times the UTF-8 bytes of the evaluated targets, decoded with the tokenizer) and
`tokens` (number of evaluated targets).
"""
from __future__ import annotations

import glob as globlib
import math
import os
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from data.base import cfg_get
from eval import common


def byte_counter(tokenizer) -> Callable[[list], int]:
    """`ids -> UTF-8 bytes of the text they spell`, decoding with the run's tokenizer.

    Byte-level tokenizers count their byte ids directly: decoding a row that starts or
    ends inside a multi-byte character would turn the fragment into U+FFFD (3 bytes).
    Special ids (end of document, needles) spell no text and count 0 bytes.
    """
    if getattr(tokenizer, "kind", None) == "byte":
        return lambda ids: sum(1 for i in ids if 0 <= i < 256)
    decode = tokenizer.decode
    try:
        decode([], skip_specials=True)
        return lambda ids: len(decode(ids, skip_specials=True).encode("utf-8"))
    except TypeError:
        return lambda ids: len(decode(ids).encode("utf-8"))


def target_bytes(targets: np.ndarray, mask: np.ndarray,
                 count: Callable[[list], int]) -> int:
    """Bytes of the evaluated targets, one whole row at a time (not token by token, so
    multi-byte characters and sentencepiece's word-boundary spaces come out right)."""
    total = 0
    for row, row_mask in zip(np.asarray(targets), np.asarray(mask)):
        ids = [int(t) for t in row[row_mask > 0]]
        if ids:
            total += count(ids)
    return total


def evaluate(stats_fn, batches: Iterable[Mapping[str, np.ndarray]],
             count_bytes: Callable[[list], int], progress: bool = False) -> dict[str, Any]:
    """Sums nats, targets and bytes over `batches`; returns the metrics dictionary.

    `stats_fn(batch) -> (nll (B,T), correct (B,T))`, see `common.token_stats_fn`;
    `count_bytes(ids) -> int`, see `byte_counter`.
    Sums are float64 on the host, so the result does not depend on the batching.
    """
    nats, tokens, nbytes = 0.0, 0, 0
    it = batches
    if progress:
        from tqdm import tqdm
        it = tqdm(batches, desc="perplexity", unit="batch")
    for batch in it:
        mask = np.asarray(batch["mask"], np.float64)
        nll, _ = stats_fn(batch)
        nats += float((nll * mask).sum())
        tokens += int((mask > 0).sum())
        nbytes += target_bytes(batch["targets"], mask, count_bytes)
    if tokens == 0:
        raise ValueError("no evaluated tokens: the held-out split or --files gave empty "
                         "batches (check the data config's eval split, or that --files "
                         "matches text files)")
    loss = nats / tokens
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "bits_per_byte": nats / (math.log(2) * nbytes) if nbytes else float("nan"),
        "tokens": tokens,
        "bytes": nbytes,
    }


def matching_files(pattern: str) -> list[str]:
    paths = sorted(p for p in globlib.glob(pattern, recursive=True) if os.path.isfile(p))
    if not paths:
        raise FileNotFoundError(f"--files={pattern!r} matches no file: give a glob of text "
                                "files, e.g. --files='data/*.txt'")
    return paths


def file_batches(pattern: str, encode: Callable[[str], list], seq_len: int,
                 batch_size: int, encoding_errors: str = "strict"
                 ) -> Iterator[dict[str, np.ndarray]]:
    """Non-overlapping windows of `seq_len` targets over each matching file.

    Each file is its own segment (id 1); the last, partial window of a file is padded
    with mask 0 and segment id 0, so every token of every file is a target once,
    except each file's first token (nothing predicts it). Invalid UTF-8 stops, naming
    the file and line, unless encoding_errors="replace" (the run's data.encoding_errors).
    """
    from data import sources
    rows = []
    for path in matching_files(pattern):
        ids = np.asarray(encode(sources.read_text(path, encoding_errors)), np.int32)
        for start in range(0, max(len(ids) - 1, 0), seq_len):
            chunk = ids[start:start + seq_len + 1]
            n = len(chunk) - 1
            row = {k: np.zeros(seq_len, dt) for k, dt in
                   (("inputs", np.int32), ("targets", np.int32), ("mask", np.float32),
                    ("segment_ids", np.int32))}
            row["inputs"][:n], row["targets"][:n] = chunk[:-1], chunk[1:]
            row["mask"][:n], row["segment_ids"][:n] = 1.0, 1
            rows.append(row)
    if not rows:
        raise ValueError(f"--files={pattern!r}: the files hold fewer than 2 tokens")
    for i in range(0, len(rows), batch_size):
        group = rows[i:i + batch_size]
        while len(group) < batch_size:  # pad the last batch: one compiled shape
            group = group + [{k: np.zeros_like(v) for k, v in group[0].items()}]
        yield {k: np.stack([r[k] for r in group]) for k in group[0]}


def run(workdir: str, files: str | None = None, batch_size: int = 16,
        num_batches: int = 50, progress: bool = True,
        step: int | str | None = None) -> dict[str, Any]:
    # --files: the run's saved tokenizer only; the training corpus is not read.
    model, config, dataset, step = common.load_run(workdir, step, data=not files)
    stats_fn = common.token_stats_fn(common.make_logits_fn(model),
                                     common.rows_packed(dataset))
    if files:
        from training import workdir_tokenizer
        seq_len = int(cfg_get(config, "data.seq_len"))
        errors = cfg_get(config, "data.encoding_errors", "strict")
        # Text the run's vocabulary cannot spell is refused, naming the file and line.
        workdir_tokenizer.check_files_fit(dataset.tokenizer, matching_files(files),
                                          workdir_tokenizer.path(workdir), errors)
        batches = file_batches(files, dataset.tokenizer.encode, seq_len, batch_size, errors)
    else:
        batches = dataset.eval_batches(batch_size, num_batches)
    result = evaluate(stats_fn, batches, byte_counter(dataset.tokenizer), progress=progress)
    result["step"] = int(step)
    return result


@common.user_errors
def main(argv):
    del argv
    from absl import flags
    f = flags.FLAGS
    result = run(f.workdir, f.files, f.batch_size, f.num_batches, step=f.step)
    common.print_json(result)


if __name__ == "__main__":
    from absl import app, flags

    flags.DEFINE_string("workdir", None, "Run directory written by train.py.",
                        required=True)
    flags.DEFINE_string("files", None,
                        "Glob of text files to evaluate instead of the held-out split.")
    flags.DEFINE_integer("batch_size", 16, "Sequences per batch.")
    flags.DEFINE_integer("num_batches", 50,
                         "Held-out batches to evaluate (ignored with --files).")
    flags.DEFINE_string("step", "latest", common.STEP_HELP)
    app.run(main)
