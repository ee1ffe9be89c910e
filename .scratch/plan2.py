import json
from kernels.config import KernelConfig
from kernels.limits import known_device
from kernels.validate import check
from tuner.heuristic import heuristic_config
L = known_device("h200")
plan = {}
for h, q, p in [(8, 9, 46000), (16, 9, 46000), (64, 9, 46000), (128, 9, 46000), (8, 9, 4096), (8, 9, 16384)]:
    base = heuristic_config(L, H=h, q_len=q, prefix=p)
    cfgs = [base]
    for st, wr, wk in ((3, 1, 2), (2, 1, 2), (3, 2, 2), (2, 2, 2)):
        c = KernelConfig(nsplit=base.nsplit, ht=8, tk=32, block=256, stages=st, wr=wr, wk=wk, sf=0, pipe=2)
        if check(c, L, H=h, q_len=q) is None:
            cfgs.append(c)
    plan[f"{h}:{q}:{p}"] = [str(c) for c in cfgs]
print(json.dumps(plan))
