"""Batched generation that keeps each conversation's KV cache between its steps.

A rollout asks the policy for the next message of every live episode, then
appends tool results and asks again. Re-encoding the whole conversation each
time makes prefill grow with the square of the episode's length; on a CPU it
dominated evaluation. Here every conversation's keys and values are kept after
its turn (``PrefixCache``), found again by token prefix at the next call, and
only the new tokens (the reply as the chat template renders it, the tool
results, the next generation prompt) are encoded.

Rows of one batch have different cached lengths and different new lengths, so
the batch is laid out as ``[pad | cached | pad | new]`` per row: an attention
mask with holes and explicit position ids keep every row's attention and
rotary positions exactly what they would be without padding. A reply whose
re-rendering differs from the generated tokens (the template re-serialises a
tool call) reuses the cache up to the first differing token. A prompt that
several rows of one call share (K rollouts of a task, a GRPO group) is encoded
once, and every row starts from its keys and values.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from typing import Any

from .prefix_cache import Entry, PrefixCache


def return_freed_memory() -> None:
    """Hand the memory that freed keys and values leave behind back to the system.

    glibc's malloc keeps freed blocks in its arenas for reuse: after a rollout released
    every conversation's cache, the process stayed gigabytes above what it held (2.5
    GiB resident after 48 SmolLM2 episodes, 0.6 before them), and the next stage's
    peak sat on top of that. ``malloc_trim`` returns the free pages; elsewhere than
    glibc this does nothing.

    No ``gc.collect()`` first: the keys and values are freed when their last reference
    goes, not by the cycle collector. With it, at every call of a SmolLM2 evaluation and of
    a quick bench's units, the collector found no tensor among what it freed (0 bytes),
    and took 0.2-0.4 s of CPU a call walking the process's 400,000-700,000 objects."""
    import ctypes

    # The symbols already loaded into this process: ctypes.util.find_library would start
    # a process (ldconfig) to find the C library.
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _cache_keyword(model: Any) -> str:
    """The forward keyword that takes the KV cache: transformers renamed
    ``past_key_values`` to ``cache`` (deprecated from 5.2x) and warns on every call
    that uses the old name."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def generate_batch(
    model: Any,
    prompts: Sequence[Sequence[int]],
    cache: PrefixCache,
    *,
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    temperature: float,
    logprobs: list[list[float]] | None = None,
    sampling_logprobs: bool = False,
) -> list[list[int]]:
    """New tokens for every prompt (ending with ``eos_token_id`` unless cut by the limit).

    ``logprobs``, when given (empty), gets one list per prompt: each new token's
    log-probability under the model (before temperature, as a vLLM server reports
    them), or with ``sampling_logprobs`` under the distribution it was drawn from
    (after temperature: the old policy's log-probs that GRPO's ratio divides by).
    """
    import torch

    shared = _shared_uncached(prompts, cache)
    if shared:
        # Encode each shared prompt once, up to its last token, and store it: every row
        # then finds it in the cache and encodes one token (below).
        generate_batch(
            model,
            [ids[:-1] for ids in shared],
            cache,
            max_new_tokens=1,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            temperature=0.0,
        )
    found = [cache.lookup(ids) for ids in prompts]
    past, output, mask = _prefill(model, cache, prompts, found, pad_token_id, max_new_tokens)
    device = model.device
    generated: list[list[int]] = [[] for _ in prompts]
    rows = list(range(len(prompts)))  # the prompt index of each row still in the batch
    positions_next = torch.tensor([len(ids) for ids in prompts], dtype=torch.long)
    cache_keyword = _cache_keyword(model)
    with torch.inference_mode():
        if logprobs is not None:
            logprobs.extend([] for _ in prompts)
        for step in range(max_new_tokens):
            tokens, chosen = _next_tokens(
                output, temperature, logprobs is not None, sampling=sampling_logprobs
            )
            done = _append_tokens(generated, rows, tokens, chosen, logprobs, eos_token_id)
            if all(done) or step == max_new_tokens - 1:
                break
            finished = sum(done)
            if finished and finished * 4 >= len(rows):
                # Most of the batch is done: store those rows and drop them, so the
                # remaining steps cost only what the live rows need.
                live = _store_finished(cache, past, prompts, generated, rows, done, mask)
                mask = mask[live.to(device)]
                tokens = tokens[live]
                positions_next = positions_next[live]
                rows = [rows[p] for p in live.tolist()]
                done = [False] * len(rows)
            # Rows that are done keep stepping with the batch, masked out of everything.
            step_mask = torch.tensor([0 if d else 1 for d in done], dtype=torch.long)
            mask = torch.cat([mask, step_mask.unsqueeze(1).to(device)], dim=1)
            output = model(
                input_ids=tokens.unsqueeze(1).to(device),
                attention_mask=mask,
                position_ids=positions_next.unsqueeze(1).to(device),
                use_cache=True,
                **{cache_keyword: past},
            )
            positions_next += 1

    real = mask.bool().cpu()
    for position, row in enumerate(rows):
        _keep_row(cache, past, prompts[row], generated[row], position, real)
    return generated


def _store_finished(
    cache: PrefixCache,
    past: Any,
    prompts: Sequence[Sequence[int]],
    generated: list[list[int]],
    rows: list[int],
    done: list[bool],
    mask: Any,
) -> Any:
    """Store the finished rows of the batch in ``cache`` and drop them from ``past``; the
    positions of the rows still generating (to select them from the batch's tensors)."""
    import torch

    real = mask.bool().cpu()
    for position, is_done in enumerate(done):
        if is_done:
            row = rows[position]
            _keep_row(cache, past, prompts[row], generated[row], position, real)
    live = torch.tensor([p for p, d in enumerate(done) if not d], dtype=torch.long)
    past.batch_select_indices(live.to(mask.device))
    return live


def _prefill(
    model: Any,
    cache: PrefixCache,
    prompts: Sequence[Sequence[int]],
    found: list[tuple[Entry | None, int]],
    pad_token_id: int,
    max_new_tokens: int,
) -> tuple[Any, Any, Any]:
    """Encode the batch's prompts past what the cache holds of them (``found``), in a
    ``DynamicCache`` loaded with the cached part and with room for the reply: the cache, the
    model's output (the last position's logits) and the attention mask, on the model's device."""
    import torch
    from transformers import DynamicCache

    input_ids, mask, positions, cached_width = _prefill_inputs(prompts, found, pad_token_id)
    past = DynamicCache(config=model.config)
    _grow_in_place(past)
    if cached_width > 0:
        room = input_ids.shape[1] + max_new_tokens
        _load_cached(past, model, found, cached_width, room=room)
        cache.discard_extended(found, prompts)
    mask = mask.to(model.device)
    with torch.inference_mode():
        output = model(
            input_ids=input_ids.to(model.device),
            attention_mask=mask,
            position_ids=positions.to(model.device),
            use_cache=True,
            **{_cache_keyword(model): past},
            # Only the last position's logits start the reply; the head over every
            # prompt token (49k vocabulary) was a fifth of the prefill's work.
            logits_to_keep=1,
        )
        cache.note_batch(_layers_bytes(past))
    return past, output, mask


def _prefill_inputs(
    prompts: Sequence[Sequence[int]], found: list[tuple[Entry | None, int]], pad_token_id: int
) -> tuple[Any, Any, Any, int]:
    """The prefill's input ids, attention mask and positions for the part of each prompt the
    cache does not hold (``found``: each prompt's entry and cached length), left-padded, and
    the width of the cached part the mask covers first."""
    import torch

    batch = len(prompts)
    reused = [length for _, length in found]
    news = [list(ids[length:]) for ids, (_, length) in zip(prompts, found, strict=True)]
    cached_width = max(reused)
    new_width = max(len(ids) for ids in news)
    width = cached_width + new_width

    input_ids = torch.full((batch, new_width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((batch, width), dtype=torch.long)
    positions = torch.zeros((batch, new_width), dtype=torch.long)
    for row, (length, new) in enumerate(zip(reused, news, strict=True)):
        mask[row, cached_width - length : cached_width] = 1
        input_ids[row, new_width - len(new) :] = torch.tensor(new, dtype=torch.long)
        mask[row, width - len(new) :] = 1
        positions[row, new_width - len(new) :] = torch.arange(length, length + len(new))
    return input_ids, mask, positions, cached_width


def _next_tokens(
    output: Any, temperature: float, with_logprobs: bool, *, sampling: bool
) -> tuple[Any, list[float] | None]:
    """Each row's next token (on the CPU), picked from the output's last logits, and, when
    ``with_logprobs``, its log-probability: under the model, or with ``sampling`` under the
    distribution it was drawn from (after temperature)."""
    import torch

    last = output.logits[:, -1, :]
    tokens = _pick(last, temperature)
    chosen = None
    if with_logprobs:
        scored = last.float() / temperature if sampling and temperature > 0 else last
        chosen = (
            torch.log_softmax(scored.float(), dim=-1)
            .gather(1, tokens.unsqueeze(1))
            .squeeze(1)
            .tolist()
        )
    return tokens.cpu(), chosen


def _append_tokens(
    generated: list[list[int]],
    rows: list[int],
    tokens: Any,
    chosen: list[float] | None,
    logprobs: list[list[float]] | None,
    eos_token_id: int,
) -> list[bool]:
    """Append each live row's new token (and its log-probability) to its prompt's reply;
    whether each row of the batch is done (at ``eos_token_id``, now or earlier)."""
    done = []
    for position, row in enumerate(rows):
        if generated[row] and generated[row][-1] == eos_token_id:
            done.append(True)  # finished earlier, still in the batch
            continue
        generated[row].append(int(tokens[position]))
        if logprobs is not None and chosen is not None:
            logprobs[row].append(chosen[position])
        done.append(generated[row][-1] == eos_token_id)
    return done


def _keep_row(
    cache: PrefixCache,
    past: Any,
    prompt: Sequence[int],
    reply: list[int],
    position: int,
    real: Any,
) -> None:
    """Store the keys and values of the batch's row ``position`` (``real``: the batch's
    attention mask as booleans on the CPU): its prompt and the reply tokens fed back (all
    but the last generated token, which was never fed)."""
    fed = list(prompt) + reply[:-1]
    columns = real[position].nonzero().squeeze(1)[: len(fed)]
    layers: list[Any] = list(past.layers)
    # Indexing by a tensor of columns copies: the entry owns its memory already.
    keys = [layer.keys[position][:, columns] for layer in layers]
    values = [layer.values[position][:, columns] for layer in layers]
    cache.add(fed, keys, values)


def _load_cached(
    past: Any, model: Any, found: Sequence[tuple[Entry | None, int]], cached_width: int, room: int
) -> None:
    """Lay every row's kept keys and values into ``past``, right-aligned at ``cached_width``
    (zeros before them), in buffers with ``room`` more positions for this call's tokens.

    Built in place, the padded batch exists once. Handed to ``DynamicCache`` it was
    copied on the way in, and copied again into buffers with room at the first forward
    pass, while the first copy stayed referenced: two to three times the batch's keys
    and values at the prefill."""
    import torch

    config = model.config
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads
    )
    dtype = next(model.parameters()).dtype
    growing = _growing_layer_class()
    for index, layer in enumerate(past.layers):
        grows = isinstance(layer, growing)
        width = cached_width + (room if grows else 0)
        shape = (len(found), kv_heads, width, head_dim)
        keys = torch.zeros(shape, dtype=dtype, device=model.device)
        values = torch.zeros_like(keys)
        for row, (entry, length) in enumerate(found):
            if entry is not None and length > 0:
                keys[row, :, cached_width - length : cached_width] = entry.keys[index][:, :length]
                values[row, :, cached_width - length : cached_width] = entry.values[index][
                    :, :length
                ]
        if grows:
            cached_keys, cached_values = keys[..., :cached_width, :], values[..., :cached_width, :]
            layer.lazy_initialization(cached_keys, cached_values)
            layer.keys, layer.values = cached_keys, cached_values
            layer.room = (keys, values)
            layer.views = (cached_keys, cached_values)
        else:  # sliding-window or other layers keep their own rules
            layer.update(keys, values)


def _layers_bytes(past: Any) -> int:
    """Bytes of the keys and values ``past`` holds, the room to grow included."""
    total = 0
    for layer in past.layers:
        room = getattr(layer, "room", None)
        tensors = room if room is not None else (layer.keys, layer.values)
        total += sum(t.nbytes for t in tensors if t is not None)
    return total


@functools.cache
def _growing_layer_class() -> type:
    """transformers' ``DynamicLayer`` whose keys and values are views into buffers with
    room to grow. The stock layer appends a decode step with ``torch.cat``, copying the
    whole cache of every layer: 15-19% of a 32-row decode step on the CPU. Here a step
    is written into the room, and the buffers are copied only when it runs out
    (a quarter more each time). An operation that replaces the tensors (dropping
    finished rows: ``batch_select_indices``) is noticed and the next update starts
    new buffers from them."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        # (keys, values) buffers with room, and the views of them this layer last handed out
        room: tuple[Any, Any] | None = None
        views: tuple[Any, Any] | None = None

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            keys, values = self.keys, self.values
            held = keys.shape[-2] if keys is not None and keys.numel() else 0
            needed = held + key_states.shape[-2]
            room = self.room
            if (
                room is None
                or self.views is None
                or keys is not self.views[0]
                or values is not self.views[1]
                or needed > room[0].shape[-2]
            ):
                capacity = needed + max(16, needed // 4)
                shape = (*key_states.shape[:-2], capacity, key_states.shape[-1])
                room = (key_states.new_empty(shape), value_states.new_empty(shape))
                if held:
                    room[0][..., :held, :] = keys
                    room[1][..., :held, :] = values
                self.room = room
            room[0][..., held:needed, :] = key_states
            room[1][..., held:needed, :] = value_states
            self.keys, self.values = room[0][..., :needed, :], room[1][..., :needed, :]
            self.views = (self.keys, self.values)
            return self.keys, self.values

    return GrowingLayer


def _grow_in_place(cache: Any) -> None:
    """Give every full-attention layer of ``cache`` room to grow (``_growing_layer_class``)."""
    from transformers.cache_utils import DynamicLayer

    growing = _growing_layer_class()
    for index, layer in enumerate(cache.layers):
        if type(layer) is not DynamicLayer:
            continue  # sliding-window or other layers keep their own rules
        replacement = growing()
        if layer.is_initialized:
            replacement.lazy_initialization(layer.keys, layer.values)
            replacement.keys, replacement.values = layer.keys, layer.values
        cache.layers[index] = replacement


def _shared_uncached(prompts: Sequence[Sequence[int]], cache: PrefixCache) -> list[list[int]]:
    """Prompts given to several rows (a group's episodes, K rollouts of one task) that the
    cache does not hold yet, once each. Encoded row by row, a group of 8 on one
    700-token prompt prefilled 5,600 tokens for 700 tokens' worth of keys and values."""
    counts = Counter(tuple(ids) for ids in prompts)
    return [
        list(ids)
        for ids, count in counts.items()
        if count > 1 and len(ids) > 2 and cache.cached_length(ids) < len(ids) - 2
    ]


def _pick(logits: Any, temperature: float) -> Any:
    """A token a row: the most likely at temperature 0, else one drawn from the softmax.

    Drawn by inverting the cumulative distribution: one uniform number a row.
    ``torch.multinomial`` draws an exponential variate for every vocabulary entry
    (49k a row), which was 13% of a 32-row decode step on the CPU. A token of zero
    probability is never drawn (the first entry whose running total exceeds the
    draw is taken, and a zero adds nothing to the total)."""
    import torch

    if temperature <= 0:
        return logits.argmax(dim=-1)
    probabilities = torch.softmax(logits.float() / temperature, dim=-1)
    cumulative = probabilities.double().cumsum(dim=-1)  # float64: 49k terms stay exact enough
    draws = torch.rand((len(cumulative), 1), dtype=torch.float64, device=cumulative.device)
    chosen = torch.searchsorted(cumulative, draws * cumulative[:, -1:], right=True)
    return chosen.squeeze(1).clamp_(max=cumulative.shape[-1] - 1)
