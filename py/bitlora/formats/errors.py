"""FormatError, the one exception the checkpoint and adapter readers raise for a bad
file (a module of its own so that every reader can import it without importing the
package's dispatcher)."""


class FormatError(ValueError):
    """A checkpoint file is malformed or unsupported; the message names the file,
    the tensor or key, and the problem."""
