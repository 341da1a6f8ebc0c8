#!/usr/bin/env bash
# Builds the trees next_ab.sh times, under .ab/ (ignored: add ".ab/" to .git/info/exclude),
# from a clone with history:
#   .ab/s16              69c3d30, the code of session 16's shake rows (based 0.85x softmax,
#                        gated_deltanet 1.20x)
#   .ab/taylor_written   this tree with Based's Taylor gradient written out on every
#                        platform (its gather form; session 31's call ran the form of
#                        session 30, concatenated); this tree takes autodiff off CPU
#   .ab/conv_before      d9553ca^ (after session 16: the Pallas short conv before its
#                        padded inputs became the backward's residuals, d9553ca, which
#                        no GPU call has timed; gated_deltanet's suspect)
set -eu
rm -rf .ab && git worktree prune
git worktree add -q --detach .ab/s16 69c3d30
git worktree add -q --detach .ab/taylor_written HEAD
sed -i 's/    if jax.default_backend() == "cpu":/    if True:  # A\/B: written out everywhere/' \
  .ab/taylor_written/models/feature_maps.py
grep -q "if True:  # A/B" .ab/taylor_written/models/feature_maps.py
git worktree add -q --detach .ab/conv_before d9553ca^
du -sh .ab/*
