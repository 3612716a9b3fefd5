"""The console's audit page, ``/-/audit`` (issue 25 item 1): the events the signed-in user may read, filtered.

Same visibility and filters as ``GET /api/v4/audit_events`` (:mod:`tether.hub.service.audit_query`), newest
first, :data:`PER_PAGE` events a page. A filter that is not understood is shown back with the problem in plain
words, and no events. An event with a recording links to its replay page ``/-/audit/<id>/recording``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from tether.hub.api.pagination import Page, fetch_page_capped
from tether.hub.api.state import hub_state
from tether.hub.console.web import ConsoleUser, console_user, render
from tether.hub.service import audit_query
from tether.hub.service.audit_query import AuditFilter
from tether.modules.audit.hub.times import parse_time
from tether.tool.ids import parse_id

router = APIRouter(include_in_schema=False)
User_ = Annotated[ConsoleUser, Depends(console_user)]
#: Events on one page of the console.
PER_PAGE = 50
#: The query fields of the filter form, in order.
FIELDS = ("user_id", "agent_id", "verb", "resource", "namespace", "since", "until")
_MAX_TEXT = 253


def _filter(query: Mapping[str, str]) -> AuditFilter:
    """The filter of the page's query string.

    Raises:
        ValueError: a field is not understood; the message says which and why.
    """
    ids: dict[str, int | None] = {}
    for field in ("user_id", "agent_id"):
        text = query.get(field, "").strip()
        ids[field] = parse_id(text) if text else None
        if text and ids[field] is None:
            raise ValueError(f"{field.replace('_', ' ')} must be a number, such as 12")
    texts = {field: query.get(field, "").strip() for field in ("verb", "resource", "namespace")}
    for field, text in texts.items():
        if len(text) > _MAX_TEXT:
            raise ValueError(f"{field} is longer than {_MAX_TEXT} characters")
    since, until = (query.get(field, "").strip() for field in ("since", "until"))
    return AuditFilter(
        user_id=ids["user_id"],
        agent_id=ids["agent_id"],
        since=parse_time(since, "since") if since else None,
        until=parse_time(until, "until") if until else None,
        verb=texts["verb"],
        resource=texts["resource"],
        namespace=texts["namespace"],
    )


@router.get("/-/audit", response_class=HTMLResponse)
async def audit_page(request: Request, user: User_) -> HTMLResponse:
    """The audit events the user may read (administrators: all), newest first, with the filter form."""
    query = request.query_params
    shown = {field: query.get(field, "")[:100] for field in FIELDS}
    page_number = parse_id(query.get("page", "1")) or 1
    try:
        wanted = _filter(query)
    except ValueError as exc:
        return render(request, "audit.html", user, 400, error=str(exc), form=shown, events=[], page=1, more=False)
    page = Page(page=min(page_number, 10**6), per_page=PER_PAGE)
    state = hub_state(request)
    async with state.db.transaction(read_only=True) as session:
        allowed = await audit_query.visible(session, user.principal)
        rows, total = await fetch_page_capped(session, audit_query.events_query(wanted, allowed, True), page)
    more = len(rows) > PER_PAGE if total is None else page.offset + PER_PAGE < total
    pages = None if total is None else max(1, -(-total // PER_PAGE))
    events = [audit_query.event_json(row) for row in rows[:PER_PAGE]]
    return render(
        request, "audit.html", user, error=None, form=shown, events=events, page=page.page, more=more, pages=pages
    )
