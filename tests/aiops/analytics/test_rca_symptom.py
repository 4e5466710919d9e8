"""Ranking from the symptom: the walk from the entity whose users saw the fault, through
callees whose own evidence of that kind moved, to where it ends."""

from __future__ import annotations

from aiops.analytics.rca import Evidence, EvidenceKind, FaultClass, RankConfig, RootCause, Symptom
from aiops.analytics.rca.symptom import symptom_order

CFG = RankConfig()
LAT, ERR = FaultClass.LATENCY, FaultClass.ERRORS


def _ev(entity: str, score: float, kind: FaultClass = LAT) -> Evidence:
    return Evidence(EvidenceKind.METRIC, f"{kind}_avg", entity, kind, f"metric:{kind}", 1.0,
                    0.0, score)


def _order(evidence: list[Evidence], edges: set[tuple[str, str]], symptom: Symptom
           ) -> list[str]:
    # The evidence's own order: the loudest first.
    best: dict[str, float] = {}
    for e in evidence:
        best[e.entity] = max(best.get(e.entity, 0.0), e.score)
    ranked = [RootCause(n, LAT, 0.0, s) for n, s in sorted(best.items(), key=lambda x: -x[1])]
    return [c.entity for c in symptom_order(ranked, symptom, edges, evidence, CFG)]


EDGES = {("site", "search"), ("search", "db"), ("site", "pay"), ("pay", "queue")}


def test_a_caller_that_only_suffers_ranks_below_the_callee_where_the_walk_ends() -> None:
    edges = EDGES | {("pay", "mail")}
    evidence = [_ev("site", 90), _ev("search", 60), _ev("db", 8), _ev("queue", 40)]
    # Loudest first: site, search, queue, db. From the site, slow callees lead to the db,
    # and the queue is reached through pay, a service whose own latency did not move: off
    # the walk.
    assert _order(evidence, edges, Symptom("site", LAT)) == ["db", "search", "site", "queue"]


def test_the_walk_looks_through_a_pass_through_node() -> None:
    # pay has one caller and one callee (the role of a load balancer or a gateway): it relays
    # the call, so a slow queue behind it is reached though pay's own figures did not move.
    evidence = [_ev("site", 90), _ev("search", 60), _ev("db", 8), _ev("queue", 40)]
    order = _order(evidence, EDGES, Symptom("site", LAT))
    # Both ends are two calls deep; the db first, as its caller moved too.
    assert order[:2] == ["db", "queue"]


def test_among_ends_as_deep_the_one_more_of_the_anomaly_converges_on_leads() -> None:
    # A load balancer seen only from the site (a leaf with one caller) and the search service
    # behind it, which its own client also sees failing: the lb's errors are louder, but the
    # search is where more of the anomaly converges.
    edges = {("site", "lb"), ("site", "search"), ("client", "search")}
    evidence = [_ev("site", 20, ERR), _ev("lb", 300, ERR), _ev("search", 200, ERR),
                _ev("client", 15, ERR)]
    assert _order(evidence, edges, Symptom("site", ERR))[:2] == ["search", "lb"]


def test_the_walk_follows_the_symptoms_kind_only() -> None:
    evidence = [_ev("site", 20, ERR), _ev("search", 50, ERR), _ev("db", 80, LAT)]
    # The site's users saw errors: the db's latency does not explain them.
    assert _order(evidence, EDGES, Symptom("site", ERR))[0] == "search"
    assert _order(evidence, EDGES, Symptom("site", LAT))[0] == "db"


def test_deeper_ends_lead_then_stronger_ones() -> None:
    edges = EDGES | {("site", "lb")}
    evidence = [_ev("site", 10), _ev("lb", 100), _ev("search", 30), _ev("db", 12)]
    assert _order(evidence, edges, Symptom("site"))[:2] == ["db", "lb"]


def test_a_symptom_that_reaches_nothing_anomalous_changes_nothing() -> None:
    evidence = [_ev("queue", 40), _ev("db", 30)]
    assert _order(evidence, EDGES, Symptom("site")) == ["queue", "db"]
    assert _order(evidence, set(), Symptom("elsewhere")) == ["queue", "db"]


def test_a_cause_on_a_callee_carries_the_walk_of_either_kind() -> None:
    evidence = [_ev("site", 50, ERR), _ev("search", 40, ERR), _ev("db", 9, FaultClass.MEMORY)]
    # A failing search whose database ran out of memory: the database is where it ends.
    assert _order(evidence, EDGES, Symptom("site", ERR))[0] == "db"


def test_with_no_alarm_the_kind_is_what_the_symptoms_own_evidence_shows() -> None:
    evidence = [_ev("site", 20, ERR), _ev("site", 2, LAT), _ev("search", 50, ERR),
                _ev("pay", 90, LAT)]
    # The site's users saw errors (its latency did not move past the threshold): the walk
    # follows failing callees, not the louder slow one.
    assert _order(evidence, EDGES | {("site", "pay")}, Symptom("site"))[0] == "search"


def test_a_symptom_that_shows_only_causes_changes_nothing() -> None:
    # Metrics-only corpora (RCD's Sock Shop): the entry's memory and CPU moved, its latency
    # and errors were not measured; there is no symptom to walk from.
    evidence = [_ev("site", 8, FaultClass.MEMORY), _ev("search", 400, FaultClass.CPU),
                _ev("db", 10, FaultClass.MEMORY)]
    assert _order(evidence, EDGES, Symptom("site")) == ["search", "db", "site"]


# -- roles in a declared graph, without a symptom (combine_evidence(roles=True)) ----------------


def _combined(evidence: list[Evidence], edges: set[tuple[str, str]], roles: bool) -> list[str]:
    from aiops.analytics.rca.combine import combine_evidence

    return [c.entity for c in combine_evidence(evidence, edges, CFG, roles=roles)]


def test_a_relay_ranks_just_below_the_node_it_relays_to() -> None:
    # api -> trigger -> function: the trigger (one caller, one callee) reports the function's
    # slowness louder than the function itself.
    edges = {("api", "trigger"), ("trigger", "function")}
    evidence = [_ev("trigger", 60), _ev("function", 40), _ev("api", 5)]
    assert _combined(evidence, edges, roles=False)[0] == "trigger"
    assert _combined(evidence, edges, roles=True)[:2] == ["function", "trigger"]


def test_a_node_whose_own_resources_moved_is_working_not_relaying() -> None:
    # front -> catalogue -> catalogue-db: the catalogue has one caller and one callee, but its
    # CPU moved; the database's memory drift does not take its place (RCD's Sock Shop).
    edges = {("front", "catalogue"), ("catalogue", "catalogue-db")}
    evidence = [_ev("catalogue", 80, FaultClass.CPU), _ev("catalogue", 20),
                _ev("catalogue-db", 6, FaultClass.MEMORY)]
    assert _combined(evidence, edges, roles=True)[0] == "catalogue"


def test_past_the_cap_the_node_more_of_the_anomaly_converges_on_leads() -> None:
    # Both failing past the cap: the lb's node (seen from the site only) and the search
    # service (its own client fails too).
    edges = {("site", "lb"), ("site", "search"), ("client", "search")}
    evidence = [_ev("lb", 5000, ERR), _ev("search", 3000, ERR), _ev("client", 400, ERR),
                _ev("site", 10, ERR)]
    assert _combined(evidence, edges, roles=False)[0] == "lb"
    assert _combined(evidence, edges, roles=True)[0] == "search"
    # Below the cap the evidence still decides.
    weaker = [_ev("lb", 60, ERR), _ev("search", 30, ERR), _ev("client", 20, ERR)]
    assert _combined(weaker, edges, roles=True)[0] == "lb"
