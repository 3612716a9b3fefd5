"""The status an audit record keeps when its handler ends without an answer (kas' ``modserver.audit``)."""

from __future__ import annotations

from tether.modserver.audit import STATUS_CLIENT_GONE, AuditRecord, AuditSink


class Kept(AuditSink):
    def __init__(self) -> None:
        self.records: list[AuditRecord] = []

    def finished(self, record: AuditRecord) -> None:
        self.records.append(record)


def test_a_session_whose_head_was_sent_keeps_its_status_when_the_client_leaves() -> None:
    """The Graph API's WebSocket: 101 sent, then the client closed while the session wound down (CI: 499)."""
    sink = Kept()
    record = sink.begin("kubernetes_api", "GET", "/graph", "req-1", "127.0.0.1")
    record.head_status = 101
    record.finish(None)
    assert sink.records[0].status == 101


def test_a_request_that_got_no_head_is_a_client_gone() -> None:
    sink = Kept()
    sink.begin("kubernetes_api", "GET", "/api", "req-2", "127.0.0.1").finish(None)
    assert sink.records[0].status == STATUS_CLIENT_GONE


def test_the_answer_returned_wins() -> None:
    sink = Kept()
    record = sink.begin("kubernetes_api", "GET", "/graph", "req-3", "127.0.0.1")
    record.head_status = 101
    record.finish(400)
    assert sink.records[0].status == 400
