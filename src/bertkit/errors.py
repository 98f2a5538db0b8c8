"""The errors a user can cause. The CLI prints their message on one line and exits non-zero."""


class BertkitError(Exception):
    """Bad input, files or options. The message names the file, line or field."""


class DataError(BertkitError, ValueError):
    """A data file - task data, raw text or prepared pre-training data - is missing, empty, malformed or
    inconsistent with the model; the message names the file (and line, or id). One class for all data."""
