"""CPU side by side: the MQAR paper recipe's train step (eval.speed.measure, the step
train.py runs) with logits at the queries only (the default now) and at every position
(MQARDataset.targets_per_row patched to None), alternated, 3 rounds."""
import sys
from data import mqar
from eval import speed
from training import config_tools

cfg = config_tools.load_config_file("configs/mqar_zoology_paper.py")
config_tools.set_values(cfg, {"model.d_model": int(sys.argv[1]), "model.mixer": sys.argv[2],
                              "model.num_heads": int(sys.argv[3])})
bound = mqar.MQARDataset.targets_per_row
for r in range(3):
    for name, prop in (("queries", bound), ("every position", property(lambda s: None))):
        mqar.MQARDataset.targets_per_row = prop
        out = speed.measure(cfg, train_lengths=(256,), train_batch=32, train_steps=10,
                            log=lambda *a: None)
        print(r, name, out["train"], flush=True)
