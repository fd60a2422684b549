"""One family of errors for everything a user can get wrong.

Library code raises these with a message written for the user (naming the valid choices
where there are any); the CLI prints the message on one line and exits non-zero.
"""

# How much of an exception's message a one-line report keeps.
ONE_LINE_LIMIT = 300


def first_line(exc: BaseException, limit: int = ONE_LINE_LIMIT) -> str:
    """The first line of `exc`'s message, at most `limit` characters; "" when it has none. What a
    one-line error, warning or record keeps of an exception (the rest is often a traceback or a
    compiler's dump)."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else ""


def first_line_or_type(exc: BaseException, limit: int = ONE_LINE_LIMIT) -> str:
    """The first line of `exc`'s message, or its type's name when it has none: what a message
    that names its own context ("cannot open X: ...") keeps of an exception."""
    return first_line(exc, limit) or type(exc).__name__


def one_line(exc: BaseException, limit: int = ONE_LINE_LIMIT) -> str:
    """`exc` as "Type: first line of its message" (its type's name alone when it has none), at
    most `limit` characters."""
    first = first_line(exc, limit)
    return f"{type(exc).__name__}: {first}"[:limit] if first else type(exc).__name__


class OmnituneError(Exception):
    """Base class: a user-facing error with a one-line message."""


class UnknownKernelError(OmnituneError):
    pass


class KernelNameError(OmnituneError):
    """A user's kernel whose name is already a built-in's (or another module's kernel's): it may
    not shadow it, since results, tables and runtime lookups are all keyed by the name."""


class InputError(OmnituneError):
    """Inputs a kernel cannot run on: tensors (shapes, dtypes, devices), or a problem given to
    the runtime with a value no tensor could have (see ShapeError)."""


class ShapeError(InputError):
    """A problem shape that cannot be parsed or is impossible for the kernel (an InputError too,
    so that a caller of the runtime catches one error type for every bad problem)."""


class ConfigError(OmnituneError):
    """A launch config that is malformed, outside the kernel's space, or violates a constraint."""


class DeviceError(OmnituneError):
    """No usable GPU where one is needed."""


class StoreError(OmnituneError):
    """The results database or an exported file cannot be read or written."""
