"""Simulated against measured: measured serving results read as points, rerun as their benchmark
client ran them, and the errors. May import the run, metrics and deploy layers and `workloads`.
"""
