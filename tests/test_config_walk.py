"""bench/config_walk.py's counts: stops, files, climbs back up and returns (issue 72)."""

from coevolve.bench.config_walk import counts


def test_a_walk_counts_its_climbs_back_up_and_returns():
    stops = [
        ("runner.py", "run"),
        ("loop/build_runtime.py", "build_runtime"),  # down
        ("training/bootstrap/build.py", "bootstrap"),  # across, down
        ("training/bootstrap/corpus.py", "build_corpus"),  # the same folder
        ("training/config.py", "LoraAdapterConfig.to_peft"),  # up from training/bootstrap/
        ("loop/build_runtime.py", "build_policy"),  # across, and back to a file it left
        ("runner.py", "_execute"),  # up to the root, and back
    ]
    assert counts(stops) == {
        "stops": 7,
        "files": 5,
        "climbs_back_up": 2,
        "returns": 2,
        "stops_in_bootstrap_build": 2,
    }
