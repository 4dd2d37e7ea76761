"""What a run writes: its folder (Parquet tables, summary JSON, settings), vLLM's result JSON, and
the locks that keep two writers apart. May import `simulator.metrics`, the config and progress.
"""
