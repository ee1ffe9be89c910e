import json
from kernels.limits import known_device
from tuner.heuristic import heuristic_config
L = known_device("h200")
shapes = [(8, 9, 46000), (16, 9, 46000), (64, 9, 46000), (128, 9, 46000), (8, 9, 4096), (8, 1, 131072)]
print(json.dumps({f"{h}:{q}:{p}": [str(heuristic_config(L, H=h, q_len=q, prefix=p))] for h, q, p in shapes}))
