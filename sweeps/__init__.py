"""Architecture-comparison sweeps: a grid of train.py runs, measured with eval/, tabled.

  grid     the sweep config's runs, the slice one process takes, each run's config
  runner   runs the grid one run after another; done / partial / failed record files
  tasks    what one run records: eval/ metrics of a trained run, or eval.speed timings
  outputs  results.jsonl, results.md and plots of a sweep directory
  publish  finished sweeps into docs/ (results.json and the plots)
  run      the command line: python -m sweeps.run --config=... --workdir=...
"""
