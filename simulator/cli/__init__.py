"""The `simulate` command line: `main` holds the lazily loaded group, one module per verb. The top
layer: it may import anything; nothing imports it but `calibration`'s verbs (their shared options).
"""
