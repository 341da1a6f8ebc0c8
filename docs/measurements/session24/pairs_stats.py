"""GDN / softmax wall-time ratio of main_job_pair.sh output files, per pair and as a mean
with its 95% t interval:  python docs/measurements/session24/pairs_stats.py FILE...
"""
import re, sys, statistics
from scipy import stats
rows = {}
for path in sys.argv[1:]:
    for line in open(path):
        m = re.search(r"Elapsed.*?: (\d+):([\d.]+).*<- (\w+) pair (\w+)", line)
        if m:
            rows.setdefault(m.group(4), {})[m.group(3)] = int(m.group(1)) * 60 + float(m.group(2))
ratios = []
for pair, r in rows.items():
    if len(r) == 2:
        ratios.append(r["gated_deltanet"] / r["softmax"])
        print(pair, r["softmax"], r["gated_deltanet"], round(ratios[-1], 3))
n = len(ratios); m = statistics.mean(ratios); se = statistics.stdev(ratios) / n ** 0.5
h = stats.t.ppf(0.975, n - 1) * se
sm = [r["softmax"] for r in rows.values() if len(r) == 2]; gd = [r["gated_deltanet"] for r in rows.values() if len(r) == 2]
print(f"n={n} ratio mean {m:.3f} [{m-h:.3f}, {m+h:.3f}]  softmax mean {statistics.mean(sm):.1f} ({min(sm):.1f}-{max(sm):.1f})  GDN mean {statistics.mean(gd):.1f} ({min(gd):.1f}-{max(gd):.1f})  ratio of means {statistics.mean(gd)/statistics.mean(sm):.3f}")
