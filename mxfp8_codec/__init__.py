"""MXFP8 checkpoint codec: OCP E4M3 payload + UE8M0 scale per 32 values, in safetensors files.

Numerics (:mod:`mxfp8_codec.numerics`): :func:`encode_mxfp8` / :func:`decode_mxfp8`.
Checkpoint layout (:mod:`mxfp8_codec.layout`): which tensors are projections, their orientation and
the per-architecture norm-folding rule, shared by every reader and writer.
File format (:mod:`mxfp8_codec.header`, :mod:`mxfp8_codec.reader`, :mod:`mxfp8_codec.writer`,
:mod:`mxfp8_codec.rename`): a
validated header parser, a memory-mapped streaming reader, an atomic writer, a header-only rename
with sha256 proof, whole checkpoints quantized and dequantized (:mod:`mxfp8_codec.checkpoint`), and
the CLI ``python -m mxfp8_codec``. The on-disk format is specified in docs/format.md.

Example:
    >>> import numpy as np, tempfile, os
    >>> import mxfp8_codec as mx
    >>> p = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    >>> mx.write_mxfp8_safetensors(p, {"l.q_proj.weight": np.ones((32, 64), np.float32)})
    >>> mx.validate(p).quantized  # the validated header
    ('l.q_proj.weight',)
    >>> mx.read_mxfp8_safetensors(p)["l.q_proj.weight"].sum()
    np.float32(2048.0)
"""

from mxfp8_codec.constants import WEIGHTS_DTYPE, Rounding, ScaleRule
from mxfp8_codec.errors import MXFP8Error
from mxfp8_codec.header import Header, TensorEntry, read_header
from mxfp8_codec.layout import (
    NORM_CONVENTIONS,
    NORM_RULES,
    ORIENTATIONS,
    PROJECTION_NAMES,
    CheckpointLayout,
    NormRule,
    is_norm_weight,
    is_projection_weight,
    model_type_of,
    norm_adds_one,
)
from mxfp8_codec.numerics import (
    backend_info,
    decode_mxfp8,
    decode_mxfp8_torch,
    encode_mxfp8,
    encode_mxfp8_torch,
    scales_shape,
)
from mxfp8_codec.reader import (
    MXFP8Reader,
    checkpoint_files,
    iter_mxfp8_safetensors,
    open_mxfp8,
    read_mxfp8_metadata,
    read_mxfp8_safetensors,
    validate,
)
from mxfp8_codec.rename import RenameReport, prefix_mapping, rename_tensors, verify_renamed
from mxfp8_codec.torch_io import load_file, save_file
from mxfp8_codec.writer import MXFP8Tensor, write_mxfp8_safetensors, write_safetensors

__all__ = [
    "CheckpointLayout",
    "Header",
    "MXFP8Error",
    "MXFP8Reader",
    "MXFP8Tensor",
    "NORM_CONVENTIONS",
    "NORM_RULES",
    "NormRule",
    "ORIENTATIONS",
    "PROJECTION_NAMES",
    "RenameReport",
    "Rounding",
    "ScaleRule",
    "TensorEntry",
    "WEIGHTS_DTYPE",
    "backend_info",
    "checkpoint_files",
    "decode_mxfp8",
    "decode_mxfp8_torch",
    "encode_mxfp8",
    "encode_mxfp8_torch",
    "is_norm_weight",
    "is_projection_weight",
    "iter_mxfp8_safetensors",
    "load_file",
    "model_type_of",
    "norm_adds_one",
    "open_mxfp8",
    "prefix_mapping",
    "read_header",
    "read_mxfp8_metadata",
    "read_mxfp8_safetensors",
    "rename_tensors",
    "save_file",
    "scales_shape",
    "validate",
    "verify_renamed",
    "write_mxfp8_safetensors",
    "write_safetensors",
]
