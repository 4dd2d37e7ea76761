"""The one exception type for bad user input.

Anything a user can get wrong (a flag, a trace file, a model config) raises `InputError` with a
message that names the bad value. The command line prints that message as one line and exits
non-zero; everything else that goes wrong is a bug and keeps its traceback.
"""


class InputError(ValueError):
    """Bad user input; the message names the offending value."""


SHOWN_CHARS = 80
"""The most of a bad value a message quotes: enough to recognise it, never a page of it."""


def clip(text: str) -> str:
    """`text` (a bad value as a message shows it: its repr, its JSON) cut to `SHOWN_CHARS` characters."""
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS - 3]}..."


def clip_path(path: str) -> str:
    """A file's path as a message shows it: its repr, cut to `SHOWN_CHARS` characters from its end
    (the file's own name, which says most), not its start."""
    text = repr(path)
    return text if len(text) <= SHOWN_CHARS else f"{text[0]}...{text[-(SHOWN_CHARS - 4):]}"
