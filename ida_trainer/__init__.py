"""SFT trainer with NVFP4 compute and an MXFP8 master (``python -m ida_trainer``; no arguments = the demo).

Modules: :mod:`ida_trainer.config` (one frozen config tree, validation),
:mod:`ida_trainer.cli` (presets, TOML, command line), :mod:`ida_trainer.data`
(JSONL formats, completion-only labels, packing, resumable batches), :mod:`ida_trainer.engine` (loss,
``LocalEngine``, schedule, clipping), :mod:`ida_trainer.trainer` (loop, resume, eval),
:mod:`ida_trainer.checkpoint` (atomic checkpoints, resume, export),
:mod:`ida_trainer.logs`, :mod:`ida_trainer.special_tokens`, :mod:`ida_trainer.precision` (recipes,
NVFP4 linear, optimizers), :mod:`ida_trainer.distributed` (1F1B pipeline, FSDP2), :mod:`ida_trainer.demo`.

Example:
    >>> from ida_trainer import parse_args
    >>> parse_args(["--recipe", "bf16"]).optim.name
    'adamw'
"""

from typing import TYPE_CHECKING

from ida_common.lazy import lazy_attributes
from ida_trainer.cli import parse_args
from ida_trainer.config import (
    CheckpointConfig,
    DataConfig,
    EvalConfig,
    JobConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    PrecisionConfig,
    TrainConfig,
)

if TYPE_CHECKING:
    from ida_trainer.data import DataError
    from ida_trainer.engine import LocalEngine, NonFiniteError
    from ida_trainer.trainer import Trainer, run

# Imported on first use (torch and transformers come with them): `python -m ida_trainer --help`, or a bad
# setting, answers in a fraction of a second instead of after ~5 s of imports.
_LAZY = {
    "DataError": "ida_trainer.data",
    "LocalEngine": "ida_trainer.engine",
    "NonFiniteError": "ida_trainer.engine",
    "Trainer": "ida_trainer.trainer",
    "run": "ida_trainer.trainer",
}
__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)


__all__: list[str] = [
    "CheckpointConfig",
    "DataConfig",
    "DataError",
    "EvalConfig",
    "JobConfig",
    "LocalEngine",
    "ModelConfig",
    "NonFiniteError",
    "OptimConfig",
    "ParallelConfig",
    "PrecisionConfig",
    "TrainConfig",
    "Trainer",
    "parse_args",
    "run",
]
