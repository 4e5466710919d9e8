"""The connection gate counts every listener's connections together: in all and per source
address; a full server makes room by closing an idle connection on any listener that has one;
a ticket gives its place back once, whoever releases it first. The relay puts a listener
with no accept hook of its own behind the gate and says which caller each relayed connection
is."""

from __future__ import annotations

import asyncio

from aiops.admission import AdmittedRelay, ConnectionGate, Ticket


def test_one_address_has_one_share_across_every_listener() -> None:
    gate = ConnectionGate(total=100, per_source=3)
    held = [gate.admit("http", "10.0.0.1"), gate.admit("grpc", "10.0.0.1"),
            gate.admit("http", "10.0.0.1")]
    assert all(isinstance(t, Ticket) for t in held)
    assert gate.admit("grpc", "10.0.0.1") == "source"
    assert gate.admit("http", "10.0.0.1") == "source"
    assert isinstance(gate.admit("grpc", "10.0.0.2"), Ticket)  # another address: its own
    assert gate.open(source="10.0.0.1") == 3 and gate.open("grpc") == 2 and gate.open() == 4
    assert gate.refused["source"] == 2


def test_a_ticket_gives_its_place_back_once() -> None:
    gate = ConnectionGate(total=2, per_source=2)
    ticket = gate.admit("http", "a")
    assert isinstance(ticket, Ticket)
    ticket.release()
    ticket.release()  # the listener's close after the gate counted it out: no second count
    assert gate.open() == 0 and gate.open(source="a") == 0


def test_a_full_server_closes_an_idle_connection_of_any_listener_to_make_room() -> None:
    gate = ConnectionGate(total=2, per_source=10)
    idle = [gate.admit("http", "a"), gate.admit("http", "b")]
    closed: list[Ticket] = []

    def make_room() -> Ticket | None:  # the HTTP listener: its longest-idle connection
        if not idle:
            return None
        oldest = idle.pop(0)
        assert isinstance(oldest, Ticket)
        closed.append(oldest)
        return oldest

    assert gate.admit("grpc", "c") == "full"  # nobody can make room yet
    gate.on_full(make_room)
    newcomer = gate.admit("grpc", "c")
    assert isinstance(newcomer, Ticket) and closed and closed[0].source == "a"
    assert gate.open() == 2 and gate.evicted == 1
    assert gate.admit("grpc", "d") is not None and gate.open() == 2
    idle.clear()
    assert gate.admit("grpc", "e") == "full"
    assert gate.refused["full"] == 2


def test_refusals_are_reported_by_reason() -> None:
    seen: list[str] = []
    gate = ConnectionGate(total=1, per_source=1)
    gate.on_refused = seen.append
    gate.admit("http", "a")
    gate.admit("http", "a")
    gate.admit("http", "b")
    assert seen == ["source", "full"]


def test_the_relay_admits_passes_bytes_both_ways_and_names_the_caller() -> None:
    async def scenario() -> None:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            writer.close()

        upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
        gate = ConnectionGate(total=10, per_source=1)
        relay = AdmittedRelay(gate, "grpc", upstream.sockets[0].getsockname()[1])
        port = await relay.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        payload = bytes(range(256)) * 4096  # 1 MiB: flow control both ways
        writer.write(payload)
        echoed = await reader.readexactly(len(payload))
        assert echoed == payload
        assert gate.open("grpc") == 1 and list(relay.sources.values()) == ["127.0.0.1"]
        # The same address again: refused at accept, the connection dropped.
        r2, w2 = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(r2.read(), 5) == b""
        w2.close()
        writer.close()
        await writer.wait_closed()
        for _ in range(50):
            if gate.open() == 0 and not relay.sources:
                break
            await asyncio.sleep(0.05)
        assert gate.open() == 0 and not relay.sources
        await relay.close()
        upstream.close()
        await upstream.wait_closed()

    asyncio.run(scenario())
