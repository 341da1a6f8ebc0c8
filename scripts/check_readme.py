"""Runs every command of the README's code blocks, in order, in a fresh clone, each for
a couple of training steps, and prints a table of what passed.

    python scripts/check_readme.py [--workdir DIR] [--only TEXT]

The clone is `git clone` of this repository's committed HEAD into DIR/clone (a
temporary directory by default). What the README asks the reader to bring is provided
as the README names it:
  corpus/*.txt        your text files: the clone's docs/*.md, copied
  held_out/*.txt      other text to score: the last 20 kB of tiny-Shakespeare
  NAME (--hf_name)    a hub dataset: a local folder of data files (datasets reads it
                      offline as it streams a hub dataset)
  path/to/llama       a Hugging Face checkpoint folder: the tiny Llama of
                      tests/fixtures/hf/llama
  the curl download   tiny-Shakespeare copied from ../shared/data (this machine has no
                      network); the command fails if it is absent
Optional arguments written `[--flag=value]` are kept when their value is concrete and
dropped when it is a placeholder (`[--hf_subset=S]`, `[--config.KEY=VALUE ...]`).
Training is cut to a couple of steps by appending --config.train.steps=2 (and no
evaluation or checkpoint before the end) to train.py and training.population (and each
stage of training.convert), and
--config.overrides.train.steps=2 --only=<the grid's first run> to a full sweep (its
:tiny variant runs whole); eval.recall gets --num_examples=16. `pip install` and the
test suite are not run. Exit status 1 if any command failed.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
SKIP = ("pip ", "python -m pytest")
NO_EVAL_BEFORE_END = ["--config.train.eval_every=0", "--config.train.checkpoint_every=0",
                      "--config.train.eval_batches=2"]
TRAIN_STEPS = ["--config.train.steps=2"] + NO_EVAL_BEFORE_END
CONVERT_STEPS = ["--config.convert.stage1_steps=2", "--config.convert.stage2_steps=2",
                 "--config.convert.report_batches=1"] + NO_EVAL_BEFORE_END
HF_CHECKPOINT = ("path/to/llama", pathlib.Path("tests") / "fixtures" / "hf" / "llama")
PLACEHOLDER = re.compile(r"\.\.\.|=[A-Z][A-Z_]*\b|\bKEY\b")


def code_blocks(text: str) -> list[list[str]]:
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def commands(text: str) -> list[str]:
    """The README's shell commands, in order: continuation lines joined, trailing
    `# comments` removed, optional `[...]` arguments kept or dropped (module docstring).
    Blocks that hold no command (the layout) are skipped."""
    out = []
    for block in code_blocks(text):
        joined, pending = [], ""
        for line in block:
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            joined.append(pending + line)
            pending = ""
        for line in joined:
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if not line or not re.match(r"^(python|mkdir|curl|bash)\b", line):
                continue
            if line.startswith(SKIP):
                continue
            line = re.sub(r"\[([^\]]*)\]",
                          lambda m: "" if PLACEHOLDER.search(m.group(1)) else m.group(1),
                          line)
            out.append(" ".join(line.split()))
    return out


def provide_data(clone: pathlib.Path) -> None:
    corpus = clone / "corpus"
    corpus.mkdir(exist_ok=True)
    for md in sorted((clone / "docs").glob("*.md")):
        shutil.copyfile(md, corpus / (md.stem + ".txt"))
    held = clone / "held_out"
    held.mkdir(exist_ok=True)
    if SHAKESPEARE.exists():
        (held / "shakespeare_tail.txt").write_text(SHAKESPEARE.read_text()[-20000:])
    checkpoint, fixture = HF_CHECKPOINT
    shutil.copytree(clone / fixture, clone / checkpoint, dirs_exist_ok=True)
    hf = clone / "hf_local"
    hf.mkdir(exist_ok=True)
    with open(hf / "train.jsonl", "w") as f:
        for i, md in enumerate(sorted((clone / "docs").glob("*.md"))):
            f.write(json.dumps({"text": md.read_text(), "id": i}) + "\n")


def adapt(cmd: str, clone: pathlib.Path) -> list[str] | str:
    """The command as run here: a list of arguments, or a shell string."""
    if cmd.startswith(("mkdir", "curl")) or "&&" in cmd:
        parts = []
        for part in cmd.split("&&"):
            part = part.strip()
            if part.startswith("curl"):
                out = shlex.split(part)[shlex.split(part).index("-o") + 1]
                # no network here: the file the README downloads, from ../shared
                part = f"cp {shlex.quote(str(SHAKESPEARE))} {shlex.quote(out)}"
            parts.append(part)
        return " && ".join(parts)
    args = shlex.split(cmd)
    args = [a.replace("=NAME", "=hf_local") if a.startswith("--hf_name") else a
            for a in args]
    args = [a.replace("stores/NAME", "stores/hf_local") for a in args]
    if args[:2] == ["python", "train.py"] or args[:3] == ["python", "-m",
                                                          "training.population"]:
        args += TRAIN_STEPS
    if args[:3] == ["python", "-m", "training.convert"]:
        args += CONVERT_STEPS
    if args[:3] == ["python", "-m", "sweeps.run"]:
        config = next(a.split("=", 1)[1] for a in args if a.startswith("--config="))
        if not config.endswith(":tiny"):
            args += ["--config.overrides.train.steps=2", f"--only={first_run(config, clone)}"]
    if args[:3] == ["python", "-m", "eval.recall"]:
        args += ["--num_examples=16"]
    args[0] = sys.executable
    return args


def first_run(config: str, clone: pathlib.Path) -> str:
    code = ("import sys, importlib.util; from sweeps import grid\n"
            "path, _, arg = sys.argv[1].partition(':')\n"
            "spec = importlib.util.spec_from_file_location('c', path)\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "print(grid.expand_grid(m.get_config(arg).to_dict())[0]['name'])\n")
    r = subprocess.run([sys.executable, "-c", code, config], cwd=clone, text=True,
                       capture_output=True, env=dict(os.environ, PYTHONPATH=str(clone)),
                       check=True)
    return r.stdout.strip()


def run_all(workdir: pathlib.Path, only: str = "", log=print) -> list[dict]:
    clone = workdir / "clone"
    if clone.exists():
        shutil.rmtree(clone)
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    provide_data(clone)
    env = dict(os.environ, PYTHONPATH=str(clone))
    env.pop("XLA_FLAGS", None)
    results = []
    for cmd in commands((clone / "README.md").read_text()):
        if only and only not in cmd:
            continue
        how = adapt(cmd, clone)
        t0 = time.time()
        r = subprocess.run(how, cwd=clone, env=env, text=True, capture_output=True,
                           shell=isinstance(how, str), stdin=subprocess.DEVNULL)
        tail = (r.stderr.strip().splitlines() or r.stdout.strip().splitlines() or [""])[-1]
        results.append({"command": cmd, "run": how if isinstance(how, str)
                        else " ".join(shlex.quote(a) for a in how),
                        "returncode": r.returncode, "seconds": time.time() - t0,
                        "last_line": tail[:300],
                        "stderr_tail": r.stderr[-3000:] if r.returncode else ""})
        log(f"{'ok  ' if r.returncode == 0 else 'FAIL'} {time.time() - t0:6.1f}s  {cmd}"
            + ("" if r.returncode == 0 else f"\n      {tail[:300]}"))
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default=None, help="where the clone goes (default: temp)")
    p.add_argument("--only", default="", help="run only commands containing this text")
    a = p.parse_args()
    workdir = pathlib.Path(a.workdir or tempfile.mkdtemp(prefix="readme_check_"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = run_all(workdir, a.only)
    (workdir / "readme_check.json").write_text(json.dumps(results, indent=1))
    failed = [r for r in results if r["returncode"]]
    print(f"{len(results) - len(failed)} of {len(results)} README commands passed "
          f"({workdir / 'readme_check.json'})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
