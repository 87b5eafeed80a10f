"""The admission package's exception tree.

Errors::

    AdmissionError               base of every error the admission package raises
     └── PolicyValueError        a policy built or called with a bad value (also a ValueError);
                                 the message names the setting and quotes the value
"""

from __future__ import annotations

__all__ = ["AdmissionError", "PolicyValueError"]


class AdmissionError(Exception):
    """Base of every error the admission package raises."""


class PolicyValueError(AdmissionError, ValueError):
    """A policy was built or called with a bad value; the message quotes it."""
