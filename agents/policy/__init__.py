"""The policy side: the policy interface (``policy_interface.py``), the endpoint and
in-process policies, rendering and KV reuse, the one episode loop (``rollout.py``), the
oracle and the evaluation report. It imports nothing of the synthesis roles."""
