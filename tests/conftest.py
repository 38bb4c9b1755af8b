import json
import os
import shutil

import pytest

# Tests never reach the network: make every Hugging Face / Chroma client say so early.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")


def pytest_collection_modifyitems(config, items):
    """Every test that uses the tiny model is slow: building it trains a model (seconds,
    once per run), and such tests train or roll it out. Other slow tests carry
    ``@pytest.mark.slow`` themselves.

    In pytest-xdist's workers the slow tests come first (in the order collected, the same in
    every worker, as xdist requires): a minute-long test started last leaves the other core
    idle while it ends the run. The test marked ``slow(first=True)`` builds the shared quick
    bench (``quick_bench_every_arm``) and starts the run; the tests that read that bench come
    last among the slow ones, when it is long built, so that no worker waits on its lock."""
    for item in items:
        if "tiny_build" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker
        items.sort(key=_dispatch_order)


def _dispatch_order(item) -> int:
    slow = item.get_closest_marker("slow")
    if slow is None:
        return 3
    if slow.kwargs.get("first"):
        return 0
    return 2 if "quick_bench_every_arm" in getattr(item, "fixturenames", ()) else 1


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
    """The session's bootstrap cache (the layout of ``$COEVOLVE_CACHE``), one per process:
    what one test builds there the next finds (pytest-xdist's workers each have their own)."""
    return tmp_path_factory.getbasetemp() / "coevolve-cache"


@pytest.fixture(scope="session")
def tiny_build(cache_dir, tmp_path_factory, pytestconfig):
    """The tiny bootstrap model (training/presets/bootstrap-tiny.yaml) in ``cache_dir``.

    Built once per run: under pytest-xdist it is the build ``_tiny_model_in_the_default_cache``
    made before any test (the same config, so the same key and files), else the first worker
    to need it builds it in a cache all workers share (the run's temporary directory),
    holding a file lock while it does (two processes building one key would each replace
    the other's finished build); every worker copies it into its own ``cache_dir``, so that
    no worker reads a build another is replacing."""
    from filelock import FileLock

    from coevolve.testing.presets import tiny_bootstrap
    from coevolve.training.bootstrap.bootstrap_config import bootstrap_dir, is_complete
    from coevolve.training.bootstrap.build import bootstrap

    config = tiny_bootstrap()
    if not hasattr(pytestconfig, "workerinput"):  # one process: no other to share with
        return bootstrap(config, cache_dir=cache_dir, progress=False)
    target = bootstrap_dir(config, cache_dir)
    if not is_complete(target) and is_complete(bootstrap_dir(config)):
        shutil.copytree(bootstrap_dir(config), target, dirs_exist_ok=True)
    elif not is_complete(target):
        shared = _shared_dir(tmp_path_factory) / "coevolve-cache"
        with FileLock(_shared_dir(tmp_path_factory) / "tiny-build.lock"):
            built = bootstrap(config, cache_dir=shared, progress=False)
        shutil.copytree(built, target, dirs_exist_ok=True)
    return target


def _shared_dir(tmp_path_factory):
    """The temporary directory of the whole run, above each pytest-xdist worker's own."""
    return tmp_path_factory.getbasetemp().parent


@pytest.fixture(scope="session", autouse=True)
def _tiny_model_in_the_default_cache(pytestconfig, tmp_path_factory):
    """Under pytest-xdist, the tiny model is in the default cache (``$COEVOLVE_CACHE``, else
    ``~/.cache/coevolve``) before any test runs: the quick bench's tests (and the tour's)
    build it there when it is missing, and two workers doing so at once would each
    replace the build the other is reading (``bootstrap`` renames a finished build over
    the target). The first worker builds it under a lock; the others find it there.
    Nothing to do, and nothing imported, where it is already built."""
    if not hasattr(pytestconfig, "workerinput"):
        return
    from coevolve.testing.presets import tiny_bootstrap
    from coevolve.training.bootstrap.bootstrap_config import bootstrap_dir, is_complete

    config = tiny_bootstrap()
    if is_complete(bootstrap_dir(config)):
        return
    from filelock import FileLock

    from coevolve.training.bootstrap.build import bootstrap

    with FileLock(_shared_dir(tmp_path_factory) / "default-cache-tiny-build.lock"):
        bootstrap(config, progress=False)


@pytest.fixture(scope="session")
def quick_bench_every_arm(tmp_path_factory, pytestconfig):
    """`coevolve bench learning --quick --json --seeds 1` with its default (every) arm, run
    once for the whole suite: the test of the documented command asserts on it, and the
    tests of one arm's behaviour (and the end-to-end bench, whose seed 0 it is) read its
    units and run directories instead of running them again. Under pytest-xdist the first
    worker runs it in the run's shared temporary directory, holding a file lock; the others
    read what it wrote. Tests copy what they change: the bench's directory is read-only to
    them."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from filelock import FileLock

    worker = hasattr(pytestconfig, "workerinput")
    shared = _shared_dir(tmp_path_factory) if worker else tmp_path_factory.getbasetemp()
    out_dir = shared / "quick-bench-every-arm"
    done = shared / "quick-bench-every-arm.json"
    with FileLock(shared / "quick-bench-every-arm.lock"):
        if not done.exists():
            ran = subprocess.run(
                [
                    *(sys.executable, "-m", "coevolve", "bench", "learning", "--quick"),
                    *("--json", "--seeds", "1", "--out", str(out_dir)),
                ],
                capture_output=True,
                text=True,
                timeout=1200,
            )
            done.write_text(
                json.dumps(
                    {"returncode": ran.returncode, "stdout": ran.stdout, "stderr": ran.stderr}
                )
            )
    return SimpleNamespace(out_dir=out_dir, **json.loads(done.read_text()))
