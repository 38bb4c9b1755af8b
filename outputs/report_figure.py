"""The run's report figure (``report.png``): held-out success, signals, the pool, the loss,
the flags by family and their precision, one panel each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..records import SIGNAL_KINDS


def plot_report(rows: list[dict[str, Any]], path: Path) -> Path:
    """Six panels: held-out success by cycle (and family), signals by kind, pool growth, loss,
    where the flags land (kept items per family and cycle), and flag precision."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 3, figsize=(18, 8))
    families = sorted({f for row in rows for f in (row["heldout_by_family"] or {})})
    _plot_heldout(axes[0][0], rows, families)
    trained = [row for row in rows if row["cycle"] > 0]
    _plot_signals(axes[0][1], trained)
    _plot_pool(axes[1][0], trained)
    _plot_loss(axes[1][1], trained)
    _plot_flags(figure, axes[0][2], trained, families)
    _plot_precision(axes[1][2], trained)
    for ax in axes.flat:
        ax.set_xlabel("cycle")
    for ax in (axes[0][1], axes[1][0], axes[1][1], axes[1][2]):
        ax.set_xticks([row["cycle"] for row in trained] or [1])
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _plot_heldout(ax: Any, rows: list[dict[str, Any]], families: list[str]) -> None:
    """Held-out success by cycle: overall, over each family's in grey."""
    evaluated = [row for row in rows if row["heldout_success"] is not None]
    for family in families:
        ax.plot(
            [row["cycle"] for row in evaluated],
            [100 * (row["heldout_by_family"] or {}).get(family, 0.0) for row in evaluated],
            color="0.8",
            linewidth=0.8,
        )
    ax.plot(
        [row["cycle"] for row in evaluated],
        [100 * row["heldout_success"] for row in evaluated],
        marker="o",
        linewidth=2.5,
        label="overall",
    )
    ax.set_title("held-out success by cycle (grey: per family)")
    ax.set_ylabel("success %")
    ax.set_xticks([row["cycle"] for row in rows])
    ax.legend()


def _plot_signals(ax: Any, trained: list[dict[str, Any]]) -> None:
    """The flagged trajectories of each trained cycle, stacked by signal kind."""
    bottom = [0] * len(trained)
    for kind in SIGNAL_KINDS:
        counts = [row["signals"].get(kind, 0) for row in trained]
        ax.bar([row["cycle"] for row in trained], counts, bottom=bottom, label=kind)
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    ax.set_title("flagged trajectories by signal kind")
    ax.legend()


def _plot_pool(ax: Any, trained: list[dict[str, Any]]) -> None:
    """The synthesized tasks in the pool, and each cycle's duplicates."""
    ax.plot(
        [row["cycle"] for row in trained],
        [row["pool_synthesized"] or 0 for row in trained],
        marker="o",
        label="synthesized tasks in pool",
    )
    ax.bar(
        [row["cycle"] for row in trained],
        [row["duplicates"] or 0 for row in trained],
        alpha=0.4,
        label="duplicates this cycle",
    )
    ax.set_title("pool growth")
    ax.legend()


def _plot_loss(ax: Any, trained: list[dict[str, Any]]) -> None:
    """Each cycle's last logged training loss."""
    losses = [(row["cycle"], row["train_loss"]) for row in trained if row["train_loss"] is not None]
    if losses:
        ax.plot([c for c, _ in losses], [loss for _, loss in losses], marker="o")
    ax.set_title("training loss (last logged, per cycle)")


def _plot_flags(figure: Any, ax: Any, trained: list[dict[str, Any]], families: list[str]) -> None:
    """Where the flags land: kept flagged items per family and cycle, as a heat map."""
    flag_families = sorted(
        {f for row in trained for f in (row["flags_by_family"] or {})} | set(families)
    )
    if trained and flag_families:
        grid = [
            [
                ((row["flags_by_family"] or {}).get(family) or {}).get("kept_items", 0)
                for row in trained
            ]
            for family in flag_families
        ]
        image = ax.imshow(grid, aspect="auto", cmap="Blues")
        ax.set_yticks(range(len(flag_families)), flag_families, fontsize=7)
        ax.set_xticks(range(len(trained)), [str(row["cycle"]) for row in trained])
        figure.colorbar(image, ax=ax, label="kept flagged items")
    ax.set_title("where the flags land (synthesis budget per family)")


def _plot_precision(ax: Any, trained: list[dict[str, Any]]) -> None:
    """Flag precision by cycle: the share of the budget on families under 50% success."""
    precision = [(row["cycle"], row["flag_precision"]) for row in trained]
    precision = [(c, p) for c, p in precision if p is not None]
    if precision:
        ax.plot([c for c, _ in precision], [100 * p for _, p in precision], marker="o")
    ax.set_ylim(0, 105)
    ax.set_title("flag precision: % of budget on families < 50% rollout success")
