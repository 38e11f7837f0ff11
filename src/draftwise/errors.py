"""The one error type users see: its message is a single line that names the problem and, where one
exists, the fix. The CLI prints it as `draftwise: error: <message>` and exits with status 2."""


class DraftwiseError(Exception):
    """Bad input or an impossible request, explained in one line."""
