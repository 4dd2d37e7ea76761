"""Building one run from a `RunConfig` and driving the engine: the workload, the servers' sizes,
the clients (open loop, closed loop, sessions), a fleet's pools, and the run's result. May import
everything below it: `policies`, `workloads`, the engine, the fleet, deploy, cost and the config.
"""
