"""One family of errors for everything a user can get wrong.

Library code raises these with a message written for the user (naming the valid choices
where there are any); the CLI prints the message on one line and exits non-zero.
"""


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
