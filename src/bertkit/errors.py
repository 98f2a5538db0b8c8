"""The errors a user can cause. The CLI prints their message on one line and exits non-zero."""


class BertkitError(Exception):
    """Bad input, files or options. The message names the file, line or field."""
