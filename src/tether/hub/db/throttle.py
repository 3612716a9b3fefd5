"""Failed authentications per client address and minute, shared by every hub replica (issue 26 item 2)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from tether.hub.db.base import Base


class AuthFailureCount(Base):
    """How many sign-ins and token look-ups failed from one client address in one minute.

    The key leads with the minute so that the rows of past minutes are deleted with one range of the index.
    """

    __tablename__ = "auth_failure_counts"

    #: Unix time in whole minutes (``floor(seconds / 60)``) of the window counted.
    window_start: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    #: The client address, as the hub saw it (``X-Forwarded-For`` from a trusted proxy); never a secret.
    source: Mapped[str] = mapped_column(String(64), primary_key=True)
    failures: Mapped[int] = mapped_column(Integer)
