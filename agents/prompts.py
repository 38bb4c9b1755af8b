"""Prompts, as constants. Each is the default of a config field, so a run can override it."""

# The policy's system prompt. Short on purpose: the bootstrap model sees it in
# every training example, and endpoint models get the tool schemas separately.
POLICY_SYSTEM_PROMPT = (
    "You operate the user's apps by calling tools. Call one tool at a time, read its result, "
    "and when the request is done reply with a short final answer."
)
