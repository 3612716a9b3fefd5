"""GitLab offset pagination: ``page``/``per_page`` parameters and the ``X-*`` and ``Link`` response headers.

GitLab rules ("REST API: Pagination"): ``page`` starts at 1, ``per_page`` defaults to 20 and is capped at 100;
``X-Next-Page``/``X-Prev-Page`` are empty when there is no such page; ``Link`` carries ``prev``, ``next``,
``first`` and ``last`` URLs.
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


def slice_page(items: Sequence[T], page: Page) -> tuple[list[T], int]:
    """One page of an in-memory list; returns (items, total count)."""
    return list(items[page.offset : page.offset + page.per_page]), len(items)


def set_headers(request: Request, response: Response, page: Page, total: int) -> None:
    """Set GitLab's pagination headers on ``response`` for ``total`` items."""
    pages = max(1, math.ceil(total / page.per_page))
    next_page = page.page + 1 if page.page < pages else None
    prev_page = page.page - 1 if 1 < page.page <= pages + 1 else None
    headers: dict[str, Any] = {
        "X-Page": page.page,
        "X-Per-Page": page.per_page,
        "X-Total": total,
        "X-Total-Pages": pages,
        "X-Next-Page": next_page or "",
        "X-Prev-Page": prev_page or "",
    }
    for name, value in headers.items():
        response.headers[name] = str(value)
    links = []
    for rel, number in (("prev", prev_page), ("next", next_page), ("first", 1), ("last", pages)):
        if number is not None:
            url = request.url.include_query_params(page=number, per_page=page.per_page)
            links.append(f'<{url}>; rel="{rel}"')
    response.headers["Link"] = ", ".join(links)
