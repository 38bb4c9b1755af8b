"""Configuration of the synthesis pass (graph/synthesis/graph.py): its roles, the task store, dedup."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ...agents.config import EndpointConfig
from ...agents.roles.role_interfaces import FIELDS_READ_BY, SYNTHESIZERS, RolesConfig, Synthesizer
from ...common.config_base import Section


class SynthesisConfig(Section):
    """The synthesis pass: which synthesizer, its roles' settings, the task store and dedup."""

    synthesizer: Synthesizer = Field(
        default="variation",
        description="What makes the synthesized tasks: "
        + "; ".join(f"{name} = {what}" for name, what in SYNTHESIZERS.items())
        + ". A roles field the chosen synthesizer does not read is refused.",
    )
    roles: RolesConfig = Field(
        default_factory=RolesConfig, description="The settings of the synthesizer's roles."
    )
    store_path: str | None = Field(
        default=None, description="Chroma store directory (None: <run_dir>/task_store)."
    )
    store_url: str | None = Field(
        default=None,
        description="A Chroma server (http://host:port) instead of the embedded store.",
    )
    dedup_threshold: float = Field(
        default=0.8, gt=0.0, le=1.0, description="Cosine similarity at which a task is a duplicate."
    )
    embedding_endpoint: str | EndpointConfig | None = Field(
        default=None,
        description="Where the task store's embeddings come from: the name of an entry in "
        "`endpoints`, or an inline endpoint, serving /v1/embeddings (its model is the embedding "
        "model; timeout_s and max_retries apply). None: all-MiniLM-L6-v2 on this machine. A "
        "store keeps the embedding it was built with: a new one needs a new store_path.",
    )
    neighbours: int = Field(
        default=5, ge=0, description="Nearest stored tasks shown to the abstractor."
    )
    max_concurrency: int = Field(default=16, gt=0, description="Flagged items synthesized at once.")
    enabled: bool = Field(
        default=True,
        description="False: no synthesis; the pool stays the seed tasks (the 'static' arm of "
        "the learning ablation).",
    )
    max_accepted: int | None = Field(
        default=None,
        gt=0,
        description="Most synthesized tasks a cycle accepts (None: every novel one); the "
        "learning ablation fixes it so that every arm gets the same amount of new data.",
    )
    dedup_against: Literal["all", "synthesized"] = Field(
        default="all",
        description="Which stored tasks a candidate is compared with for dedup (the batch "
        "always counts): all (the paper's rule), or synthesized tasks only. Structure-keeping "
        "variants share their family's wording and tool line with the seed tasks (0.8-1.0 "
        "similarity to the nearest of 1000 seeds, docs/benchmarks.md), so against the seeds "
        "most of them read as duplicates.",
    )
    frontier_samples: int = Field(
        default=0,
        ge=0,
        description="The frontier check: episodes of the current policy on each candidate the "
        "judge accepted, at the rollout temperature, before dedup (0: no check). A candidate "
        "the policy already solves in more than frontier_max_solved of them is rejected: it "
        "teaches nothing the agent cannot do.",
    )
    frontier_max_solved: float = Field(
        default=0.5,
        ge=0.0,
        lt=1.0,
        description="The largest share of its frontier_samples episodes the policy may solve "
        "for a candidate to be kept (0.5 with 4 samples: kept at 0, 1 or 2 of 4).",
    )
    judge_veto: bool = Field(
        default=True,
        description="True: a candidate is accepted only if its replay verifies and the judge "
        "agrees (an LLM judge's no rejects it). False: the paper's rule, judged successful OR "
        "rewarded by the environment.",
    )

    @model_validator(mode="after")
    def _roles_fields_the_synthesizer_reads(self) -> SynthesisConfig:
        if not self.enabled:
            return self
        for name in sorted(self.roles.model_fields_set):
            readers = FIELDS_READ_BY.get(name)
            if readers is None or self.synthesizer in readers:
                continue
            # a field written at its default asks for nothing (a bench arm resets one so)
            if getattr(self.roles, name) != RolesConfig.model_fields[name].default:
                raise ValueError(
                    f"synthesis.roles.{name} is read by synthesizer {' or '.join(readers)}, "
                    f"not by {self.synthesizer!r} (synthesis.synthesizer): remove it, or set "
                    f"synthesis.synthesizer: {readers[0]}"
                )
        return self
