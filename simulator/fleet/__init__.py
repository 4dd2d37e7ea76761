"""Several servers on one clock: pools of servers behind routers, and the KV link between a prefill
pool and a decode pool. May import `simulator.engine`, `simulator.cost`, `simulator.deploy` and
`workloads`; nothing that builds a run from settings.
"""
