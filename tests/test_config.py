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
            "run_dir: runs/x\nenv:\n  name: world\n  split: validation\n"
            "endpoints:\n  judge:\n    base_url: http://127.0.0.1:8000/v1\n    model: qwen\n",
        )
    )
    assert config.env.split == "validation" and config.endpoints["judge"].model == "qwen"


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"env": {"split": "heldout"}}, "overlaps env.split 'heldout'"),
        ({"env": {"split": "validation"}, "evaluation": {"split": "validation"}}, "overlaps"),
        ({"env": {"name": "bfcl", "split": "all"}}, "overlaps env.split 'all'"),
        (
            {"env": {"name": "bfcl"}, "evaluation": {"split": "validation"}},
            "not a BFCL evaluation split; allowed values: heldout",
        ),
        ({"env": {"name": "bfcl", "split": "validation"}}, "not a BFCL split"),
        ({"evaluation": {"split": "all"}}, "not a world evaluation split"),
    ],
)
def test_the_loop_refuses_to_evaluate_on_the_tasks_it_trains_on(settings, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(settings)
    assert load_config({"env": {"name": "bfcl"}}).evaluation.split == "heldout"


def _config_models():
    """Every pydantic model reachable from CoevolveConfig's fields (the sections and theirs)."""
    import typing

    from pydantic import BaseModel

    seen, queue = [], [CoevolveConfig]
    while queue:
        model = queue.pop()
        if model in seen:
            continue
        seen.append(model)
        for field in model.model_fields.values():
            stack = [field.annotation]
            while stack:
                annotation = stack.pop()
                if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                    queue.append(annotation)
                stack.extend(typing.get_args(annotation))
    return seen


def _declared_config_classes() -> set[str]:
    """Names of the package's pydantic classes called *Config or *Settings, read from the
    source (no imports), so a config class nothing reaches yet is still found."""
    import ast
    from pathlib import Path

    import coevolve

    root = Path(coevolve.__file__).parent
    names = set()
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        # the package's own source: not tests or scripts, nor a .venv/build/runs inside the clone
        if {"tests", "examples", "build", "runs"} & set(parts) or any(
            part.startswith(".") for part in parts
        ):
            continue
        if parts[0] == "bench" and len(parts) == 2 and parts[1] != "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith(("Config", "Settings")):
                bases = {getattr(base, "id", getattr(base, "attr", "")) for base in node.bases}
                if bases & {"BaseModel", "Section"}:
                    names.add(node.name)
    return names


def test_every_config_class_is_a_section_of_the_config():
    """The help-text test below covers every config class the package declares."""
    assert {model.__name__ for model in _config_models()} == _declared_config_classes()


@pytest.mark.parametrize("model", _config_models(), ids=lambda model: model.__name__)
def test_every_field_of_every_config_model_has_help_text(model):
    missing = [name for name, field in model.model_fields.items() if not field.description]
    assert missing == [], f"{model.__name__}: fields without help text"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "env:\n  nmae: world\n",
            ["unknown key 'env.nmae'", "did you mean 'name'", "allowed keys: name, split"],
        ),
        ("envv: {}\n", ["unknown key 'envv'", "did you mean 'env'"]),
        (
            "env:\n  name: wrld\n",
            ["env", "unknown environment 'wrld'", "world, bfcl, an import path"],
        ),
        (
            "env:\n  split: test\n",
            ["env", "'test' is not a world split", "train, validation, heldout"],
        ),
        (
            "env:\n  name: bfcl\n  category: simple\n",
            ["'simple' is not a BFCL category", "multi_turn_base"],
        ),
        ("rollout:\n  max_tool_calls: 0\n", ["rollout.max_tool_calls", "greater than 0"]),
        ("policy:\n  kind: endpoint\n", ["needs `endpoint:`"]),
        (
            "policy:\n  kind: endpoint\n  endpoint: vllm\n",
            ["'vllm' is not in `endpoints`", "none defined"],
        ),
        ("policy:\n  kind: local\n  endpoint: vllm\n", ["only used with kind: endpoint"]),
        (
            "synthesis:\n  embedding_endpoint: embedder\n",
            ["synthesis.embedding_endpoint 'embedder' is not in `endpoints`", "none defined"],
        ),
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


def _shipped_configs():
    from pathlib import Path

    import coevolve

    return sorted((Path(coevolve.__file__).parent / "configs").glob("*.yaml"))


def test_every_shipped_config_is_tested():
    assert {path.name for path in _shipped_configs()} >= {
        "quickstart.yaml",
        "bench-learning.yaml",
        "bfcl.yaml",
        "offline.yaml",
        "vllm.yaml",
    }


@pytest.mark.parametrize("path", _shipped_configs(), ids=lambda path: path.name)
def test_shipped_configs_load(path):
    config = load_config(path)
    assert config.run_dir.startswith("runs/")
    assert load_config(config.model_dump(mode="json")) == config  # what a run saves loads back


def test_every_section_lives_beside_its_code():
    """coevolve.config only composes: each section model is defined beside the code it
    configures, and the sections stay importable from coevolve.config by name."""
    import coevolve.config

    sections = [model for model in _config_models() if model is not CoevolveConfig]
    assert len(sections) >= 10
    defined_here = [model.__name__ for model in sections if model.__module__ == "coevolve.config"]
    assert defined_here == []
    for name in coevolve.config.__all__:
        assert hasattr(coevolve.config, name), name


def test_test_presets_load_and_the_quick_bench_is_a_valid_config():
    from coevolve.testing.presets import PRESETS_DIR, quick_bench, tiny_bootstrap, tiny_training

    assert sorted(path.name for path in PRESETS_DIR.glob("*.yaml")) == [
        "bench-quick.yaml",
        "bootstrap-tiny.yaml",
        "training-tiny.yaml",
    ]
    assert tiny_bootstrap().base == "tiny" and tiny_bootstrap(max_steps=5).max_steps == 5
    assert (tiny_training().lora.r, tiny_training(algorithm="dpo").algorithm) == (4, "dpo")
    base = load_config(_shipped_configs()[0].with_name("bench-learning.yaml"))
    quick = load_config({**base.model_dump(mode="json"), **quick_bench()})
    assert quick.bootstrap == tiny_bootstrap()
    assert (quick.cycles, quick.training.max_steps, quick.policy.max_new_tokens) == (1, 2, 16)


def test_pool_seed_tasks_bounds_the_bootstrap_and_its_cache_key():
    """The low-resource regime's one setting: the bootstrap learns from the same first N
    training tasks the pool starts from, and its cache key says so."""
    from pathlib import Path

    from coevolve.bench.learning import seed_families
    from coevolve.training.bootstrap.corpus import build_corpus

    root = Path(__file__).resolve().parents[1]
    config = load_config(root / "configs" / "bench-lowresource-n100.yaml")
    assert config.pool.seed_tasks == config.bootstrap.num_train_tasks == 100
    assert config.bootstrap.cache_key() != load_config({}).bootstrap.cache_key()
    families = seed_families(config)
    assert sum(families.values()) == 100
    # the world's uneven mix, kept: two families absent, five with one or two tasks
    assert "remind_event" not in families and "reschedule_and_notify" not in families
    assert sum(1 for count in families.values() if count <= 2) == 5
    assert len(build_corpus(config.bootstrap)) <= 100
    with pytest.raises(
        ConfigError, match=r"bootstrap\.num_train_tasks 200 is above pool\.seed_tasks"
    ):
        load_config({"pool": {"seed_tasks": 100}, "bootstrap": {"num_train_tasks": 200}})
    # a smaller bootstrap than the pool is allowed; a run of another environment is untouched
    assert load_config({"pool": {"seed_tasks": 100}, "bootstrap": {"num_train_tasks": 50}})
    other = load_config(
        {"env": {"name": "bfcl", "category": "multi_turn_base"}, "pool": {"seed_tasks": 10}}
    )
    assert other.bootstrap.num_train_tasks is None


def test_an_old_key_is_refused_with_the_keys_allowed():
    """rollout.max_steps (tool calls per turn) is now max_tool_calls; at 0.1.0, with no
    release, an old key is an unknown one (no migration shims), and the error lists the
    section's keys."""
    with pytest.raises(ConfigError, match=r"unknown key 'rollout\.max_steps'.*max_tool_calls"):
        load_config({"rollout": {"max_steps": 5}})


def test_a_roles_setting_the_chosen_synthesizer_does_not_read_is_refused_naming_its_reader():
    """Issue 86: synthesis.synthesizer is the one switch; a synthesis.roles field it does not
    read is refused, naming the synthesizer that reads it, never silently ignored."""
    with pytest.raises(
        ConfigError, match=r"roles\.steer is read by synthesizer generator, not by 'variation'"
    ):
        load_config({"synthesis": {"roles": {"steer": False}}})
    with pytest.raises(
        ConfigError, match=r"default_endpoint is read by synthesizer llm, not by 'generator'"
    ):
        load_config(
            {
                "endpoints": {"big": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}},
                "synthesis": {"synthesizer": "generator", "roles": {"default_endpoint": "big"}},
            }
        )
    assert load_config({"synthesis": {"synthesizer": "generator", "roles": {"steer": False}}})
    # off, nothing is read: the static arm keeps its base's settings
    assert load_config({"synthesis": {"enabled": False, "roles": {"steer": False}}})
    assert load_config(None).synthesis.synthesizer == "variation"
