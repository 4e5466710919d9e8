"""SQL building blocks for Infinity panels over the store (DuckDB, through ``/api/v1/sql``).

Every time-bounded statement starts with ``RANGE``: the dashboard's range from the first two
parameters (epoch ms) and a bucket width of about 200 points per range, at least 10 s, so a
panel's cost does not grow with the range it shows.
"""

from __future__ import annotations

from aiops import semconv

__all__ = ["INGRESS_SPANS", "MODEL", "RANGE", "VERSION", "bucket", "epoch_ms", "in_range"]

RANGE = """WITH r AS (
  SELECT epoch_ms(f) AS t0, epoch_ms(t) AS t1, greatest(10, (t - f) // 200000) AS step_s
  FROM (SELECT ?::BIGINT AS f, ?::BIGINT AS t))"""

# Every signal table's typed column, as aiops.semconv defines it; on ingress spans the version
# is the one a request was routed to.
MODEL = semconv.MODEL
VERSION = semconv.ROUTED_VERSION_SQL
# The user's view of a request: the ingress SERVER span (what the SLO detector reads too).
INGRESS_SPANS = f"{semconv.INGRESS_SQL} AND kind = 'server'"


def bucket(column: str) -> str:
    """The start of ``column``'s bucket, as epoch milliseconds (Infinity: timestamp_epoch)."""
    return f"epoch_ms(time_bucket(to_seconds(r.step_s), {column}::TIMESTAMP))"


def in_range(column: str) -> str:
    return f"{column} >= r.t0 AND {column} < r.t1"


def epoch_ms(column: str) -> str:
    # DuckDB's epoch_ms has no TIMESTAMP_NS overload: the cast keeps microseconds.
    return f"epoch_ms({column}::TIMESTAMP)"
