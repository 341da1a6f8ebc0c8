"""train.py with a record of what the data source read: each call of the token store's
batch methods appends a line {process, method, step, rows, split} (JSON) to
$SHARE_LOG.<process id>. Used by tests/training/test_process_share.py."""
import json
import os
import runpy
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from data import store_dataset  # noqa: E402

_lock = threading.Lock()
_log = os.environ["SHARE_LOG"] + "." + os.environ.get("JAX_PROCESS_ID", "0")


def _record(method, step, rows, split):
    with _lock, open(_log, "a") as f:
        f.write(json.dumps({"method": method, "step": int(step), "split": split,
                            "rows": None if rows is None else [int(r) for r in rows]})
                + "\n")


_batch, _batch_rows = store_dataset.StoreDataset._batch, store_dataset.StoreDataset._batch_rows


def batch(self, step, batch_size, split):
    _record("batch", step, None, split)
    return _batch(self, step, batch_size, split)


def batch_rows(self, step, batch_size, rows, split):
    _record("batch_rows", step, rows, split)
    return _batch_rows(self, step, batch_size, rows, split)


store_dataset.StoreDataset._batch = batch
store_dataset.StoreDataset._batch_rows = batch_rows
sys.argv = [os.path.join(ROOT, "train.py")] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
