"""The one exception type a user sees: bad input, reported as a one-line message and exit code 2;
and SIGTERM's, which ends a command on the way out (cli.main)."""


class StepperError(Exception):
    """A problem with what the user gave (a file, an option, a config field), not a bug in stepper.

    The message names what was wrong and what was expected; the CLI prints it on one line.
    """


class Terminated(BaseException):
    """SIGTERM (`timeout`, a job's end, `kill`) raised where the command is, so that what it was
    writing is removed on the way out (each temporary file's and folder's `finally`), as on Ctrl-C;
    like Ctrl-C, no handler of a library's failures takes it for one."""
