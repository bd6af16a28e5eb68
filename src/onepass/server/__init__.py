"""The System One HTTP server (``onepass serve``). Needs the ``server`` extra.

``create_app`` is imported lazily so that ``onepass.server.settings`` (used to build the CLI's
help) does not pull in FastAPI.
"""

from __future__ import annotations

from typing import Any

from onepass.server.settings import ServerSettings

__all__ = ["ServerSettings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from onepass.server.app import create_app

        return create_app
    raise AttributeError(name)
