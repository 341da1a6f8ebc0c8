"""sweeps/h200_sweeps.sh hands a stage's flags to sweeps.run as a shell would split them:
a quoted flag with spaces (`--config.seeds="(3, 4)"`) stays one flag, and a stage whose
flags are wrong fails alone."""
import os
import pathlib
import subprocess
import sys

from tests.conftest import ROOT
from tests.training.conftest import env


def test_quoted_flags_reach_sweeps_run_whole_and_a_bad_stage_fails_alone(tmp_path):
    stages = ('0 tiny configs/compare_mqar.py:tiny 60 120 --only=softmax '
              '--config.seeds="(3, 4)" --config.title="two words" --report_only'
              ' ; bad configs/compare_mqar.py:tiny 60 120 --config.seeds=(3, --report_only'
              ' ; after configs/compare_mqar.py:tiny 60 120 --report_only')
    # the script runs `python3`: this interpreter's, as the test session's subprocesses
    lane_env = env(OUT=str(tmp_path / "out"), SWEEPS_DIR=str(tmp_path / "sweeps"),
                   PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}")
    r = subprocess.run(["bash", "sweeps/h200_sweeps.sh", stages], cwd=ROOT, env=lane_env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    log = (tmp_path / "sweeps" / "logs" / "lane0.txt").read_text()
    assert "stage tiny ended (exit 0)" in log, log
    assert "# two words" in (tmp_path / "sweeps" / "tiny" / "results.md").read_text()
    assert "expected a Python tuple" in log and "stage bad ended (exit 1)" in log, log
    assert "stage after ended (exit 0)" in log, log
