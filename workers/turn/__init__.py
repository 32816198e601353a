"""One fleet turn, from the message's receipt to its commit: what the Celery task calls.

- :mod:`~workers.turn.executor`: :class:`TurnExecutor`, a turn start to commit (the flow and
  its guarantees are in that module's docstring);
- :mod:`~workers.turn.claims`: the claim taken when a turn message is received;
- :mod:`~workers.turn.kit`: what a turn runs with (agent, declared tools, the fleet's model);
- :mod:`~workers.turn.endings`: the lines every turn logs and the endings without a commit
  (failure by kind, deferral behind a provider breaker, refusal by the spend guard);
- :mod:`~workers.turn.report`: :class:`TurnReport` and :class:`TurnFailed`.
"""

from workers.turn.executor import TurnExecutor
from workers.turn.report import TurnFailed, TurnReport

__all__ = ["TurnExecutor", "TurnFailed", "TurnReport"]
