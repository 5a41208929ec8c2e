"""The one exception type a user sees: bad input, reported as a one-line message and exit code 2."""


class StepperError(Exception):
    """A problem with what the user gave (a file, an option, a config field), not a bug in stepper.

    The message names what was wrong and what was expected; the CLI prints it on one line.
    """
