"""The README's examples work as written on a fresh clone (scripts/check_readme.py runs
each for a couple of steps: slow, 17 minutes measured on the shared 2 cores, 16 commands),
and the extraction of its commands is right (fast)."""
import sys

import pytest

from tests.training.conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import check_readme  # noqa: E402


def test_every_readme_command_is_found_with_its_optional_arguments_resolved():
    cmds = check_readme.commands((ROOT / "README.md").read_text())
    assert "python train.py --config=configs/mqar.py --workdir=runs/mqar" in cmds
    # the runs the evaluation examples read are made by commands of the README
    for workdir in ("runs/mqar", "runs/niah", "runs/shakespeare"):
        train = [i for i, c in enumerate(cmds)
                 if c.startswith("python train.py") and f"--workdir={workdir} " in c + " "]
        used = [i for i, c in enumerate(cmds)
                if c.startswith("python -m eval.") and f"--workdir={workdir} " in c + " "]
        assert train and used and train[0] < min(used), workdir
    # concrete optional arguments kept, placeholders dropped, comments cut
    assert ("python -m data.prepare --files='corpus/*.txt' --out=stores/corpus "
            "--tokenizer=byte --sample_by=paragraph") in cmds
    assert not any("KEY" in c or "[" in c or "#" in c or "=S " in c for c in cmds)
    assert any(c.startswith("python -m training.population") and c.endswith("--seeds=0,1,2")
               for c in cmds)  # a continued line joined
    assert not any(c.startswith(("pip", "python -m pytest")) for c in cmds)


def test_a_placeholder_option_is_dropped_and_a_concrete_one_kept():
    text = "```\npython x.py --a=1 [--b=2] [--c=NAME] [--config.KEY=VALUE ...] \\\n" \
           "    --d=3   # note\n```\n"
    assert check_readme.commands(text) == ["python x.py --a=1 --b=2 --d=3"]


@pytest.mark.slow
def test_the_readme_commands_pass_on_a_fresh_clone(tmp_path):
    if not check_readme.SHAKESPEARE.exists():
        pytest.skip("tiny-Shakespeare is not in ../shared/data (no network to fetch it)")
    results = check_readme.run_all(tmp_path, log=lambda line: None)
    failed = [(r["command"], r["stderr_tail"][-800:]) for r in results if r["returncode"]]
    assert not failed
    assert len(results) >= 15
