"""`coevolve config schema`: the config's JSON Schema, as a user's editor or validator reads it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_config_schema_prints_a_json_schema_the_shipped_configs_satisfy():
    done = subprocess.run(
        [sys.executable, "-m", "coevolve", "config", "schema"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    schema = json.loads(done.stdout)
    assert schema["title"] == "CoevolveConfig" and schema["additionalProperties"] is False
    assert {"run_dir", "policy", "training", "synthesis"} <= set(schema["properties"])
    assert schema["properties"]["run_dir"]["description"]
    jsonschema = pytest.importorskip("jsonschema")
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        jsonschema.validate(yaml.safe_load(path.read_text()) or {}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"cycles": 1, "no_such_field": 1}, schema)
