"""Errors a user can cause. The CLI prints their message without a traceback."""


class DomaingenError(Exception):
    """A problem the user can fix; its message says how."""


class DataNotFoundError(DomaingenError):
    """The files a dataset needs are not where they were looked for."""


class RunDirectoryError(DomaingenError):
    """The output directory cannot be used for this run."""
