"""Where GRPO's multi-turn episodes get their replies, and the policy that continues on them.

A reply generator (``ReplyGenerator``) takes the live episodes' token ids and a
reply cap and returns each episode's reply ids with their log-probs: sampled
from the trainer's own model (``model_replies``), from its colocated vLLM engine
(``vllm_replies``), or scripted (a reference episode,
``training/grpo/reference_episodes.py``). ``GeneratedIdsPolicy`` puts a
generator behind the ``Policy`` protocol, so the rollout engine
(``agents.policy.rollout``) plays the episodes: each prompt continues the episode's
ids verbatim with the *rendered delta* of what the environment said since
(``rendered_delta``), and the reply is decoded only to be parsed
(``training/grpo/multiturn_rollout.py`` has the whole account).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...agents.policy.policy_interface import AssistantMessage, Message, parse_assistant_text
from ...agents.policy.rendering import encode, end_of_turn_id, render_conversation, reply_drop_ids


class TemplateNotPrefixPreserving(ValueError):
    """The chat template renders a conversation's earlier part differently once more follows."""


def rendered_delta(
    tokenizer: Any,
    history: Sequence[Message],
    new_messages: Sequence[Message],
    tools: Sequence[dict[str, Any]] | None,
    end_of_turn: str,
) -> list[int]:
    """Ids of what follows the last reply's end-of-turn token: ``new_messages`` and the
    next generation prompt, as the chat template renders them after ``history``.

    The reply itself is not re-encoded: only text after its end-of-turn token is.
    """
    before = render_conversation(tokenizer, history, tools)
    after = render_conversation(
        tokenizer, [*history, *new_messages], tools, add_generation_prompt=True
    )
    # The template closes the reply with the end-of-turn token and maybe a newline; the
    # generated ids stop at the token, so the delta starts right after it.
    cut = before.rfind(end_of_turn)
    if cut >= 0:
        before = before[: cut + len(end_of_turn)]
    if not after.startswith(before):
        raise TemplateNotPrefixPreserving(
            "the chat template renders the conversation differently once tool results or a "
            "next user message follow, so the episode cannot continue on the generated ids; "
            "use a prefix-preserving template (the bootstrap and SmolLM2 templates are), or "
            "training.grpo.rollout: tool_loop"
        )
    return encode(tokenizer, after[len(before) :])


# Given the live episodes' token ids and a reply cap: each one's reply ids and their log-probs.
ReplyGenerator = Callable[[list[list[int]], int], tuple[list[list[int]], list[list[float]]]]


def model_replies(model: Any, tokenizer: Any, temperature: float) -> ReplyGenerator:
    """Replies sampled from the trainer's own model (``kv_reuse.generate_batch``), each
    episode's keys and values kept between its replies in one call's cache."""
    from ...agents.policy.kv_reuse import PrefixCache, generate_batch

    eot = end_of_turn_id(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eot
    cache = PrefixCache()  # fresh per rollout call: the weights changed since the last one

    def replies(prompts: list[list[int]], max_new_tokens: int) -> Any:
        logprobs: list[list[float]] = []
        was_training = model.training
        model.eval()  # sample from the policy itself, without dropout
        try:
            generated = generate_batch(
                model,
                prompts,
                cache,
                max_new_tokens=max_new_tokens,
                eos_token_id=eot,
                pad_token_id=pad,
                temperature=temperature,
                logprobs=logprobs,
                sampling_logprobs=True,
            )
        finally:
            model.train(was_training)
        return generated, logprobs

    return replies


def vllm_replies(trainer: Any, eot: int) -> ReplyGenerator:
    """Replies from the trainer's vLLM engine (``training.grpo.vllm: colocate``), which TRL
    has synced with the current weights before calling the rollout.

    Only colocated vLLM on one GPU per process: each process then generates its own
    episodes, however many replies they take. With a vLLM server or tensor parallelism
    every process must call vLLM together the same number of times, which episodes of
    different lengths do not."""
    generation = trainer.vllm_generation
    if generation.mode != "colocate" or getattr(generation, "tensor_parallel_size", 1) != 1:
        raise ValueError(
            "multi-turn GRPO generates with vLLM only colocated and without tensor parallelism "
            f"(got mode {generation.mode!r}); set training.grpo.vllm: colocate, or "
            "training.grpo.rollout: tool_loop for single-turn tasks on a vLLM server"
        )

    def replies(prompts: list[list[int]], max_new_tokens: int) -> Any:
        # The engine's settings are the round's (max_completion_length caps the whole
        # episode); one reply stops at the end-of-turn token and the reply cap.
        saved = generation.max_completion_length, generation.generation_kwargs
        generation.max_completion_length = max_new_tokens
        generation.generation_kwargs = {**saved[1], "stop_token_ids": [eot]}
        try:
            _, generated, logprobs, _ = generation.generate(
                prompts=prompts, images=None, num_generations=1
            )
        finally:
            generation.max_completion_length, generation.generation_kwargs = saved
        # vLLM gives the sampled token's log-prob first in each position's list.
        sampled = [
            [float(p[0]) if p and p[0] is not None else 0.0 for p in row]
            for row in (logprobs or [[] for _ in generated])
        ]
        return [list(ids) for ids in generated], sampled

    return replies


class GeneratedIdsPolicy:
    """A ``Policy`` for the rollout engine that continues each episode on the ids it generated.

    The engine hands over each live episode's last prompt and reply (``previous_ids``);
    the next prompt is those ids, plus the masked end-of-turn token a cut reply lacks,
    plus the rendered delta of what the environment said since (module docstring). A
    reply is decoded only to be parsed. An episode whose completion (every id after the
    opening) would leave no room for a reply ends with the token budget spent.
    """

    continues_ids = True
    version = "grpo"

    def __init__(
        self,
        replies: ReplyGenerator,
        tokenizer: Any,
        *,
        tools_in_prompt: bool,
        max_completion_tokens: int,
        max_reply_tokens: int,
        read_json_calls: bool = False,
    ) -> None:
        self.replies = replies
        self.read_json_calls = read_json_calls
        self.tokenizer = tokenizer
        self.tools_in_prompt = tools_in_prompt
        self.max_completion_tokens = max_completion_tokens
        self.max_reply_tokens = max_reply_tokens
        self.eot = end_of_turn_id(tokenizer)
        self.eot_text = tokenizer.convert_ids_to_tokens(self.eot)
        self.drop = reply_drop_ids(tokenizer)

    async def generate(
        self,
        conversations: Sequence[Sequence[Message]],
        tools: Sequence[Sequence[dict[str, Any]]],
        temperature: float | None = None,
        *,
        previous_ids: Sequence[list[int]] | None = None,
    ) -> list[AssistantMessage]:
        if previous_ids is None:
            raise TypeError(
                "GeneratedIdsPolicy plays in the rollout engine, which gives previous_ids"
            )
        out: list[AssistantMessage | None] = [None] * len(conversations)
        prompts: dict[int, tuple[list[int], int]] = {}  # index: (prompt, completion budget)
        for index, (messages, previous) in enumerate(zip(conversations, previous_ids, strict=True)):
            prompt, opening = self._prompt(messages, tools[index], previous)
            budget = self.max_completion_tokens - (len(prompt) - opening)
            if previous and budget <= 0:
                # Room for the delta and at least one generated token, or the episode ends.
                out[index] = AssistantMessage(error="token budget spent")
            else:
                prompts[index] = prompt, budget
        if prompts:
            cap = min(max(budget for _, budget in prompts.values()), self.max_reply_tokens)
            generated, logprobs = self.replies([prompt for prompt, _ in prompts.values()], cap)
            for (index, (prompt, budget)), reply, scores in zip(
                prompts.items(), generated, logprobs, strict=True
            ):
                out[index] = self._message(prompt, reply[:budget], scores[:budget], budget)
        return [message for message in out if message is not None]

    def _prompt(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        previous: list[int],
    ) -> tuple[list[int], int]:
        """The next prompt's ids and the length of the episode's opening in them."""
        schemas = list(tools) if self.tools_in_prompt else None
        if not previous:
            prompt = self._encoded_prompt(messages, schemas)
            return prompt, len(prompt)
        last_reply = max(i for i, m in enumerate(messages) if m.get("role") == "assistant")
        delta = rendered_delta(
            self.tokenizer,
            messages[: last_reply + 1],
            messages[last_reply + 1 :],
            schemas,
            self.eot_text,
        )
        if previous[-1] != self.eot:
            # Cut at the reply cap: the template closes the message with the end-of-turn
            # token, which the model did not write (so it is masked).
            delta = [self.eot, *delta]
        first_user = next(i for i, m in enumerate(messages) if m.get("role") == "user")
        opening = self._encoded_prompt(messages[: first_user + 1], schemas)
        return [*previous, *delta], len(opening)

    def _encoded_prompt(self, messages: Sequence[Message], schemas: Any) -> list[int]:
        rendered = render_conversation(
            self.tokenizer, messages, schemas, add_generation_prompt=True
        )
        return encode(self.tokenizer, rendered)

    def _message(
        self, prompt: list[int], reply: list[int], logprobs: list[float], budget: int
    ) -> AssistantMessage:
        if not (reply and reply[-1] == self.eot) and len(reply) >= budget:
            message = AssistantMessage(error="token budget spent inside a reply")
        else:
            text = self.tokenizer.decode(
                [t for t in reply if t not in self.drop], skip_special_tokens=False
            )
            parsed = parse_assistant_text(text, read_json_calls=self.read_json_calls)
            message = AssistantMessage(
                content=parsed.content,
                tool_calls=parsed.tool_calls,
                invalid_tool_calls=parsed.invalid_tool_calls,
                raw=text,
                call_form=parsed.form,
            )
        message.prompt_token_ids = prompt
        message.completion_token_ids = list(reply)
        message.completion_logprobs = list(logprobs)
        return message

    async def aclose(self) -> None:
        return None
