"""The one exception type the CLI turns into a one-line message (no traceback)."""


class UserError(Exception):
    """Bad input or an impossible request: the message names the field and the rule."""
