"""kernels.common.visible_keys, the dense reference forms' mask, against a loop over
(query, key) pairs of the rule it states: causal, inside the window, same document."""
import numpy as np
import pytest

from kernels.common import run_ids, visible_keys


@pytest.mark.parametrize("window", [None, 1, 3, 50])
@pytest.mark.parametrize("with_docs", [False, True])
def test_visible_keys_is_the_stated_rule(window, with_docs):
    t = 11
    segs = np.array([[0, 0, 0, 1, 1, 2, 2, 2, 2, 0, 0],    # id 0 again: a new run
                     [5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5]])
    docs = np.asarray(run_ids(segs, 2, t)) if with_docs else None
    got = np.asarray(visible_keys(t, docs, window))
    assert got.shape == ((2 if with_docs else 1), 1, t, t)
    for b in range(got.shape[0]):
        for q in range(t):
            for k in range(t):
                want = k <= q and (window is None or q - k < window)
                if with_docs:
                    want = want and docs[b, q] == docs[b, k]
                assert got[b, 0, q, k] == want, (b, q, k)
    if with_docs:  # run ids keep the two runs of id 0 apart
        assert not got[0, 0, 9, 0]
