"""SFT trainer with NVFP4 compute and an MXFP8 master (python -m ida_trainer)."""

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
    parse_args,
)

__all__: list[str] = [
    "CheckpointConfig",
    "DataConfig",
    "EvalConfig",
    "JobConfig",
    "ModelConfig",
    "OptimConfig",
    "ParallelConfig",
    "PrecisionConfig",
    "TrainConfig",
    "parse_args",
]
