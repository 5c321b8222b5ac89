"""The training loop: setup, steps, checkpoints, resume, in-training eval, export, report.

Loss, schedule, engine and clipping live in :mod:`ida_trainer.engine`.

Per step: forward/backward through an *engine* (:class:`LocalEngine` here; ``PipelineEngine`` from
:mod:`ida_trainer.distributed` for 1F1B stages, same interface), a non-finite loss aborts naming the
step and the examples of the batch, the global gradient norm is computed (and clipped when
``optim.grad_clip > 0``) and logged, then ``optimizer.step()``.

Resume: the newest complete checkpoint restores weights (``precision.load_state``), optimizer state
(momenta, SR step counter, exact masters), the data cursor and every RNG state, so the loss sequence of an
interrupted and resumed run equals the uninterrupted run's step for step.

Example:
    >>> from ida_trainer.cli import parse_args
    >>> cfg = parse_args(["--train.steps", "2", "--out", "/tmp/ida_doctest_run", "--eval.final", "false"])
    >>> report = run(cfg)  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
import warnings
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ida_common.cli import check_input_file, check_output_dir
from ida_common.files import atomic_write_text
from ida_trainer import checkpoint as ckpt
from ida_trainer.cli import to_toml
from ida_trainer.config import JobConfig, to_dict, warn_ignored, with_overrides
from ida_trainer.data import (
    DataStats,
    StepBatch,
    build_batcher,
    end_of_turn_marker,
    load_examples,
    read_jsonl,
    record_texts,
)
from ida_trainer.engine import (
    LocalEngine,
    NonFiniteError,
    enable_activation_checkpointing,
    grad_norm_and_clip,
    lr_at,
)
from ida_trainer.logs import RunLogger, is_console_step, peak_memory_gib
from ida_trainer.rundir import new_run_id, prepare_run_dir
from ida_trainer.special_tokens import (
    UntrainedReport,
    fix_untrained_tokens,
    set_end_of_turn,
)

DEMO_NOTE = (
    "NOTE: the demo shows that every stage of the pipeline runs end to end (tokenizer training, NVFP4 "
    "compute with an MXFP8 master unless --recipe bf16, atomic MXFP8 checkpoint, header-only export, "
    "sandboxed MBXP-style execution). A tiny model memorising 48 functions it was trained on says nothing "
    "about model quality."
)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def config_digest(cfg: JobConfig, *, any_stages: bool = False) -> str:
    """sha256 of the config's TOML form minus run-control fields (resume, overwrite, out): identifies the run.

    ``any_stages``: also without ``parallel.pipeline_stages``, which does not change a bit of what is computed
    (a pipelined run computes what one process computes: tests/ida_trainer/test_parallel_resume.py), so a
    resume with another number of stages continues the run exactly.
    """
    d = to_dict(cfg)
    d.pop("out")
    d["checkpoint"].pop("resume")
    d["checkpoint"].pop("overwrite")
    d["train"].pop("progress")
    if any_stages:
        d["parallel"].pop("pipeline_stages")
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


class Trainer:
    """One training run described by a :class:`JobConfig`. Use :func:`run`, or ``setup()`` / ``train()`` /
    ``close()`` explicitly.

    Args:
        cfg: the validated config.
        dist: the ``DistInfo`` of :func:`ida_trainer.distributed.init_distributed` (None: single process).
    """

    def __init__(self, cfg: JobConfig, *, dist: Any = None):
        self.cfg = cfg
        self.dist = dist
        # torchrun's RANK is known before the process group exists: only rank 0 writes files during setup
        self.rank = int(getattr(dist, "rank", 0)) if dist is not None else int(os.environ.get("RANK", "0"))
        self.is_main = self.rank == 0
        self.out = Path(cfg.out)
        self.ckpt_root = self.out / "checkpoints"
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        )
        self.start_step = 0
        self.run_id = new_run_id()  # replaced by the checkpoint's on resume
        self.untrained = UntrainedReport()
        self.data_stats = DataStats()
        self.logger: RunLogger | None = None
        self.engine: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.model: Any = None
        self.tokenizer: Any = None
        self.batcher: Any = None
        self.resumed_from: Path | None = None
        self.evals: list[dict[str, Any]] = []
        self._pipeline_group: Any = None
        self._movement: Any = None  # ida_trainer.movement.MasterMovement of the nvfp4 recipe's masters
        self._dp_size = 1
        self._from_checkpoint = False  # --resume: every tensor comes from the checkpoint, the base is not read
        self.num_params = 0

    # ---------------------------------------------------------------------------------------------
    # setup

    def _say(self, msg: str) -> None:
        if not self.is_main:
            return
        if self.logger is not None:
            self.logger.print(msg)
        else:
            print(msg, flush=True)

    @property
    def _built_empty(self) -> bool:
        """Whether this rank builds its model on the meta device: a parallel run's ranks other than 0 get rank 0's
        weights when it is sharded or pruned to its stage (:func:`ida_trainer.distributed.apply_fsdp`,
        ``PipelineEngine``), so a machine holds one host copy of the base; and every rank of a resumed run, whose
        tensors all come from the checkpoint (the base's weights are not read)."""
        parallel = self.cfg.parallel
        distributed = parallel.data_parallel == "fsdp" or parallel.pipeline_stages > 1
        return self._from_checkpoint or (distributed and not self.is_main)

    def _load_model_and_tokenizer(self, resume_dir: Path | None) -> None:
        cfg = self.cfg
        if cfg.is_demo:
            from transformers import AutoTokenizer

            from ida_trainer.demo import build_demo_model, train_demo_tokenizer

            if resume_dir is not None:
                self.tokenizer = AutoTokenizer.from_pretrained(resume_dir)
            else:
                records = read_jsonl(self._data_path(), cfg.data.format)  # validates before training on it
                self.tokenizer = train_demo_tokenizer(record_texts(records, cfg.data.format))
            with torch.device("meta") if self._built_empty else nullcontext():
                self.model = build_demo_model(cfg.model, self.tokenizer, seed=cfg.train.seed)
            return
        from ida_eval import load_model
        from ida_eval.loader import empty_model

        dtype = torch.bfloat16 if cfg.precision.recipe == "nvfp4" else torch.float32
        if self._built_empty:
            self.model, self.tokenizer = empty_model(cfg.model.base, dtype=dtype)
        else:  # a base that ida wrote lists its files' sha256, checked first
            self.model, self.tokenizer = load_model(cfg.model.base, dtype=dtype)
        if resume_dir is not None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(resume_dir)
        self.model.train()

    def _warn_if_it_will_not_fit(self) -> None:
        """On a GPU, before the recipe is applied and anything is trained: ida_trainer.memory's count of this job
        against the GPU's memory (:func:`ida_trainer.memory.memory_warning`), one warning on rank 0."""
        if self.device.type != "cuda" or not self.is_main:
            return
        from ida_common.launch import launch_env
        from ida_trainer.memory import memory_warning

        line = memory_warning(
            self.model.config,
            self.cfg,
            world_size=launch_env().world_size,
            device_bytes=torch.cuda.get_device_properties(self.device).total_memory,
        )
        if line is not None:
            warnings.warn(line, UserWarning, stacklevel=2)

    def _data_path(self) -> Path:
        from ida_trainer.demo import corpus_path

        return Path(self.cfg.data.path) if self.cfg.data.path else corpus_path()

    def preflight(self) -> None:
        """Checks before work, on every rank, before any directory is created or anything is loaded: the
        run directory can be written, the data and problems files exist, the base model directory has a
        config and tokenizer files. Each failure is one ``ValueError`` naming the flag and the path."""
        cfg = self.cfg
        check_output_dir(cfg.out, "--out")
        if cfg.data.path:
            check_input_file(cfg.data.path, "--data")
        if cfg.eval.problems:
            check_input_file(cfg.eval.problems, "--eval.problems")
        if not cfg.is_demo:
            from ida_eval.loader import check_checkpoint_dir

            check_checkpoint_dir(cfg.model.base, "--base")

    def setup(self) -> None:
        """Build everything, resume if asked; all user errors surface here, before step 1."""
        cfg = self.cfg
        self.preflight()
        if self.is_main:
            prepare_run_dir(cfg, say=self._say)
            self.out.mkdir(parents=True, exist_ok=True)
            warn_ignored(cfg)
            # run control is not part of the run: --config <run>/config.toml must never resume or overwrite by itself
            plain = with_overrides(cfg, checkpoint={"resume": False, "overwrite": False})
            atomic_write_text(self.out / "config.toml", to_toml(plain))
            atomic_write_text(self.out / "config.json", json.dumps(to_dict(plain), indent=1) + "\n")
        resume_dir = None
        if cfg.checkpoint.resume:
            if self.is_main:
                for p in ckpt.remove_partial(self.ckpt_root):
                    print(f"removed incomplete checkpoint {p}", flush=True)
            resume_dir = ckpt.latest_checkpoint(self.ckpt_root)
            # each state read (and checked against its SHA256SUMS) once: a damaged one is named, not counted as
            # another run's
            runs = {ckpt.state_run_id(ckpt.read_trainer_state(p)) for _, p in ckpt.list_checkpoints(self.ckpt_root)}
            if len(runs) > 1:
                raise ValueError(
                    f"--resume: {self.ckpt_root} holds checkpoints of {len(runs)} different runs "
                    f"(run ids in trainer_state.json); cannot tell which to continue: start anew with "
                    "--overwrite, or move the other run's checkpoints away"
                )
            if resume_dir is None:
                warnings.warn(
                    f"--resume: no complete checkpoint in {self.ckpt_root}; starting from step 0",
                    UserWarning,
                    stacklevel=2,
                )
        _seed_everything(cfg.train.seed)
        self._from_checkpoint = resume_dir is not None
        self._load_model_and_tokenizer(resume_dir)
        self._warn_if_it_will_not_fit()
        examples, self.data_stats = load_examples(cfg.data, self.tokenizer, path=self._data_path())
        if cfg.data.format == "chat":
            marker = end_of_turn_marker(self.tokenizer)
            set_end_of_turn(self.model, self.tokenizer, marker)
        if resume_dir is None and not self._built_empty:  # rank 0's fix reaches the other ranks with its weights
            used = {i for ex in examples for i in ex.input_ids}
            self.untrained = fix_untrained_tokens(self.model, self.tokenizer, used, seed=cfg.train.seed)
        if cfg.model.activation_checkpointing:
            enable_activation_checkpointing(self.model)
        from ida_trainer.movement import MasterMovement
        from ida_trainer.nvfp4_linear import nvfp4_modules
        from ida_trainer.precision import (
            apply_recipe,
            build_optimizer,
            count_parameters,
        )

        apply_recipe(self.model, cfg.precision)
        self.num_params = count_parameters(self.model)  # before a pipeline prunes the model to its stage
        dp_rank, dp_size = 0, 1
        if cfg.parallel.pipeline_stages > 1 or cfg.parallel.data_parallel == "fsdp":
            self.engine, dp_rank, dp_size = self._distributed_engine()
            opt_model = getattr(self.engine, "stage_module", None) or self.model
        else:
            if self._from_checkpoint:  # built empty: the checkpoint fills every persistent tensor in _resume
                from ida_trainer.sharded import compute_non_persistent_buffers, to_empty_keeping_ties

                to_empty_keeping_ties(self.model, self.device)
                compute_non_persistent_buffers(self.model)
            else:
                self.model.to(self.device)
            self.engine = LocalEngine(self.model, device=self.device)
            opt_model = self.model
        self.optimizer = build_optimizer(opt_model, cfg.optim, cfg.precision)
        if cfg.precision.recipe == "nvfp4":
            self._movement = MasterMovement(mod for _, mod in nvfp4_modules(opt_model))
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.batcher = build_batcher(
            cfg.data,
            examples,
            global_batch_size=cfg.train.global_batch_size,
            microbatches=cfg.parallel.microbatches,
            seed=cfg.train.seed,
            pad_id=pad,
            dp_rank=dp_rank,
            dp_size=dp_size,
        )
        self.data_stats.num_rows = len(self.batcher.rows)
        self._dp_size = dp_size
        if resume_dir is not None:
            self._resume(resume_dir)
        self.logger = RunLogger(
            self.out,
            total_steps=cfg.train.steps,
            start_step=self.start_step,
            log_every=cfg.train.log_every,
            progress=cfg.train.progress,
            enabled=self.is_main,
        )
        self._log_start()

    def _distributed_engine(self) -> tuple[Any, int, int]:
        from ida_trainer import distributed

        cfg = self.cfg
        if self.dist is None:
            self.dist = distributed.init_distributed(cfg.parallel)
            self.rank = int(getattr(self.dist, "rank", 0))
            self.is_main = self.rank == 0
        if cfg.parallel.pipeline_stages > 1:
            engine = distributed.PipelineEngine(
                self.model, cfg.parallel, self.dist, from_checkpoint=self._from_checkpoint
            )
            self._pipeline_group = getattr(engine, "group", None)
            return engine, 0, 1
        distributed.apply_fsdp(self.model, self.dist, from_checkpoint=self._from_checkpoint)
        self.device = getattr(self.dist, "device", self.device)
        return LocalEngine(self.model, device=self.device), int(self.dist.rank), int(self.dist.world_size)

    def _resume(self, path: Path) -> None:
        from ida_common.launch import launch_env
        from ida_eval.parallel import Ranks
        from ida_trainer.precision import load_state

        # the files are hashed once per machine, not once per rank (Qwen3-4B's FSDP checkpoint: ~50 GB)
        Ranks(launch_env()).once_per_machine(lambda: ckpt.verify_checkpoint(path))
        with ckpt.load_checkpoint(path, verify=False) as loaded:  # the model file is read tensor by tensor
            state = loaded.trainer_state
            ckpt.check_resume_state(path, state)
            exact = (  # checkpoints of an older ida record only the full digest
                state["computation_digest"] == config_digest(self.cfg, any_stages=True)
                if "computation_digest" in state
                else state.get("config_digest") == config_digest(self.cfg)
            )
            if not exact:
                warnings.warn(
                    f"resuming {path} with a config that differs from the one it was saved with; "
                    "the loss curve will not continue exactly",
                    UserWarning,
                    stacklevel=2,
                )
            load_state(self.model, loaded.tensors)
            self.optimizer.load_state_dict(loaded.optimizer_state)
        self.batcher.load_state_dict(state["data_cursor"])
        ckpt.set_rng_state(state["rng"], checkpoint=path)
        self.start_step = int(state["step"])
        self.run_id = state.get("run_id") or self.run_id  # checkpoints of older versions carry none
        self.evals = list(state.get("evals", []))
        self.resumed_from = path
        self._say(f"resumed from {path} at step {self.start_step}")

    def _precision_names(self) -> tuple[str, str]:
        if self.cfg.precision.recipe == "nvfp4":
            return "mxfp8_e4m3", "nvfp4"
        return "fp32", "bfloat16"

    def _log_start(self) -> None:
        cfg = self.cfg
        assert self.logger is not None
        ml = self.logger.mllog
        weight_p, compute_p = self._precision_names()
        if self.start_step == 0:
            for key, value in (
                ("submission_benchmark", "ida_sft"),
                ("submission_division", "open"),
                ("submission_org", "ida"),
                ("submission_platform", str(self.device)),
                ("submission_status", "research"),
            ):
                ml.event(key, value)
            ml.event("cache_clear", True)
            ml.start("init_start")
            ml.event("seed", cfg.train.seed)
            ml.event("global_batch_size", cfg.train.global_batch_size)
            ml.event("micro_batch_size", cfg.train.global_batch_size // cfg.parallel.microbatches)
            ml.event("gradient_accumulation_steps", cfg.parallel.microbatches)
            ml.event("max_sequence_length", cfg.data.max_len)
            ml.event("max_steps", cfg.train.steps)
            ml.event("opt_name", cfg.optim.name)
            ml.event("opt_base_learning_rate", cfg.optim.lr)
            ml.event("opt_end_learning_rate", cfg.optim.lr * cfg.optim.min_lr_ratio)
            ml.event("opt_learning_rate_warmup_steps", cfg.optim.warmup_steps)
            ml.event("opt_gradient_clip_norm", cfg.optim.grad_clip)
            ml.event("opt_weight_decay", cfg.optim.weight_decay)
            ml.event("weight_precision", weight_p)
            ml.event("compute_precision", compute_p)
            ml.event("lowest_numerical_precision_in_linear", compute_p)
            ml.event("lowest_numerical_precision_in_attn", "bfloat16")
            ml.event("lowest_numerical_precision_in_comm", "bfloat16")
            ml.event("master_writeback", cfg.precision.writeback if cfg.precision.recipe == "nvfp4" else "fp32")
            ml.event("tensor_parallelism", 1)
            ml.event("pipeline_parallelism", cfg.parallel.pipeline_stages)
            ml.event("context_parallelism", 1)
            ml.event("expert_parallelism", 1)
            ml.event("config_filename", "config.toml")
            ml.event("train_samples", self.data_stats.num_examples)
            ml.end("init_stop")
            ml.start("run_start")
        else:
            ml.event("resume", str(self.resumed_from), {"step_num": self.start_step})
        self._say(
            f"ida_trainer: {self.num_params / 1e6:.2f}M parameters, recipe {cfg.precision.recipe} "
            f"(weights {weight_p}, compute {compute_p}"
            f"{', write-back ' + cfg.precision.writeback if cfg.precision.recipe == 'nvfp4' else ''}), "
            f"optimizer {cfg.optim.name}, backend {self._backend()}"
        )
        s = self.data_stats
        self._say(
            f"data: {s.num_examples} examples from {s.num_lines} lines of {self._data_path()} "
            f"({cfg.data.format}), {s.num_rows} rows, {s.num_targets} supervised tokens; "
            f"truncated {s.num_truncated}, dropped {s.num_dropped}"
        )
        if self.untrained.reinitialised:
            self._say(
                f"untrained embedding rows re-initialised (mean of trained rows + noise): "
                f"{dict(zip(self.untrained.reinitialised, self.untrained.tokens, strict=True))}"
            )
        elif self.start_step == 0:
            self._say("special tokens: no untrained (duplicate or near-zero) embedding rows among used tokens")

    @staticmethod
    def _backend() -> str:
        try:
            import nvfp4_cuda

            return str(nvfp4_cuda.backend_info().get("backend"))
        except (ImportError, OSError, RuntimeError, ValueError) as err:  # informative only: never fail a run on it
            return f"unknown ({err})"

    # ---------------------------------------------------------------------------------------------
    # loop

    def _step(self, step: int, batch: StepBatch) -> dict[str, Any]:
        cfg = self.cfg
        assert self.optimizer is not None
        lr = lr_at(step, cfg.optim, cfg.train.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        t0 = time.perf_counter()
        loss = self.engine.forward_backward(batch.microbatches, batch.global_valid_tokens)
        if self._dp_size > 1:  # each data-parallel rank returned its share of the step's token-mean loss
            import torch.distributed as dist

            total = torch.tensor(loss, dtype=torch.float64, device=self.device)
            dist.all_reduce(total)
            loss = float(total)
        if not math.isfinite(loss):
            raise NonFiniteError(
                f"loss is {loss} at step {step + 1}; the batch held {len(batch.sources)} examples: "
                f"{', '.join(batch.sources[:8])}{' ...' if len(batch.sources) > 8 else ''}"
            )
        norm = grad_norm_and_clip(self.engine.parameters(), cfg.optim.grad_clip, group=self._pipeline_group)
        if not math.isfinite(norm):
            raise NonFiniteError(
                f"gradient norm is {norm} at step {step + 1} (loss {loss:.4f}); the batch held "
                f"{', '.join(batch.sources[:8])}"
            )
        watch = self._movement is not None and is_console_step(step + 1, cfg.train.log_every, cfg.train.steps)
        if watch:
            self._movement.before()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        moved = self._master_moved(lr) if watch else {}
        dt = time.perf_counter() - t0
        return {
            **moved,
            "step": step + 1,
            "loss": loss,
            "grad_norm": norm,
            "lr": lr,
            "tokens_per_s": batch.num_tokens / dt,
            "mem_gib": peak_memory_gib(),
            "step_time_s": dt,
            "valid_tokens": batch.global_valid_tokens,
            "samples": (step + 1) * cfg.train.global_batch_size,
        }

    def _master_moved(self, lr: float) -> dict[str, float | None]:
        """The nvfp4 recipe's ``master_moved`` and ``master_step_kept`` of this step, over every pipeline
        stage's masters (:mod:`ida_trainer.movement`), measured on the console's steps only: two gathers per
        master and a copy to the host, some milliseconds of a GPU step's time (estimated, not measured)."""
        changed, watched, change = self._movement.moved()
        if self._pipeline_group is not None:
            import torch.distributed as dist

            counts = torch.tensor([changed, watched, change], dtype=torch.float64, device=self.device)
            dist.all_reduce(counts, group=self._pipeline_group)
            changed, watched, change = int(counts[0]), int(counts[1]), float(counts[2])
        return {
            "master_moved": changed / watched if watched else 0.0,
            "master_step_kept": change / (watched * lr) if watched and lr > 0 else None,
        }

    def train(self) -> dict[str, Any]:
        """Run the remaining steps, checkpoint, export and evaluate; returns the report (also ``report.json``)."""
        cfg = self.cfg
        assert self.logger is not None and self.batcher is not None
        t_start = time.perf_counter()
        records: list[dict[str, Any]] = []
        final_ckpt: Path | None = None
        status = "aborted"
        try:
            for step in range(self.start_step, cfg.train.steps):
                batch = self.batcher.next_step()
                rec = self._step(step, batch)
                records.append(rec)
                self.logger.log_step(rec)
                done = step + 1
                if cfg.eval.every and done % cfg.eval.every == 0 and done < cfg.train.steps:
                    self.evaluate(done)
                if (cfg.checkpoint.every and done % cfg.checkpoint.every == 0) or done == cfg.train.steps:
                    final_ckpt = self.save(done)
            status = "success"
        finally:
            self.logger.mllog.end(
                "run_stop", None, {"status": status, "samples_count": cfg.train.steps * cfg.train.global_batch_size}
            )
        self.logger.close()
        if final_ckpt is None:
            final_ckpt = ckpt.latest_checkpoint(self.ckpt_root)
        export: dict[str, Any] = {}
        if cfg.checkpoint.export and final_ckpt is not None and self.is_main:
            export_dir = self.out / "export"
            manifest = ckpt.export_checkpoint(
                final_ckpt, export_dir, rename=ckpt.parse_prefix_mapping(cfg.checkpoint.export_prefix)
            )
            export = {
                "dir": str(export_dir),
                "data_sha256": manifest["data_sha256"],
                "num_tensors": len(manifest["tensors"]),
            }
            self._say(
                f"export: {final_ckpt} -> {export_dir} (header-only rename, {export['num_tensors']} tensors "
                f"sha256-checked, data sha256 {manifest['data_sha256'][:16]}...)"
            )
        final_eval = None
        if cfg.eval.final and self.is_main and final_ckpt is not None:
            final_eval = self.evaluate(cfg.train.steps, checkpoint_dir=Path(export.get("dir", final_ckpt)))
            if cfg.is_demo and final_eval is not None:
                from ida_eval.analysis import format_pass_at_1

                score = format_pass_at_1(int(final_eval.get("passed") or 0), int(final_eval.get("n_tasks") or 0))
                self._say(f"demo: pass@1 {score} on problems whose solutions are in the training corpus. {DEMO_NOTE}")
        return self._report(records, time.perf_counter() - t_start, final_ckpt, export, final_eval)

    def _report(
        self,
        records: list[dict[str, Any]],
        wall: float,
        final_ckpt: Path | None,
        export: dict[str, Any],
        final_eval: dict[str, Any] | None,
    ) -> dict[str, Any]:
        assert self.logger is not None
        cfg = self.cfg
        losses = self.logger.losses
        weight_p, compute_p = self._precision_names()
        report = {
            "demo": cfg.is_demo,
            "note": DEMO_NOTE if cfg.is_demo else "",
            "steps": cfg.train.steps,
            "resumed_from": str(self.resumed_from) if self.resumed_from else None,
            "run_id": self.run_id,
            "first_loss": losses[0][1] if losses else None,
            "final_loss": losses[-1][1] if losses else None,
            "mean_tokens_per_s": (sum(r["tokens_per_s"] for r in records) / len(records)) if records else None,
            "peak_mem_gib": peak_memory_gib(),
            "wall_s": wall,
            "precision": {
                "recipe": cfg.precision.recipe,
                "weight_precision": weight_p,
                "compute_precision": compute_p,
                "writeback": cfg.precision.writeback,
                "backend": self._backend(),
                **_mean_movement(records),
            },
            "data": vars(self.data_stats),
            "untrained_tokens": {"reinitialised": self.untrained.reinitialised, "tokens": self.untrained.tokens},
            "checkpoint": str(final_ckpt) if final_ckpt else None,
            "export": export,
            "evals": self.evals,
            "final_eval": final_eval,
            "config_digest": config_digest(cfg),
        }
        if self.is_main:
            self.logger.write_report(report)
            self.logger.plot_loss(
                title=f"ida_trainer {cfg.precision.recipe} ({cfg.optim.name}, lr {cfg.optim.lr:g})"
                + (" - demo" if cfg.is_demo else "")
            )
            self._say(f"report: {self.out / 'report.json'}, loss curve: {self.out / 'loss.png'}")
        return report

    # ---------------------------------------------------------------------------------------------
    # checkpoints and eval

    def save(self, step: int) -> Path | None:
        """Write ``checkpoints/ckpt-<step>`` (rank 0 writes and says where, how big, how long; every rank must
        call it)."""
        cfg = self.cfg
        t0 = time.perf_counter()
        with self._checkpoint_contents() as contents:
            if contents is None:
                return None
            tensors, optimizer_state, optimizer_fetch = contents
            assert self.batcher is not None
            weight_p, compute_p = self._precision_names()
            metadata = {
                "producer": "ida_trainer",
                "recipe": cfg.precision.recipe,
                "writeback": cfg.precision.writeback,
                "weight_precision": weight_p,
                "compute_precision": compute_p,
                "step": str(step),
                "base_model": cfg.model.base or "demo",
                "config_digest": config_digest(cfg),
            }
            state = {
                "step": step,
                "data_cursor": self.batcher.state_dict(),
                "rng": ckpt.rng_state(),
                "config_digest": config_digest(cfg),
                "computation_digest": config_digest(cfg, any_stages=True),  # what --resume compares
                "evals": self.evals,
                "run_id": self.run_id,
            }
            path = ckpt.save_checkpoint(
                self.ckpt_root,
                step,
                tensors=tensors,
                model_config=self.model.config,
                generation_config=self.model.generation_config,
                tokenizer=self.tokenizer,
                optimizer_state=optimizer_state,
                optimizer_fetch=optimizer_fetch,
                trainer_state=state,
                metadata=metadata,
                keep=cfg.checkpoint.keep,
            )
        size = sum(f.stat().st_size for f in path.iterdir())
        shown = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
        self._say(f"checkpoint: {path} ({shown} in {time.perf_counter() - t0:.1f} s)")
        return path

    def _checkpoint_contents(self) -> AbstractContextManager[tuple[Any, Any, Any] | None]:
        """``(tensors, optimizer_state, optimizer_fetch)`` for ``save_checkpoint`` on rank 0, None elsewhere (a
        collective). Streamed, one tensor at a time, in parallel runs: FSDP2 gathers each full tensor
        (:func:`ida_trainer.checkpoint.streamed_state`), a pipeline stage sends each of its tensors
        (:meth:`ida_trainer.distributed.PipelineEngine.streamed_state`); one process: the model's and optimizer's
        own tensors."""
        from ida_trainer.precision import export_state

        assert self.optimizer is not None
        if self.cfg.parallel.data_parallel == "fsdp":
            return ckpt.streamed_state(self.model, self.optimizer, main=self.is_main)
        streamed = getattr(self.engine, "streamed_state", None)
        if streamed is not None:
            return streamed(self.optimizer)
        return nullcontext((export_state(self.model), self.optimizer.state_dict(), None))

    def _problems_path(self) -> Path:
        from ida_trainer.demo import problems_path

        return Path(self.cfg.eval.problems) if self.cfg.eval.problems else problems_path()

    def evaluate(self, step: int, *, checkpoint_dir: Path | None = None) -> dict[str, Any] | None:
        """Score the current weights with ``ida_eval`` and log pass@1 and the degenerate-output count.

        Single process: the live model generates (``ida_eval.harness.evaluate_model``). With a pipeline or
        FSDP no rank holds the whole model, so every rank writes the step's checkpoint and rank 0 scores it
        through the checkpoint loader (``evaluate_checkpoint``), as it does for the final export.
        """
        cfg = self.cfg
        distributed = cfg.parallel.pipeline_stages > 1 or cfg.parallel.data_parallel == "fsdp"
        if checkpoint_dir is None and distributed:
            checkpoint_dir = self.save(step)
        if not self.is_main:
            return None
        from ida_eval import harness

        limit = cfg.eval.num_problems or None
        out_dir = self.out / "eval" / (f"step-{step:06d}" + ("-checkpoint" if checkpoint_dir else ""))
        if checkpoint_dir is not None:
            summary = harness.evaluate_checkpoint(
                checkpoint_dir,
                problems_path=self._problems_path(),
                out_dir=out_dir,
                batch_size=cfg.eval.batch_size,
                max_new_tokens=cfg.eval.max_new_tokens,
                limit=limit,
                progress=cfg.train.progress,
            )
        else:
            was_training = self.model.training
            self.model.eval()
            try:
                with torch.no_grad():
                    summary = harness.evaluate_model(
                        self.model,
                        self.tokenizer,
                        self._problems_path(),
                        out_dir,
                        batch_size=cfg.eval.batch_size,
                        max_new_tokens=cfg.eval.max_new_tokens,
                        limit=limit,
                        progress=cfg.train.progress,
                    )
            finally:
                self.model.train(was_training)
        rec = {
            "step": step,
            "pass@1": summary.get("pass@1"),
            "num_degenerate": _num_degenerate(summary),
            "num_problems": summary.get("n_tasks"),
            "passed": summary.get("passed"),
            "out_dir": str(out_dir),
            "checkpoint": str(checkpoint_dir) if checkpoint_dir else None,
        }
        self.evals.append(rec)
        assert self.logger is not None
        self.logger.log_eval(step, rec, samples_count=step * cfg.train.global_batch_size)
        return summary

    def close(self) -> None:
        """Release the progress bar and the process group."""
        if self.logger is not None:
            self.logger.close()
        closer = getattr(self.engine, "close", None)
        if closer is not None:
            closer()
        if self.dist is not None and getattr(self.dist, "world_size", 1) > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def _mean_movement(records: list[dict[str, Any]]) -> dict[str, float]:
    """``master_moved`` and ``master_step_kept`` averaged over the steps that measured them (the nvfp4
    recipe's console steps; a step without a learning rate has no ``master_step_kept``)."""
    out = {}
    for key in ("master_moved", "master_step_kept"):
        values = [r[key] for r in records if r.get(key) is not None]
        if values:
            out[f"mean_{key}"] = sum(values) / len(values)
    return out


def _num_degenerate(summary: dict[str, Any]) -> int | None:
    counts = summary.get("counts")
    if isinstance(counts, dict) and isinstance(counts.get("degenerate"), int):
        return counts["degenerate"]
    return None


def run(cfg: JobConfig) -> dict[str, Any]:
    """Run one training job end to end and return its report.

    Example:
        >>> from ida_trainer.cli import parse_args
        >>> report = run(parse_args(["--steps", "3", "--out", "/tmp/ida_run"]))  # doctest: +SKIP
    """
    trainer = Trainer(cfg)
    try:
        trainer.setup()
        return trainer.train()
    finally:
        trainer.close()
