"""Config loads from YAML; mistakes name the key and what is allowed."""

import pytest

from coevolve.config import CoevolveConfig, ConfigError, load_config


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_defaults_and_yaml(tmp_path):
    assert load_config(None) == CoevolveConfig()
    config = load_config(
        write(
            tmp_path,
            "run_dir: runs/x\nenv:\n  name: world\n  split: heldout\n"
            "endpoints:\n  judge:\n    base_url: http://127.0.0.1:8000/v1\n    model: qwen\n",
        )
    )
    assert config.env.split == "heldout" and config.endpoints["judge"].model == "qwen"


def test_every_field_has_help_text():
    from coevolve.config import EndpointConfig, EnvConfig, PolicyConfig, RolloutConfig

    for model in (CoevolveConfig, EnvConfig, EndpointConfig, PolicyConfig, RolloutConfig):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no help text"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "env:\n  nmae: world\n",
            ["unknown key 'env.nmae'", "did you mean 'name'", "allowed keys: name, split"],
        ),
        ("envv: {}\n", ["unknown key 'envv'", "did you mean 'env'"]),
        ("env:\n  name: wrld\n", ["env.name", "'wrld' is not allowed", "'world' or 'bfcl'"]),
        (
            "env:\n  split: test\n",
            ["env", "'test' is not a world split", "train, validation, heldout"],
        ),
        (
            "env:\n  name: bfcl\n  category: simple\n",
            ["'simple' is not a BFCL category", "multi_turn_base"],
        ),
        ("rollout:\n  max_steps: 0\n", ["rollout.max_steps", "greater than 0"]),
        ("policy:\n  kind: endpoint\n", ["needs `endpoint:`"]),
        (
            "policy:\n  kind: endpoint\n  endpoint: vllm\n",
            ["'vllm' is not in `endpoints`", "none defined"],
        ),
        ("policy:\n  kind: local\n  endpoint: vllm\n", ["only used with kind: endpoint"]),
        (
            "endpoints:\n  judge:\n    base_url: http://x/v1\n    model: m\n    temprature: 0\n",
            ["unknown key 'endpoints.judge.temprature'", "did you mean 'temperature'"],
        ),
        ("- a\n- b\n", ["top level must be a mapping"]),
        ("env: [\n", ["not valid YAML"]),
    ],
)
def test_bad_configs_say_what_to_fix(tmp_path, text, expected):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    for fragment in expected:
        assert fragment in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_api_key_from_environment(monkeypatch):
    config = load_config(
        {"endpoints": {"p": {"base_url": "http://x/v1", "model": "m", "api_key_env": "MY_KEY"}}}
    )
    monkeypatch.delenv("MY_KEY", raising=False)
    with pytest.raises(ConfigError, match="MY_KEY"):
        config.endpoints["p"].api_key()
    monkeypatch.setenv("MY_KEY", "secret")
    assert config.endpoints["p"].api_key() == "secret"


@pytest.mark.parametrize("name", ["offline.yaml", "vllm.yaml"])
def test_shipped_configs_load(name):
    from pathlib import Path

    import coevolve

    config = load_config(Path(coevolve.__file__).parent / "configs" / name)
    assert config.run_dir.startswith("runs/")
