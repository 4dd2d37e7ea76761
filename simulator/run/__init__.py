"""Building one run from a `RunConfig` and driving the engine: the workload, the servers' sizes,
a fleet's pools, the clients (open loop, closed loop, sessions, a benchmark's), the one driver every
run goes through, and the run's result. May import everything below it: `policies`, `workloads`,
the engine, the fleet, deploy, cost and the config.
"""
