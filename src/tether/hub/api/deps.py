"""Small helpers shared by the route modules."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import unquote

from fastapi import Depends

from tether.hub.api.pagination import Page, page_params
from tether.hub.api.state import HubState, hub_state

#: The app's :class:`HubState`.
State = Annotated[HubState, Depends(hub_state)]
#: The requested page.
Paging = Annotated[Page, Depends(page_params)]


def ref(text: str) -> str:
    """A path parameter naming a project, group or user: a numeric id or a URL-encoded full path (``a%2Fb``)."""
    return unquote(text)
