"""Reference episodes in GRPO groups whose episodes all failed (``grpo.reference_episodes``).

A group whose G episodes all fail has no reward spread: every advantage is 0 and
the task teaches nothing, however often it is drawn. Small models that see
mostly such groups collapse. ToolExpander's answer, taken here: put the task's
reference solution in place of one of the group's episodes. The group then has
one success among failures, the reference's replies get a positive advantage and
the failed episodes a negative one, and the step has gradient where the agent
had none.

The reference episode is played through the same episode player as the
model's (``MultiTurnRollout.play``), with replies scripted instead of sampled:
each reply is the ids the model would have generated for the demonstration's
assistant message (the chat template's rendering of it, up to and including
its end-of-turn token), so it is parsed, acted on and verified exactly like a
generated one. A reference that does not verify, or a task without one, leaves
its group as it was.

The demonstration is the task's reference solution replayed in a fresh
environment (``agents.policy.conversation.reference_conversation``), opened with the
group's own opening (system prompt and first query), so its ids continue the
prompt the group's episodes share. Its replies carry no sampling
log-probabilities, so this works with the trainer's own generation, where TRL
computes the old log-probabilities itself, and not with vLLM's (the config
refuses that combination).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ...agents.policy.conversation import reference_conversation
from ...agents.policy.policy_interface import Message
from ...agents.policy.rendering import encode, end_of_turn_id, render_conversation
from ...envs.base import TASK_ERRORS, Environment
from ...records import Task, is_success
from .generated_replies import ReplyGenerator, TemplateNotPrefixPreserving
from .multiturn_rollout import MultiTurnEpisode, MultiTurnRollout

logger = logging.getLogger(__name__)


def reference_reply_ids(
    tokenizer: Any, conversation: Sequence[Message], tools: Sequence[dict[str, Any]] | None
) -> list[list[int]]:
    """The ids of each assistant message of ``conversation``, as the model would generate
    them after what precedes it: the template's rendering of the message, cut after its
    end-of-turn token (what generation stops at)."""
    eot_text = tokenizer.convert_ids_to_tokens(end_of_turn_id(tokenizer))
    replies = []
    for index, message in enumerate(conversation):
        if message.get("role") != "assistant":
            continue
        before = render_conversation(
            tokenizer, conversation[:index], tools, add_generation_prompt=True
        )
        after = render_conversation(tokenizer, conversation[: index + 1], tools)
        if not after.startswith(before):
            raise TemplateNotPrefixPreserving(
                "the chat template renders the conversation differently once a reply "
                "follows, so a reference reply has no ids of its own; use a "
                "prefix-preserving template or set training.grpo.reference_episodes: false"
            )
        reply = after[len(before) :]
        cut = reply.find(eot_text)
        replies.append(encode(tokenizer, reply[: cut + len(eot_text)] if cut >= 0 else reply))
    return replies


def scripted_replies(replies: Sequence[list[int]], eot: int) -> ReplyGenerator:
    """A reply generator for one episode that answers with ``replies`` in order (each cut
    at the round's reply cap), then with an empty reply once they run out."""
    queue = iter(replies)

    def reply(prompts: list[list[int]], max_new_tokens: int) -> Any:
        if len(prompts) != 1:
            raise ValueError(f"a scripted episode plays alone, got {len(prompts)} prompts")
        ids = next(queue, [eot])[:max_new_tokens]
        return [ids], [[]]

    return reply


class ReferenceEpisodes:
    """Plays reference episodes and puts them in all-fail groups (module docstring).

    Reply ids are kept per task id (they do not change with the weights); the
    episode itself is played again each time, in a fresh environment.
    """

    def __init__(self, make_env: Callable[[], Environment]) -> None:
        self.make_env = make_env
        self._replies: dict[str, list[list[int]] | None] = {}

    def substitute(
        self,
        rollout: MultiTurnRollout,
        episodes: list[MultiTurnEpisode],
        tokenizer: Any,
        openings: Sequence[Sequence[Message]],
        group_size: int,
    ) -> tuple[list[MultiTurnEpisode], int, int]:
        """``episodes`` with the last episode of every all-fail group replaced by its task's
        verified reference episode; with the count of all-fail groups and of those replaced.

        Groups are ``group_size`` consecutive episodes of one task, as TRL lays out a
        generation round; a slice that mixes tasks is left alone.
        """
        episodes = list(episodes)
        all_failed = replaced = 0
        for start in range(0, len(episodes) - group_size + 1, group_size):
            group = episodes[start : start + group_size]
            task = group[0].task
            if any(e.task.id != task.id for e in group):
                continue
            if any(is_success(e.score or 0.0) for e in group):
                continue
            all_failed += 1
            reference = self._play(rollout, tokenizer, task, openings[start + group_size - 1])
            if reference is not None:
                episodes[start + group_size - 1] = reference
                replaced += 1
        return episodes, all_failed, replaced

    def _play(
        self,
        rollout: MultiTurnRollout,
        tokenizer: Any,
        task: Task,
        opening: Sequence[Message],
    ) -> MultiTurnEpisode | None:
        """The task's reference episode if it verifies; its reply ids are computed once."""
        if task.id not in self._replies:
            self._replies[task.id] = None
            env = self.make_env()
            try:
                messages, score = reference_conversation(env, task, None)
            except TASK_ERRORS as err:  # one broken reference must not end the step
                logger.warning("reference of %s: %s: %s", task.id, type(err).__name__, err)
                return None
            if not is_success(score):
                return None
            # The group's own opening, then the demonstration after its first query.
            conversation = [*opening, *messages[1:]]
            # The replay reset the environment to the task: its tools are the task's.
            tools = env.tools() if rollout.tools_in_prompt else None
            self._replies[task.id] = reference_reply_ids(tokenizer, conversation, tools)
        replies = self._replies[task.id]
        if not replies:
            return None
        scripted = scripted_replies(replies, end_of_turn_id(tokenizer))
        (episode,) = rollout.play(scripted, tokenizer, [task], [opening])
        if not is_success(episode.score or 0.0):
            logger.info(
                "reference episode of %s scored %.2f in the training interface; group left as is",
                task.id,
                episode.score or 0.0,
            )
            return None
        return episode
