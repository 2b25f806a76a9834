"""User-facing errors.

Anything a user can cause (a missing file, bad bytes, a bad config value) raises a subclass of
:class:`AttnlmError` with a one-line message naming the problem. The CLI prints that message
and exits with code 2; library users catch the class.
"""

import contextlib
from collections.abc import Iterator


class AttnlmError(Exception):
    """Base class for errors caused by user input; the message is meant for the user."""


class InputError(AttnlmError, ValueError):
    """Bad input data: missing path, empty file, undecodable bytes, malformed file."""


class ConfigError(AttnlmError, ValueError):
    """A configuration value or combination that cannot work; the message names the field."""


@contextlib.contextmanager
def file_read_errors(
    path: object, what: str, error: type[Exception] = InputError
) -> Iterator[None]:
    """Inside this block, reading ``path`` (a ``what``) fails as one line of ``error``: no
    such file, a folder where a file was expected, or the system's reason."""
    try:
        yield
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{path}: is a folder, expected a {what}") from None
    except OSError as e:
        raise error(f"{path}: cannot read {what} ({e.strerror or e})") from None
