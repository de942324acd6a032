"""The one exception family of stare_lab.

Every error a user can cause (bad config value, bad data, bad run directory) is a subclass of
:class:`StareLabError`, so the ``stare-lab`` CLI can print one clean line and exit non-zero.
"""

from __future__ import annotations


class StareLabError(Exception):
    """Base class of every user-facing stare_lab error."""


class ConfigError(StareLabError, ValueError):
    """A configuration value is missing, of the wrong type or outside its allowed range.

    The message names the dotted key, the bad value and what is allowed, e.g.
    ``stare.top_p_ratio=1.5 is outside [0, 1]``.
    """


class DataError(StareLabError, ValueError):
    """Input data (tensors, files, records) is malformed: wrong shape, non-finite values, missing fields."""


class RunError(StareLabError):
    """A run directory is missing, unreadable, or would be overwritten."""


class LossError(StareLabError):
    """A policy loss registered outside the package raised: the message names the loss and its exception."""
