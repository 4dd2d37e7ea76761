"""Calibration: the verbs that measure a GPU (`calibrate`, with PyTorch), check a profile against the
chapter and vLLM's blog (`validate`) and fit host overhead to measured serving results (`fit`), and
the shipped GPU profiles (`profiles/`). The command-line layer: it may import anything below it."""
