"""The one exception type for bad user input.

Anything a user can get wrong (a flag, a trace file, a model config) raises `InputError` with a
message that names the bad value. The command line prints that message as one line and exits
non-zero; everything else that goes wrong is a bug and keeps its traceback.
"""


class InputError(ValueError):
    """Bad user input; the message names the offending value."""
