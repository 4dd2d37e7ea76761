"""Sweeps: the cartesian product of run settings, one Parquet row per configuration, run in this
process, in local processes or on Ray. May import the run, metrics and outputs layers.
"""
