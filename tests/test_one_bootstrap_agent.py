"""Issue 87: one agent called "bootstrap". After `make demo`, the README tour's `--policy
bootstrap` and `coevolve bootstrap` with no arguments use the agent the demo built (the
main job's recipe, configs/quickstart.yaml), not another build under another key."""

from __future__ import annotations

import re
from pathlib import Path

from coevolve.commands.common import MAIN_CONFIG, bootstrap_recipe, policy_config
from coevolve.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def test_the_tours_policy_bootstrap_is_the_quickstarts_cached_agent():
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"coevolve eval --env world --split heldout --policy bootstrap", readme)
    demo = load_config(ROOT / "configs" / "quickstart.yaml").bootstrap.cache_key()
    assert MAIN_CONFIG.resolve() == (ROOT / "configs" / "quickstart.yaml").resolve()
    assert policy_config("bootstrap").bootstrap.cache_key() == demo
    # `coevolve bootstrap` with no arguments builds that agent too, and measures it
    recipe = bootstrap_recipe(None, None)
    assert recipe.cache_key() == demo and recipe.eval_split == "validation"
    # another recipe is another key (the output names it)
    assert bootstrap_recipe(None, "tiny").cache_key() != demo
    assert load_config(None).bootstrap.cache_key() != demo  # the model defaults differ
