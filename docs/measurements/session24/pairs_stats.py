"""GDN / softmax wall-time ratio of main_job_pair.sh output files, per pair and as a mean
with its 95% t interval (eval.intervals):

    PYTHONPATH=$PWD python docs/measurements/session24/pairs_stats.py FILE...
"""
import re
import statistics
import sys

from eval import intervals

# "... Elapsed (wall clock) time (h:mm:ss or m:ss): 1:15.42 ... <- gated_deltanet pair s24b1"
LINE = re.compile(r"Elapsed.*?: (\d+):([\d.]+).*<- (\w+) pair (\w+)")


def read_pairs(paths):
    """{pair: {mixer: wall seconds}} of the pairs with both runs."""
    pairs = {}
    for path in paths:
        for line in open(path):
            m = LINE.search(line)
            if m:
                seconds = int(m.group(1)) * 60 + float(m.group(2))
                pairs.setdefault(m.group(4), {})[m.group(3)] = seconds
    return {name: runs for name, runs in pairs.items() if len(runs) == 2}


def main(paths):
    pairs = read_pairs(paths)
    for name, runs in pairs.items():
        print(name, runs["softmax"], runs["gated_deltanet"],
              round(runs["gated_deltanet"] / runs["softmax"], 3))
    ratio = intervals.mean_interval(r["gated_deltanet"] / r["softmax"] for r in pairs.values())
    for mixer in ("softmax", "gated_deltanet"):
        times = [r[mixer] for r in pairs.values()]
        print(f"{mixer}: mean {statistics.mean(times):.1f} s ({min(times):.1f}-{max(times):.1f})")
    print(f"n={ratio.n} ratio mean {ratio.mean:.3f} [{ratio.lo:.3f}, {ratio.hi:.3f}]")


if __name__ == "__main__":
    main(sys.argv[1:])
