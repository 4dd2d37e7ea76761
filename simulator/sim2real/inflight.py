"""Measured points whose servers decoded fewer requests at once than their rerun: Little's law.

In a closed loop of `c` clients, each sending its next request as its last one ends, a request
spends its TTFT and then `osl - 1` TPOTs in the system, so the mean number decoding at once is

    c (osl - 1) t / (TTFT + (osl - 1) t)

(Little's law on the decode phase: exact in the means, whatever queue the TTFT holds). Computed
from the measured and from the simulated means of the same point, it says how many requests each
server ran at once. A measured server decoding far fewer than its rerun ran with less room than
the rerun gives it: a smaller KV cache, a lower `--max-num-seqs`, a client or proxy that capped its
connections. Its TTFT then holds a queue for whole requests and its TPOT is a smaller batch's; the
rerun, which serves every client at once, cannot match either until it is given that room.
"""

from __future__ import annotations

import polars as pl

SHARE = 0.5
"""Points reported: those whose measured server decoded under this share of the requests its rerun
decoded at once (a reporting line, not a model term)."""


def decoding_at_once(concurrency: pl.Expr, output_len: pl.Expr, ttft: pl.Expr, tpot: pl.Expr) -> pl.Expr:
    """The mean number of requests decoding at once in a closed loop (module docstring); times in
    seconds, `output_len` tokens per request."""
    decode = (output_len - 1) * tpot
    return concurrency * decode / (ttft + decode)


def fewer_at_once(rows: pl.DataFrame, share: float = SHARE) -> tuple[pl.DataFrame, int]:
    """The closed-loop points of `simulate compare`'s rows (`measured` and `simulated` mean TTFT and
    TPOT per point, `concurrency`, `output_len`, and no `rate` where the rows carry one) whose
    measured server decoded under `share` of the requests its rerun did at once, fewest first
    (`point`, `gpu`, `concurrency`, `measured`, `simulated`: requests decoding at once), and how
    many points could be checked."""
    needed = {"point", "gpu", "concurrency", "output_len", "statistic", "measured", "simulated"}
    if not needed <= set(rows.columns):
        return pl.DataFrame(), 0
    closed_loop = pl.col("concurrency").is_not_null()
    if "rate" in rows.columns:  # a capped open loop (a rate and a concurrency) holds fewer than its cap
        closed_loop &= pl.col("rate").is_null()
    closed = rows.filter(closed_loop & (pl.col("output_len") >= 2)
                         & pl.col("statistic").is_in(["ttft_mean", "tpot_mean"]))
    if closed.is_empty():
        return pl.DataFrame(), 0
    wide = closed.pivot(on="statistic", index=["point", "gpu", "concurrency", "output_len"],
                        values=["measured", "simulated"], aggregate_function="first")
    if not {"measured_ttft_mean", "measured_tpot_mean"} <= set(wide.columns):
        return pl.DataFrame(), 0
    at_once = {kind: decoding_at_once(pl.col("concurrency"), pl.col("output_len"), pl.col(f"{kind}_ttft_mean"),
                                      pl.col(f"{kind}_tpot_mean")) for kind in ("measured", "simulated")}
    checked = (wide.select("point", "gpu", "concurrency", **at_once)
               .filter(pl.col("measured").is_finite() & pl.col("simulated").is_finite() & (pl.col("simulated") > 0)))
    fewer = checked.filter(pl.col("measured") < share * pl.col("simulated"))
    return fewer.sort(pl.col("measured") / pl.col("simulated")), checked.height
