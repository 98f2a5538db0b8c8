"""The errors a user can cause. The CLI prints their message on one line and exits non-zero."""


def first_line(e: BaseException, limit: int = 200) -> str:
    """What an exception from a library says, for a one-line error: its message's first line, cut to
    `limit` characters; the exception type's name when the message is empty."""
    text = str(e).strip()
    return text.splitlines()[0][:limit] if text else type(e).__name__


class BertkitError(Exception):
    """Bad input, files or options. The message names the file, line or field."""


class DataError(BertkitError, ValueError):
    """A data file - task data, raw text or prepared pre-training data - is missing, empty, malformed or
    inconsistent with the model; the message names the file (and line, or id). One class for all data."""


class DivergedError(BertkitError):
    """A training run's loss stopped being finite (the message names the update; a lower learning
    rate is the usual cure). An lr search counts such a candidate rate as the worst, not as a failure."""
