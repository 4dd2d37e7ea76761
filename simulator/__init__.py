"""servesim's engine: requests, the SimPy loop, KV memory, cost model, metrics, outputs, CLI."""
