"""What is deployed: model specs (from config.json), GPU profiles, and what fits in a GPU's memory.
May import only `simulator.errors`.
"""
