"""The closed loop from Python: the same run as `coevolve run`, with a config edited in code.

`python examples/closed_loop.py` makes two quick cycles into runs/example;
`python examples/closed_loop.py --resume` continues them after Ctrl-C or a kill.
"""

import sys
from pathlib import Path

import coevolve
from coevolve.config import load_config

QUICKSTART = Path(coevolve.__file__).parent / "configs" / "quickstart.yaml"

if "--resume" in sys.argv:
    result = coevolve.resume("runs/example")
else:
    config = load_config(QUICKSTART)
    config.run_dir = "runs/example"
    config.cycles = 2
    config.training.max_steps = 20  # a shorter training step per cycle
    result = coevolve.run(config, overwrite=True)

for cycle in result.cycles:
    if cycle.evaluate is not None:  # every cycle unless evaluation.every says otherwise
        print(f"cycle {cycle.cycle}: held-out success {cycle.evaluate.success:.1%}")
print("pool:", result.pool)
print("report:", result.report)
