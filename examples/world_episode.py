"""Drive one built-in-world episode by hand through the Environment protocol.

    .venv/bin/python examples/world_episode.py

This is the loop a policy runs: read the query, call tools, answer, get scored.
"""

from coevolve.envs.parsing import render_call
from coevolve.envs.world import WorldEnvironment, load_split

task = next(t for t in load_split("heldout") if t.family == "buy_with_topup")
env = WorldEnvironment()
print("user:", env.reset(task))
print("tools:", ", ".join(schema["function"]["name"] for schema in env.tools()))

# A model would produce text like this; the shared parser reads it, never eval.
for text in [
    f"search_products(query={task.reference_calls[0].arguments['query']!r})",
    "fly_to_moon()",
]:
    observation = env.step(text)
    print(f"call: {text}\n  -> {observation.text}  (error={observation.error})")

# Finish with the reference solution (it includes the failing checkout and the top-up).
for call in task.reference_calls[1:]:
    observation = env.step(call)
    print(f"call: {render_call(call)}\n  -> {observation.text}  (error={observation.error})")
env.end_turn("Done: ordered it after topping up the wallet.")
print("verifier score:", env.score())
