"""The learning-efficiency ablation: does signal-guided synthesis beat static or random data?

``coevolve bench learning`` runs the closed loop once per (arm, seed) from the
same bootstrap model with the same compute: the same cycles, the same gradient
steps per cycle (``training.max_steps``) and, for every arm that synthesizes,
the same number of accepted synthetic tasks per cycle (``synthesis.max_accepted``).
The arms differ only in where the new data comes from:

- ``static``: no synthesis; the pool stays the seed tasks;
- ``random``: synthesis from trajectories picked at random;
- ``coevolve-oracle``: synthesis from the trajectories the detectors flag (the paper's
  three plus unsolved), the budget split by each family's failure rate, the tasks written
  by the environment's own task generator (``WorldEnvironment.variant``: an oracle
  synthesizer; the arm was ``coevolve`` before issue 55, and units of that name still count);
- ``coevolve-paper``: the paper's three detectors only, budget by kind priority;
- ``oracle-targeted``: trajectories of the families the current agent solves less
  than half of on the validation split (a reference ceiling, never a product arm:
  it reads validation each cycle);
- ``no-forgetting`` / ``no-boundary`` / ``no-rare`` / ``no-unsolved``: coevolve-oracle
  without one detector;
- ``grpo``, ``seal``, ``seal-no-reweighting``, ``seal-no-adaptation``: coevolve-oracle
  trained by GRPO instead of SFT (the same optimisation steps): plain, with
  SEAL's diagnosis-weighted advantages and training-only interface, and
  without each of the two;
- ``hard-negatives`` / ``own-negatives``: the target agent trained by DPO + SFT
  on expert vs failure pairs, with and without the failure agent's negatives.

Every (arm, seed) run is a finished unit: its result is written to
``<out>/units/<arm>-seed<N>.json`` when it ends (with its accepted tasks beside it,
``<arm>-seed<N>.tasks.jsonl``, and per cycle its training rows by source and optimiser
steps), and a rerun with the same config at the same code (``code.code_fingerprint``)
skips it, so a long bench can run in pieces. A unit whose run was killed
before it finished (its run directory holds the same config and a checkpoint)
continues from that run's last finished stage.

Each run is evaluated on the held-out split after every cycle. The report
gives, per arm, the mean final held-out success with a 95% t-interval over
seeds (and per family), paired differences between arms (paired by seed: the
same seed means the same rollout sampling and training order), and learning
curves (learning_curves.png), per family (family_curves.png) and the paired
differences per family (family_differences.png).
"""

from .arms import (
    ARMS,
    HARD_NEGATIVES_LEARNING_RATE,
    arm_config,
    check_arms,
)
from .code import CodeAcceptance, code_fingerprint, package_commit, unit_code_files
from .figures import plot_curves, plot_family_curves, plot_family_differences
from .report import (
    BASELINES,
    PAPER_EFFECTS,
    REFERENCE_EFFECT,
    REFERENCE_PAIRS,
    AblationReport,
    ArmRun,
    CycleTraining,
    Interval,
    Power,
    family_pairs,
    interval,
    paired_interval,
    seed_families,
    summarize,
)
from .tables import print_report
from .units import (
    AcceptedTask,
    accepted_tasks_of,
    family_curves_of,
    run_ablation,
    unit_still_counts,
    was_killed,
)

__all__ = [
    "ARMS",
    "BASELINES",
    "HARD_NEGATIVES_LEARNING_RATE",
    "PAPER_EFFECTS",
    "REFERENCE_EFFECT",
    "REFERENCE_PAIRS",
    "AblationReport",
    "AcceptedTask",
    "ArmRun",
    "CodeAcceptance",
    "CycleTraining",
    "Interval",
    "Power",
    "accepted_tasks_of",
    "arm_config",
    "check_arms",
    "code_fingerprint",
    "family_curves_of",
    "family_pairs",
    "interval",
    "package_commit",
    "paired_interval",
    "plot_curves",
    "plot_family_curves",
    "plot_family_differences",
    "print_report",
    "run_ablation",
    "seed_families",
    "summarize",
    "unit_code_files",
    "unit_still_counts",
    "was_killed",
]
