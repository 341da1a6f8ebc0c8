"""metrics.jsonl: one line per entry, flushed, no duplicated steps after a resume."""
import json

from training import metrics


def test_append_and_truncate_on_resume(tmp_path):
    log = metrics.MetricsFile(tmp_path)
    for s in range(1, 7):
        log.write({"step": s, "loss": 1.0 / s})
    log.write({"step": 6, "eval_loss": 0.5})
    # Flushed per line: readable before close (a killed run keeps what it logged).
    assert len(metrics.read_metrics(tmp_path)) == 7
    log.close()
    # A kill mid-line leaves a fragment: it is skipped, not fatal.
    with open(tmp_path / metrics.METRICS_FILE, "a") as f:
        f.write('{"step": 7, "lo')
    resumed = metrics.MetricsFile(tmp_path, resume_step=4)
    resumed.write({"step": 5, "loss": 0.25})
    resumed.close()
    entries = metrics.read_metrics(tmp_path)
    assert [e["step"] for e in entries] == [1, 2, 3, 4, 5]
    assert entries[-1]["loss"] == 0.25


def test_fresh_run_replaces_old_file_and_nan_is_kept_as_text(tmp_path):
    (tmp_path / metrics.METRICS_FILE).write_text('{"step": 99, "loss": 1}\n')
    log = metrics.MetricsFile(tmp_path, resume_step=None)
    log.write({"step": 1, "loss": float("nan")})
    log.close()
    lines = (tmp_path / metrics.METRICS_FILE).read_text().splitlines()
    assert [json.loads(l) for l in lines] == [{"step": 1, "loss": "nan"}]


def test_wandb_mode_env_overrides_config(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert metrics.wandb_mode("online") == "disabled"
    monkeypatch.delenv("WANDB_MODE")
    assert metrics.wandb_mode("offline") == "offline"
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert metrics.wandb_mode("online") == "offline"
    monkeypatch.delenv("WANDB_MODE")
    logger = metrics.WandbLogger(tmp_path, mode="disabled", project="p", name="", config={})
    logger.log({"step": 1, "loss": 1.0})  # a no-op, never an error
    assert logger.run is None
