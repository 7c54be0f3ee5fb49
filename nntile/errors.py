"""The one exception every layer may raise for bad input that the programs report as one line
(exit code 2); nntile.cli_common turns it into that line. It lives below both the programs and
nntile.fit, so that neither imports the other to raise it."""


class CLIError(Exception):
    """Bad input: printed as one line on stderr, exit code 2, no traceback."""
