#!/usr/bin/env bash
# Builds the trees next_ab.sh times, under .ab/ (ignored: add ".ab/" to .git/info/exclude),
# from a clone with history:
#   .ab/s16              69c3d30, the code of session 16's shake rows (based 0.85x softmax,
#                        gated_deltanet 1.20x)
#   .ab/taylor_autodiff  this tree with models/feature_maps.py as before 9131939 (the
#                        Taylor pairs' backward by autodiff of the slices again; that
#                        file then also lacks session 31's Performer redraw, which based
#                        does not use)
#   .ab/conv_before      d9553ca^ (after session 16: the Pallas short conv before its
#                        padded inputs became the backward's residuals, d9553ca, which
#                        no GPU call has timed; gated_deltanet's suspect)
set -eu
rm -rf .ab && git worktree prune
git worktree add -q --detach .ab/s16 69c3d30
git worktree add -q --detach .ab/taylor_autodiff HEAD
git worktree add -q --detach .ab/conv_before d9553ca^
git show 9131939^:models/feature_maps.py > .ab/taylor_autodiff/models/feature_maps.py
du -sh .ab/*
