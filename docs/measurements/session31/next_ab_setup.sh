#!/usr/bin/env bash
# Builds the trees next_ab.sh times, under .ab/ (ignored: add ".ab/" to .git/info/exclude),
# from a clone with history:
#   .ab/s16              69c3d30, the code of session 16's shake rows (based 0.85x softmax,
#                        gated_deltanet 1.20x)
#   .ab/taylor_autodiff  this tree with 9131939 (Taylor pairs' written-out backward)
#                        undone: autodiff of the slices again
set -eu
rm -rf .ab && git worktree prune
git worktree add -q --detach .ab/s16 69c3d30
git worktree add -q --detach .ab/taylor_autodiff HEAD
git show 9131939 -- models/feature_maps.py | (cd .ab/taylor_autodiff && git apply -R)
du -sh .ab/*
