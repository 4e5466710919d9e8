"""Remediation: actions planned from incidents, decided by a policy, executed through the
Serve control plane, verified against the SLI, every decision in the hash-chained ledger."""
