"""A run's tables (requests, tokens, steps) and its summary metrics, a fleet's per-server columns,
and the token trace. May import `simulator.run` (a run's result), the engine's step log and the fleet.
"""
