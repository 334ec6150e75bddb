"""The one exception type for bad input: its message is printed as one line and the program exits 1."""


class UserError(Exception):
    """Bad input or environment. The message names the file (and line or sample) and fits on one line."""
