"""GitLab offset pagination: ``page``/``per_page`` parameters and the ``X-*`` and ``Link`` response headers.

GitLab rules ("REST API: Pagination"): ``page`` starts at 1, ``per_page`` defaults to 20 and is capped at 100;
``X-Next-Page``/``X-Prev-Page`` are empty when there is no such page; ``Link`` carries ``prev``, ``next``,
``first`` and ``last`` URLs. Above 10,000 items GitLab leaves out ``X-Total``, ``X-Total-Pages`` and the
``last`` link (counting would cost too much); :func:`fetch_page_capped` does the same for large tables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Query, Request, Response
from sqlalchemy import Select, func, select
from sqlalchemy.ext.asyncio import AsyncSession

DEFAULT_PER_PAGE = 20
MAX_PER_PAGE = 100
#: Items counted at most by :func:`fetch_page_capped` (GitLab's limit for ``X-Total``).
COUNT_LIMIT = 10_000
T = TypeVar("T")


@dataclass(frozen=True)
class Page:
    """The requested page.

    Attributes:
        page: 1-based page number.
        per_page: items per page, 1..100.
    """

    page: int
    per_page: int

    @property
    def offset(self) -> int:
        """Items before this page."""
        return (self.page - 1) * self.per_page


def page_params(
    page: Annotated[int, Query(ge=1, description="Page number, from 1.")] = 1,
    per_page: Annotated[int, Query(ge=1, description="Items per page; at most 100.")] = DEFAULT_PER_PAGE,
) -> Page:
    """FastAPI dependency reading ``page`` and ``per_page`` (values above 100 are capped, as GitLab does)."""
    return Page(page=page, per_page=min(per_page, MAX_PER_PAGE))


async def fetch_page(session: AsyncSession, query: Select[T], page: Page) -> tuple[list[T], int]:
    """Run ``query`` for one page; returns (items, total count)."""
    total = await session.scalar(select(func.count()).select_from(query.order_by(None).subquery()))
    items = list(await session.scalars(query.offset(page.offset).limit(page.per_page)))
    return items, int(total or 0)


async def fetch_page_capped(session: AsyncSession, query: Select[T], page: Page) -> tuple[list[T], int | None]:
    """Run ``query`` for one page, counting at most :data:`COUNT_LIMIT` items.

    Returns:
        (the page's items, the total) when the total is at most the limit; else (the page's items plus the
        next item if any, None): pass them to :func:`set_headers_uncounted`.
    """
    total = await session.scalar(
        select(func.count()).select_from(query.order_by(None).limit(COUNT_LIMIT + 1).subquery())
    )
    items = list(await session.scalars(query.offset(page.offset).limit(page.per_page + 1)))
    count = int(total or 0)
    if count <= COUNT_LIMIT:
        return items[: page.per_page], count
    return items, None


def slice_page(items: Sequence[T], page: Page) -> tuple[list[T], int]:
    """One page of an in-memory list; returns (items, total count)."""
    return list(items[page.offset : page.offset + page.per_page]), len(items)


def set_headers(request: Request, response: Response, page: Page, total: int) -> None:
    """Set GitLab's pagination headers on ``response`` for ``total`` items."""
    pages = max(1, math.ceil(total / page.per_page))
    _set(request, response, page, page.page < pages, pages, total)


def set_headers_uncounted(request: Request, response: Response, page: Page, items: list[Any]) -> list[Any]:
    """Set the headers without a total (more than :data:`COUNT_LIMIT` items), as GitLab does.

    Args:
        request: the request (its URL makes the ``Link`` header).
        response: where the headers go.
        page: the requested page.
        items: the page as :func:`fetch_page_capped` read it, one item more than the page when a next page exists.

    Returns:
        the page's items.
    """
    _set(request, response, page, len(items) > page.per_page, None, None)
    return items[: page.per_page]


def _set(request: Request, response: Response, page: Page, more: bool, pages: int | None, total: int | None) -> None:
    next_page = page.page + 1 if more else None
    prev_page = page.page - 1 if page.page > 1 and (pages is None or page.page <= pages + 1) else None
    headers: dict[str, Any] = {"X-Page": page.page, "X-Per-Page": page.per_page}
    if total is not None and pages is not None:
        headers |= {"X-Total": total, "X-Total-Pages": pages}
    headers |= {"X-Next-Page": next_page or "", "X-Prev-Page": prev_page or ""}
    for name, value in headers.items():
        response.headers[name] = str(value)
    links = []
    for rel, number in (("prev", prev_page), ("next", next_page), ("first", 1), ("last", pages)):
        if number is not None:
            url = request.url.include_query_params(page=number, per_page=page.per_page)
            links.append(f'<{url}>; rel="{rel}"')
    response.headers["Link"] = ", ".join(links)
