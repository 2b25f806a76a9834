"""User-facing errors.

Anything a user can cause (a missing file, bad bytes, a bad config value) raises a subclass of
:class:`AttnlmError` with a one-line message naming the problem. The CLI prints that message
and exits with code 2; library users catch the class.
"""


class AttnlmError(Exception):
    """Base class for errors caused by user input; the message is meant for the user."""


class InputError(AttnlmError, ValueError):
    """Bad input data: missing path, empty file, undecodable bytes, malformed file."""


class ConfigError(AttnlmError, ValueError):
    """A configuration value or combination that cannot work; the message names the field."""
