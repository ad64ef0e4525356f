"""The one base of the errors aiayn raises about its input: the message is the whole story.

Each stage has its own kind (DataError, ConfigError, CheckpointError, ...), and each message names
what is wrong and where (file, line, field, flag). The command line prints any of them as one line
with exit status 2 and no traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class AiaynError(ValueError):
    """An error in what aiayn was given (files, config, flags, requests), said in one line."""


class ConfigError(AiaynError):
    """A config value, override or device setting is invalid; the message names the field or flag."""
