"""The engine: one GPU server as a SimPy process, and what it is made of.

Owns the clock, a request's state, the contract between the engine and a policy (`step`), the
waiting queue and preemption order, paged KV memory with its prefix cache, the decoders, the
running set (the requests a server runs and every change to them), the server's process, the
decode stretch's pricing, and the step log. It may import `simulator.cost` (a step's
price), `simulator.errors` and the standard libraries, nothing above.
"""
