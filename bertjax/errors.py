"""The one exception type for mistakes a user can make (bad file, bad flag, bad checkpoint).

Entry points catch it, print its message as a single line and exit non-zero; anything else is a bug
and keeps its traceback.
"""


class UserError(Exception):
    """A problem with the user's input: the message names the file, row or flag at fault."""
