"""The closed loop from Python: the same run as `coevolve run`, with a config edited in code.

`python examples/closed_loop.py` makes two quick cycles into runs/example;
`python examples/closed_loop.py --resume` continues them after Ctrl-C or a kill;
`--quick` makes them with the tiny test model and small sections (seconds; it learns nothing,
the test suite runs it so).
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
    if "--quick" in sys.argv:
        from coevolve.training.tiny_presets import quick_bench

        config = config.model_validate({**config.model_dump(), **quick_bench()})
    config.run_dir = "runs/example"
    config.cycles = 2
    if "--quick" not in sys.argv:
        config.training.max_steps = 20  # a shorter training step per cycle
    result = coevolve.run(config, overwrite=True)

for cycle in result.cycles:
    if cycle.evaluate is not None:  # every cycle unless evaluation.every says otherwise
        print(f"cycle {cycle.cycle}: held-out success {cycle.evaluate.success:.1%}")
print("pool:", result.pool)
print("report:", result.report)
