"""The codec's single error type.

Every failure the codec detects -- malformed files, non-finite values handed to the encoder, arrays
of the wrong dtype or shape -- raises :class:`MXFP8Error`. It subclasses :class:`ValueError`, so
callers that already catch ``ValueError`` keep working, and its message always names *what* (file,
tensor, index, line) and *why*, so a user can act on it without reading our source.
"""

from __future__ import annotations

__all__ = ["MXFP8Error"]


class MXFP8Error(ValueError):
    """Invalid input to the MXFP8 codec: bad file, bad tensor, or a value the format cannot hold.

    The message names the file and/or tensor (and index or byte offset where known) and the reason,
    e.g. ``"tensor 'model.layers.0.mlp.up_proj.weight': non-finite value nan at index (3, 17)"``.

    Example:
        >>> import numpy as np
        >>> from mxfp8_codec.numerics import encode_mxfp8
        >>> try:
        ...     encode_mxfp8(np.array([1.0, np.nan], np.float32), name="w")
        ... except MXFP8Error as e:
        ...     print(e)
        tensor 'w': cannot encode non-finite value nan at index (1,) (a weight with NaN/Inf is a training failure, not something to archive)
    """
