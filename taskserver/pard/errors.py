"""Errors of the PARD policy core.

Errors::

    Exception
     └── PardError
          ├── UnknownModule      a module id that the pipeline graph does not hold (also KeyError)
          └── DuplicateRequest   push() of a request id that is already queued (also KeyError)

Bad settings are not in this tree: they raise ValueError naming the setting and quoting the
value, at construction time.
"""

from __future__ import annotations

__all__ = ["DuplicateRequest", "PardError", "UnknownModule"]


class PardError(Exception):
    """Base class of the errors raised by taskserver.pard."""


class UnknownModule(PardError, KeyError):
    """A module id that the pipeline graph does not hold."""


class DuplicateRequest(PardError, KeyError):
    """A request id that is already in the queue."""
