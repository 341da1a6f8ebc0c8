"""Each process reads only its share of a global batch: `Dataset.batch_rows(step, B, rows)`
equals `batch(step, B)[rows]` for every source (the token store and text read only those
rows), and `training.sharding.process_indices` names the rows (and, for a sequence axis
over processes, the positions) that `jax.make_array_from_process_local_data` expects of
each process. The two-process training runs are in tests/training/test_process_share.py."""
import numpy as np
import pytest

import data
from data import prepare as prep
from data.prefetch import Prefetched
from tests.data.test_store import write_corpus
from training import sharding as shd

ROWS = [np.array([1, 3, 5, 7]), np.array([4, 5, 6, 7]), np.array([6, 0, 2]),
        np.array([], np.int64)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("share")
    write_corpus(root / "text")
    prep.prepare(str(root / "text" / "*.txt"), root / "store", sample_by="paragraph",
                 shard_tokens=3000, progress=False)
    return root


def assert_rows_of(ds, step, batch_size, rows, split="train"):
    whole = ds.batch(step, batch_size, split)
    part = ds.batch_rows(step, batch_size, rows, split)
    assert set(part) == set(whole)
    for k in whole:
        assert part[k].dtype == whole[k].dtype
        np.testing.assert_array_equal(part[k], whole[k][rows], err_msg=k)


@pytest.mark.parametrize("packing", ["random_windows", "rows"])
def test_store_and_text_rows_equal_the_whole_batch_rows(store, packing):
    common = {"seq_len": 32, "packing": packing, "val_fraction": 0.2}
    sources = {
        "store": data.build({"source": "store", "store": str(store / "store"),
                             "prefetch": 0, **common}, seed=3),
        "text": data.build({"source": "files", "files": str(store / "text" / "*.txt"),
                            "sample_by": "paragraph", **common}, seed=3),
    }
    for ds in sources.values():
        for step in (0, 1, 37):  # 37: past an epoch of rows
            for rows in ROWS:
                assert_rows_of(ds, step, 8, rows)
        assert_rows_of(ds, 2, 8, ROWS[0], "val")


def test_store_reads_only_the_rows_asked_for(store):
    ds = data.build({"source": "store", "store": str(store / "store"), "seq_len": 32,
                     "prefetch": 0}, seed=0)
    starts_read = []
    inner_rows = ds.tokens.rows

    def counting(starts, width):
        starts_read.append(np.asarray(starts).copy())
        return inner_rows(starts, width)

    ds.tokens.rows = counting
    whole_starts = ds._starts(5, 8, "train")
    ds.batch_rows(5, 8, [4, 5, 6, 7])
    assert len(starts_read) == 1
    np.testing.assert_array_equal(starts_read[0], whole_starts[4:])  # 4 of 8 rows read


def test_prefetch_reads_a_share_ahead_and_changes_no_row(store):
    inner = data.build({"source": "store", "store": str(store / "store"), "seq_len": 32,
                        "prefetch": 0}, seed=1)
    ahead = Prefetched(data.build({"source": "store", "store": str(store / "store"),
                                   "seq_len": 32, "prefetch": 0}, seed=1), depth=2)
    rows = np.array([0, 2, 4, 6])
    try:
        for step in (0, 1, 2, 3, 9, 10):
            got = ahead.batch_rows(step, 8, rows)
            want = inner.batch_rows(step, 8, rows)
            for k in want:
                np.testing.assert_array_equal(got[k], want[k])
        # the window ahead holds this share's next batches
        assert {k[0] for k in ahead._pending} == {11, 12}
        assert all(k[1] == (8, tuple(rows.tolist())) for k in ahead._pending)
    finally:
        ahead.close()


def test_synthetic_and_mixture_rows_equal_the_whole_batch_rows(store):
    mqar = data.build({"source": "mqar", "seq_len": 16, "num_kv_pairs": [2, 3],
                       "vocab_size": 64}, seed=0)
    niah = data.build({"source": "niah", "seq_len": 64}, seed=0)
    mixture = data.build({"source": "mixture", "seq_len": 32, "components": [
        {"source": "files", "files": str(store / "text" / "*.txt"), "weight": 2},
        {"source": "mqar", "vocab_size": 64, "num_kv_pairs": 2, "loss_weight": 3.0}]},
        seed=0)
    for ds in (mqar, niah, mixture):
        for rows in ROWS:
            assert_rows_of(ds, 4, 8, rows)
    which = mixture.choose(4, 8, "train")
    assert 0 < which.sum() < 8  # both components in the batch


def test_rows_outside_the_batch_are_refused(store):
    ds = data.build({"source": "mqar", "seq_len": 16, "num_kv_pairs": 2,
                     "vocab_size": 64}, seed=0)
    with pytest.raises(ValueError, match="outside a batch of 8"):
        ds.batch_rows(0, 8, [7, 8])


# ---------------------------------------------------------- rows per process of a mesh
def _devices_indices(mesh_shape, batch_shape, row_axes, time_axis=None):
    """{device id: (row slice, time slice)} for a mesh of named axes in row-major device
    order, the rows split over `row_axes` (in order) and time over `time_axis`:
    NamedSharding's layout, written out independently."""
    names = list(mesh_shape)
    sizes = [mesh_shape[n] for n in names]
    B, T = batch_shape
    out = {}
    for dev, coords in enumerate(np.ndindex(*sizes)):
        c = dict(zip(names, coords))
        k, n = 0, 1
        for a in row_axes:
            k, n = k * mesh_shape[a] + c[a], n * mesh_shape[a]
        rows = slice(k * B // n, (k + 1) * B // n)
        if time_axis is None:
            t = slice(None)
        else:
            m = mesh_shape[time_axis]
            t = slice(c[time_axis] * T // m, (c[time_axis] + 1) * T // m)
        out[dev] = (rows, t)
    return out


def _check_against_the_local_data_rule(indices, process_of, pid, shape):
    """make_array_from_process_local_data's rule: along each dimension the process's
    distinct shard starts, sorted, are laid end to end in its local data. The local block
    taken by process_indices must give every device of the process its own shard."""
    got = shd.process_indices(None, shape, devices_indices=indices, process_of=process_of,
                              process_index=pid)
    G = np.arange(np.prod(shape)).reshape(shape)
    local = G[np.ix_(*got)]
    mine = [idx for d, idx in indices.items() if process_of(d) == pid]
    for idx in mine:
        slot = []
        for dim, sl in enumerate(idx):
            lo, hi, _ = sl.indices(shape[dim])
            starts = sorted({s.indices(shape[dim])[0] for s in (i[dim] for i in mine)})
            if len(starts) * (hi - lo) == shape[dim]:
                slot.append(slice(lo, hi))  # held whole: local index = global index
            else:
                j = starts.index(lo) * (hi - lo)
                slot.append(slice(j, j + hi - lo))
        np.testing.assert_array_equal(local[tuple(slot)], G[idx])
    return got


@pytest.mark.parametrize("layout", ["blocks", "interleaved"])
def test_process_rows_give_each_device_its_shard(layout):
    # 8 devices, data x fsdp = 4 x 2, two processes of four devices each
    indices = _devices_indices({"data": 4, "fsdp": 2, "tensor": 1}, (16, 8), ("data", "fsdp"))
    process_of = (lambda d: d // 4) if layout == "blocks" else (lambda d: d % 2)
    rows = [_check_against_the_local_data_rule(indices, process_of, p, (16, 8))[0]
            for p in (0, 1)]
    if layout == "blocks":
        np.testing.assert_array_equal(rows[0], np.arange(8))
        np.testing.assert_array_equal(rows[1], np.arange(8, 16))
    else:  # every other pair of rows
        np.testing.assert_array_equal(rows[0], [0, 1, 4, 5, 8, 9, 12, 13])
    assert sorted(np.concatenate(rows).tolist()) == list(range(16))  # a partition


def test_a_sequence_axis_over_processes_cuts_the_time_dimension():
    # data=2 x sequence=2; process p holds sequence slot p of both data rows
    indices = _devices_indices({"data": 2, "sequence": 2}, (4, 8), ("data",), "sequence")
    for p in (0, 1):
        rows, time = _check_against_the_local_data_rule(indices, lambda d: d % 2, p, (4, 8))
        np.testing.assert_array_equal(rows, np.arange(4))
        np.testing.assert_array_equal(time, np.arange(4 * p, 4 * p + 4))


def test_one_process_holds_everything_and_the_batch_is_unchanged():
    import jax
    mesh = shd.make_mesh()
    sharding = shd.batch_sharding(mesh)
    idx = shd.process_indices(sharding, (4, 6))
    np.testing.assert_array_equal(idx[0], np.arange(4))
    np.testing.assert_array_equal(idx[1], np.arange(6))
    batch = {"inputs": np.arange(24, dtype=np.int32).reshape(4, 6),
             "mask": np.ones((4, 6), np.float32)}
    got = shd.global_batch_from_process_data(batch, sharding, (4, 6))
    want = shd.global_batch(batch, sharding)
    for k in batch:
        assert got[k].sharding == want[k].sharding
        np.testing.assert_array_equal(jax.device_get(got[k]), batch[k])
