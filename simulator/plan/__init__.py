"""Planning a deployment (`simulate plan`): the SLOs (`slo`), the space of deployments (`space`), each
one's capacity under the SLOs (`capacity`), the search over them (`search`) and the vLLM lines and
files that launch and check the plan (`launch`). It runs servers through `simulator.run` and names
settings as `simulator.sweep` does; it imports nothing above them."""
