import os

import pytest

# Tests never reach the network: make every Hugging Face / Chroma client say so early.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")


def pytest_collection_modifyitems(config, items):
    """Every test that uses the tiny model is slow: building it trains a model (about a
    minute on two cores, once per session), and such tests train or roll it out.
    Other slow tests carry ``@pytest.mark.slow`` themselves."""
    for item in items:
        if "tiny_build" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def scripted_server():
    """Start scripted OpenAI-compatible servers; each one is stopped after the test.

    ``scripted_server(script, delay_s=0.0, **options)`` takes the arguments of
    ``coevolve.testing.openai_server.ScriptedOpenAIServer`` and returns it running.
    """
    from coevolve.testing.openai_server import ScriptedOpenAIServer

    servers = []

    def start(script=None, delay_s=0.0, **options):
        server = ScriptedOpenAIServer(script, delay_s, **options).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """The session's bootstrap cache (the layout of ``$COEVOLVE_CACHE``): builds are shared."""
    return tmp_path_factory.getbasetemp() / "coevolve-cache"


@pytest.fixture(scope="session")
def tiny_build(cache_dir):
    """The tiny bootstrap model (training/presets/bootstrap-tiny.yaml), built once per session."""
    from coevolve.testing.presets import tiny_bootstrap
    from coevolve.training.bootstrap.build import bootstrap

    return bootstrap(tiny_bootstrap(), cache_dir=cache_dir, progress=False)
