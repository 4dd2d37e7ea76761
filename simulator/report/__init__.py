"""What `simulate report` and `batch-table --plot` draw: self-contained HTML pages of plotly figures for
a run folder, a sweep file, a `compare` file or the batch table; the shared HTML helpers live in
`report.html`. May import the layers it draws (metrics, sweep, sim2real, cost's batch table), never
the command line (the verbs are in `simulator.cli`).
"""
