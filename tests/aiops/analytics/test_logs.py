"""Log templates: what the miner makes of messages, and what the template-rate detector reports."""

from __future__ import annotations

import random

import pytest

from aiops.analytics.logs import (
    LogTemplates,
    TemplateAnomaly,
    TemplateRateDetector,
    mine,
    to_loghub,
)

MINUTE = 60 * 10**9


# -- the miner -------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "template"), [
    ("Connection from 10.0.0.7:5050 closed after 1532 ms",
     "Connection from <*>:<*> closed after <*> ms"),
    ("request 0x7f3a9c failed", "request <*> failed"),
    ("trace 4bf92f3577b34da6a3ce929d0e0e4736 sampled", "trace <*> sampled"),
    ("span 550e8400-e29b-41d4-a716-446655440000 ended", "span <*> ended"),
    ("loaded /models/smollm2/model.gguf in 2.5 s", "loaded <*> in <*> s"),
    ("Deleting block blk_-3594701313167635091", "Deleting block <*>"),
    ("kv cache 16K free, 0MB swapped", "kv cache <*> free, <*> swapped"),
    ("driver v1.2.3 loaded", "driver <*> loaded"),
    ("checkpoint written at 2024-05-01T12:00:03.123Z", "checkpoint written at <*>"),
    ("status=M Fri Jul 01 08:16:53 PDT 2005", "status=M <*>"),
    ("device FF:F2:9F:16:E2:23 online", "device <*> online"),
    ("fetched https://cdn.example.org/a/b?x=1 ok", "fetched <*> ok"),
    (r"Loaded C:\Windows\winsxs\core.dll ok", "Loaded <*> ok"),
    ("attempt_1445_0020_m_000002_0 finished", "<*> finished"),
    ("told master about broadcast_4_piece0", "told master about <*>"),
])
def test_values_are_masked_from_the_first_message(body: str, template: str) -> None:
    assert LogTemplates().add(body).template == template


def test_messages_of_one_statement_share_a_template_and_only_the_first_is_new() -> None:
    miner = LogTemplates()
    first = miner.add("Worker 3 started in 120 ms")
    second = miner.add("Worker 14 started in 9 ms")
    other = miner.add("Worker pool drained")
    assert first.is_new and not second.is_new and other.is_new
    assert first.template_id == second.template_id != other.template_id
    assert second.template == "Worker <*> started in <*> ms"


def test_a_variable_keeps_its_key_and_brackets() -> None:
    hosts = ["alpha.example.com", "beta.example.org", "gamma.net", "delta.example.io", "x.y"]
    templates = mine(f"login failed; rhost={h} tty='{h}'" for h in hosts)
    assert set(templates) == {"login failed; rhost=<*> tty='<*>'"}
    # Half the tokens variable: one template at the default threshold, one per host above
    # 0.5 (why the choice of setting prefers the lowest threshold the systems tie on).
    lines = [f"login failed from {h}; rhost={h} tty='{h}'" for h in hosts]
    assert set(mine(lines)) == {"login failed from <*>; rhost=<*> tty='<*>'"}
    assert len(set(mine(lines, LogTemplates(sim_th=0.6)))) == len(hosts)


def test_a_few_recurring_words_are_an_enumeration_not_a_variable() -> None:
    miner = LogTemplates()
    bodies = ["cupsd startup succeeded", "cupsd shutdown succeeded"] * 3
    matches = [miner.add(b) for b in bodies]
    assert {m.template for m in matches} == {"cupsd startup succeeded", "cupsd shutdown succeeded"}
    assert len({m.template_id for m in matches}) == 1  # one Drain cluster, two templates


def test_many_distinct_words_are_a_variable() -> None:
    users = ["alice", "bob", "carol", "dave", "erin", "frank"]
    templates = mine(f"Invalid user {u} from 10.1.1.{i}" for i, u in enumerate(users))
    assert templates == ["Invalid user <*> from <*>"] * len(users)


def test_mine_reports_every_line_against_its_clusters_final_template() -> None:
    bodies = [f"Invalid user {u} from {h}"
              for u, h in [("alice", "h1"), ("bob", "h2"), ("carol", "h3"), ("dave", "h4")]]
    miner = LogTemplates()
    first = miner.add(bodies[0])
    assert first.template == "Invalid user alice from h1"  # nothing to generalise yet
    for b in bodies[1:]:
        miner.add(b)
    assert miner.template_of(first.template_id, bodies[0]) == "Invalid user <*> from <*>"
    assert mine(bodies) == ["Invalid user <*> from <*>"] * 4


def test_templates_lists_clusters_most_frequent_first() -> None:
    miner = LogTemplates()
    for i in range(3):
        miner.add(f"GET /v1/items/{i} 200")
    miner.add("server ready")
    listed = miner.templates()
    assert [(t.template, t.count) for t in listed] == [("GET <*> <*>", 3), ("server ready", 1)]


def test_an_empty_body_is_a_template_too() -> None:
    miner = LogTemplates()
    assert miner.add("").template == ""
    assert not miner.add("   ").is_new


def test_evicted_clusters_are_forgotten_when_clusters_are_capped() -> None:
    miner = LogTemplates(max_clusters=2)
    for word in ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]:
        miner.add(f"{word} {word} {word}")
    kept = [t.template for t in miner.templates()]
    assert len(kept) <= 4 and "foxtrot foxtrot foxtrot" in kept


# Over-splitting, in a made-up format: the kinds of variables a system never seen before may log
# (a word in front, a list of values, values of several shapes) must not split one template.

PROGRAMS = ["chrome.exe", "mailer", "backup-agent", "sync.d", "editor", "vpn-client"]
PROXY = "<*> - relay.example.net:<*> opened through gateway gw.example.net:<*> TLS"


def _proxy_lines() -> list[str]:
    return [f"{p} - relay.example.net:{8000 + i} opened through gateway gw.example.net:3128 TLS"
            for i in range(4) for p in PROGRAMS]


def test_a_variable_word_in_front_is_one_template_not_one_per_value() -> None:
    lines = _proxy_lines()
    # Drain's prefix tree takes the first token for a constant: one cluster per program.
    assert len(set(mine(lines, LogTemplates(join_th=None)))) == len(PROGRAMS)
    # Joining clusters that agree elsewhere gives the one true template back.
    assert set(mine(lines)) == {PROXY}


def test_a_joined_cluster_is_not_new_and_earlier_ids_still_resolve() -> None:
    miner = LogTemplates()
    lines = _proxy_lines()
    matches = [miner.add(line) for line in lines]
    assert sum(m.is_new for m in matches) < len(PROGRAMS)
    assert {miner.template_of(m.template_id, b) for m, b in zip(matches, lines, strict=True)
            } == {PROXY}
    assert [t.template for t in miner.templates()] == [PROXY]


def test_a_short_message_may_always_differ_in_one_word() -> None:
    # Two tokens, one a variable: only half agree, under any threshold above 0.5; a
    # configuration dump must still be one template, not one per key.
    keys = ["java.vendor=Oracle", "user.name=zookeeper", "os.name=Linux", "user.dir=/",
            "java.home=/usr/lib/jvm", "os.arch=amd64"]
    lines = [f"Server environment:{k}" for k in keys]
    assert mine(lines, LogTemplates(sim_th=0.6)) == ["Server environment:<*>"] * len(keys)
    assert len(set(mine([f"Server {k} loaded" for k in keys], LogTemplates(sim_th=0.9)))) == 1
    # A few recurring words are still an enumeration, not a variable.
    states = ["Server started", "Server stopped"] * 4
    assert set(mine(states)) == {"Server started", "Server stopped"}


def test_a_list_of_values_is_one_template_whatever_its_length() -> None:
    lines = [f"scheduling deletion of {' '.join(f'blk_{i * 7 + k}' for k in range(n))}"
             for i, n in enumerate([1, 2, 3, 2, 5, 1, 4, 3])]
    assert len(set(mine(lines))) == 1


def test_values_of_several_shapes_in_one_position_are_a_variable() -> None:
    durations = ["00:01", "01:02:03", "00:07", "10:00:00", "<1", "02:30"]
    lines = [f"session closed, lifetime {d} total" for d in durations]
    assert len(set(mine(lines))) == 1


def test_an_enumeration_can_require_its_words_to_recur() -> None:
    once = ["Invalid user alice", "Invalid user bob", "Invalid user carol"]
    # By default three words make an enumeration even when each is seen once...
    assert len(set(mine(once))) == 3
    # ...with enum_support=2 an enumeration needs two messages per word on average.
    assert set(mine(once, LogTemplates(enum_support=2))) == {"Invalid user <*>"}
    assert len(set(mine(once * 2, LogTemplates(enum_support=2)))) == 3


@pytest.mark.parametrize(("template", "loghub"), [
    ("Deleting block blk_<:NUM:>", "Deleting block <*>"),  # a word glued to a variable
    ("generating core.<:NUM:>", "generating core.<*>"),  # a dot separates
    ("user=root tty=ssh", "user=<*> tty=ssh"),  # default user names and booleans
    ("is true", "is <*>"),
    ("file /var/log/app.log opened", "file <*> opened"),  # paths
    ("took 12 ms", "took <*> ms"),  # bare digits
    ("ip <*>.<*>.<*>.<*> up", "ip <*> up"),  # dot-separated variables
    ("  a   b  ", "a b"),  # whitespace
    ("ratio <:NUM:><:NUM:>", "ratio <*>"),
    ("mapped <*>/<*>", "mapped <*>/<*>"),
])
def test_to_loghub_writes_the_benchmarks_convention(template: str, loghub: str) -> None:
    assert to_loghub(template) == loghub


# -- the detector ----------------------------------------------------------------------------


def _minute_of_logs(rng: random.Random, minute: int, change_at: int) -> list[str]:
    """Steady traffic; from ``change_at`` on, heartbeats stop and an OOM error appears."""
    bodies = [f"GET /v1/items/{rng.randint(1, 9999)} 200 in {rng.randint(2, 90)} ms"
              for _ in range(rng.randint(25, 35))]
    bodies += [f"cache hit ratio {rng.random():.2f} on replica-{rng.randint(0, 3)}"
               for _ in range(rng.randint(8, 12))]
    if minute < change_at:
        bodies += [f"heartbeat from replica {rng.randint(0, 3)} ok" for _ in range(20)]
    else:
        bodies += [f"CUDA out of memory allocating {rng.randint(10, 900)} MiB on device 0"
                   for _ in range(15)]
    rng.shuffle(bodies)
    return bodies


def _replay(minutes: int, change_at: int, detector: TemplateRateDetector
            ) -> list[TemplateAnomaly]:
    rng, miner, found = random.Random(7), LogTemplates(), []
    for minute in range(minutes):
        for i, body in enumerate(_minute_of_logs(rng, minute, change_at)):
            found += detector.observe(minute * MINUTE + i * 1_000_000, miner.add(body))
    return found + detector.flush()


def test_a_change_point_gives_a_new_template_and_a_rate_drop_and_nothing_before() -> None:
    found = _replay(minutes=32, change_at=30, detector=TemplateRateDetector(MINUTE, warmup=10))
    assert all(a.window_start_ns >= 30 * MINUTE for a in found)
    at_change = [a for a in found if a.window_start_ns == 30 * MINUTE]
    new = [a for a in at_change if a.kind == "new_template"]
    assert [(a.template, a.observed) for a in new] == [
        ("CUDA out of memory allocating <*> MiB on device <*>", 15)]
    drops = [a for a in at_change if a.kind == "rate"]
    assert [(a.template, a.observed, a.expected) for a in drops] == [
        ("heartbeat from replica <*> ok", 0, 20.0)]
    assert drops[0].window_end_ns == 31 * MINUTE and drops[0].score > 6


def test_a_burst_of_a_known_template_is_a_rate_anomaly() -> None:
    detector, miner = TemplateRateDetector(MINUTE, warmup=5), LogTemplates()
    found = []
    for minute in range(12):
        n = 60 if minute == 10 else 10
        for i in range(n):
            found += detector.observe(minute * MINUTE + i, miner.add(f"retrying request {i}"))
    assert [(a.kind, a.window_start_ns // MINUTE, a.observed) for a in found] == [
        ("rate", 10, 60)]
    assert found[0].expected == 10.0


def test_templates_first_seen_during_the_warmup_are_not_new() -> None:
    detector, miner = TemplateRateDetector(MINUTE, warmup=3), LogTemplates()
    found = []
    for minute, body in enumerate(["boot", "config loaded", "listening on 8080", "panic: x"]):
        found += detector.observe(minute * MINUTE, miner.add(body))
    found += detector.flush()
    assert [(a.kind, a.template) for a in found] == [("new_template", "panic: x")]


def test_a_silence_is_a_drop_from_its_first_empty_bucket() -> None:
    detector, miner = TemplateRateDetector(MINUTE, history=20, warmup=5), LogTemplates()
    for minute in range(10):
        for _ in range(30):
            assert detector.observe(minute * MINUTE, miner.add("tick")) == []
    found = detector.observe(500 * MINUTE, miner.add("tick"))  # 490 silent minutes
    assert found and all(a.kind == "rate" and a.observed == 0 for a in found)
    assert [a.window_start_ns // MINUTE for a in found] == list(range(10, 10 + len(found)))
    assert found[0].expected == 30.0


def test_the_detector_rejects_a_warmup_longer_than_its_history() -> None:
    with pytest.raises(ValueError, match="warmup"):
        TemplateRateDetector(MINUTE, history=5, warmup=10)
