"""Rows know who wrote them: each telemetry row carries the name of the credential that
exported it (``ingest_credential``), and a credential bound to services (``aiops token add
--service``; the eBPF collector's is bound to its own) writes rows only as those."""

from __future__ import annotations

import itertools
from collections.abc import MutableMapping

import pyarrow as pa
import pyarrow.compute as pc

from aiops.auth import Principal

__all__ = ["COLUMN", "stamp"]

COLUMN = "ingest_credential"


def stamp(tables: MutableMapping[str, pa.Table], principal: Principal | None
          ) -> tuple[int, str]:
    """Bind every table's rows to ``principal`` in place; (rows left out, why)."""
    name = principal.name if principal is not None else "anonymous"
    left_out, denied = 0, set[str]()
    for key, t in list(tables.items()):
        if principal is not None and principal.services and "service_name" in t.column_names:
            services = t.column("service_name")
            allowed = [s for s in pc.unique(services).to_pylist() if principal.may_write_as(s)]
            keep = pc.fill_null(pc.is_in(services, pa.array(allowed, pa.string())), False)
            kept = t.filter(keep)
            if kept.num_rows < t.num_rows:
                left_out += t.num_rows - kept.num_rows
                denied.update(str(s) for s in pc.unique(services.filter(pc.invert(keep)))
                              .to_pylist()[:5])
            t = kept
        if COLUMN not in t.column_names:
            t = t.append_column(COLUMN, pa.array(itertools.repeat(name, t.num_rows),
                                                 pa.string(), size=t.num_rows))
        tables[key] = t
    why = (f"credential {name!r} may write only as {', '.join(principal.services)}, not "
           f"{', '.join(sorted(denied))} ({left_out} left out)") if left_out and principal \
        else ""
    return left_out, why
