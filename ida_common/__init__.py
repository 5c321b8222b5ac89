"""ida_common: the small stdlib-only utilities every ida package shares.

One home each for general helpers that are not about any one format or model: atomic file writes
(:mod:`ida_common.files`), the native-code build cache (:mod:`ida_common.native_build`), package
attributes imported on first use (:mod:`ida_common.lazy`) and the command-line conventions — error line,
exit codes, Ctrl-C (:mod:`ida_common.cli`). It imports nothing outside the standard library, so every
package (``mxfp8_codec`` included) may depend on it.
"""

from __future__ import annotations

from ida_common.files import atomic_directory, atomic_output, check_output, copy_file_atomic

__all__ = ["atomic_directory", "atomic_output", "check_output", "copy_file_atomic"]
