"""Session 47: do softmax's and the hybrid's new seeds 3-5 at lr 3e-4 land inside the
95% t-intervals of seeds 0-2 (published in sessions 45-46)?"""
import json, numpy as np
from scipy import stats
r = [json.loads(l) for l in open('results.jsonl')]
tasks = [('passkey', ''), ('multikey', '_multikey'), ('passkey7', '_passkey7'), ('mk2', '_mk2'),
         ('mk3', '_mk3'), ('mv', '_mv')]
def at_train(g):
    cells = [c for c in g['cells'] if c['length'] == g['train_length']]
    return sum(c['exact'] * c['examples'] for c in cells) / sum(c['examples'] for c in cells)
inside = total = 0
for mixer in ['softmax', 'hybrid']:
    rows = sorted([x for x in r if x['mixer'] == mixer and abs(x['lr'] - 3e-4) < 1e-9], key=lambda x: x['seed'])
    cols = [(n, (lambda m, t=t: at_train(m['grid' + t]))) for n, t in tasks] + [('passkey grid', lambda m: m['exact'])]
    for name, f in cols:
        v = np.array([f(x['metrics']) for x in rows]); seeds = [x['seed'] for x in rows]
        old, new = v[:3], v[3:]
        h = stats.t.ppf(0.975, 2) * old.std(ddof=1) / np.sqrt(3)
        lo, hi = old.mean() - h, old.mean() + h
        ins = [(lo <= y <= hi) for y in new]
        inside += sum(ins); total += len(ins)
        print(f"{mixer:8s} {name:13s} seeds{seeds[:3]} {old.mean():.3f} [{lo:.3f}, {hi:.3f}]  new {' '.join(f'{y:.3f}' for y in new)}  inside {sum(ins)}/3")
print(f"inside {inside} of {total}")
