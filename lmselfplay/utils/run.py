"""What every recipe run shares: its run-level flags and one run per output folder.

* :class:`RunConfig` — the run's config (one part of a recipe's configs), its fields declared
  once: ``output_dir``, ``seed`` (the one seed every random draw of the run derives from: the
  recipe hands it to each component that draws), ``resume``, ``tensorboard``, ``resume_fallback``
  (read by :class:`Run`'s fresh-vs-resume decision), ``collective_timeout_s`` (how long a rank
  waits in a collective for a dead peer before it fails) and ``overwrite_output_dir``; :class:`PeriodicCheckpoints`
  holds ``checkpoint_every`` for the recipes that checkpoint every N steps.
* :func:`claim_output_dir` — the one call at the start of every recipe's ``main``. Its rules:
  an ``output_dir`` that is a file, or that cannot be created or written, is a one-line
  :class:`UserError`; a live run's folder is refused (the lock below); a fresh run (no
  ``--resume``) into a folder that holds anything is refused with a :class:`RunFolderTaken`
  that names what is there, so an earlier run's metrics and checkpoints are never mixed with
  or replaced by a new run's; ``--overwrite_output_dir true`` empties the folder first, and
  only a folder an earlier run made (it holds the lock file or ``metrics.jsonl``): any other
  folder is never emptied, and ``--resume`` into it is refused the same way, before anything
  is written there. The checks and the emptying happen on the main process only.
* :func:`lock_output_dir` — takes an exclusive
  ``flock`` on ``<output_dir>/.lmselfplay.lock`` (holding the pid) for the life of the
  process, on the main process only (global rank 0 under ``accelerate launch``). A second run
  on the same folder gets a :class:`RunLocked` naming the live run's pid. The kernel drops the
  lock when the process dies however it dies, so a killed run never blocks ``--resume``.
  Re-entrant within one process (a test calling ``main`` twice on one folder).
* :class:`Run` — the skeleton every recipe's ``main`` runs in (``with Run(args.run, ...) as run:``):
  process set-up, the folder claim, the fresh-vs-resume decision, ``config.json``, the
  metrics log, checkpoint timing, the atomic final model and the teardown (see its doc).
* :func:`check_resumed_config` — a resume compares the run's saved ``config.json`` with the
  new one (the flat dict of all the recipe's fields): every differing field is printed (``field: old -> new``), and a field
  the recipe fixes (:attr:`RunConfig.resume_fixed`'s rule) refuses the resume unless ``--resume_with_changes true``.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from lmselfplay.utils.checkpoint import checkpoint_dirs, newest_intact, save_json, save_model
from lmselfplay.utils.config import Config, ConfigError, config_dict, non_negative, positive
from lmselfplay.utils.errors import UserError
from lmselfplay.utils.metrics_logger import MetricsLogger

LOCK_FILE = ".lmselfplay.lock"
RUN_MARKS = (LOCK_FILE, "metrics.jsonl")  # a folder holding one of these was made by a run
_held: dict[Path, int] = {}  # resolved output_dir -> open lock fd (kept for the process's life)


@dataclass
class RunConfig(Config):
    """The run's own fields, declared here once for every recipe. A recipe names its default
    folder in its configs' defaults (``{"output_dir": "runs/<recipe>"}``); a class mixing this
    one in may name it with the class attribute ``run_name`` (``output_dir`` left empty:
    ``runs/<run_name>``).

    ``resume_fixed`` names the fields a resume may not change (without
    ``--resume_with_changes true``). The rule: a field is fixed when a new value would make the
    resumed run another run, i.e. when the checkpoint made under the old value would be read as
    if made under the new one — what is played or learned from (the games, the tasks, the data
    set), the model (which one, the shape of its adapters or network), and the size of a buffer
    the checkpoint holds (league, replay, bank, pool; a second model). Every other field — logging,
    evaluation, output, speed, threads, the schedule's length (``max_steps`` extends a run) — may
    change: the resume prints it and goes on. This class names the model's fields, which every
    recipe that loads a policy shares; each part of a recipe's configs names its own fixed fields
    in a ``resume_fixed`` of its own, and :meth:`Configs.fixed_on_resume
    <lmselfplay.utils.config.Configs.fixed_on_resume>` is their union, which the recipe hands to
    :class:`Run`. A name a config does not have is skipped."""

    _argument_group_name = "run (lmselfplay.utils.run.RunConfig)"
    run_name: ClassVar[str] = "run"
    resume_fixed: ClassVar[frozenset[str]] = frozenset({"model_name_or_path", "use_lora", "lora_r",
                                                        "lora_target_modules"})
    output_dir: str = field(default="", metadata={
        "help": "run folder: metrics, curves, checkpoints, final model (default: runs/<recipe>)"})
    seed: int = field(default=0, metadata={
        "help": "the run's seed: its sampling, tasks and data, search noise, initial weights and the trainer's "
                "micro-batch shuffling all derive from it"})
    resume: bool = field(default=False, metadata={"help": "continue from the latest checkpoint in output_dir"})
    tensorboard: bool = field(default=True, metadata={"help": "also log the metrics to TensorBoard"})
    resume_fallback: bool = field(default=True, metadata={
        "help": "--resume: when the newest checkpoint is damaged, continue from the newest intact one "
                "(false: stop with an error)"})
    collective_timeout_s: int = field(default=900, metadata={
        "help": "multi-process runs: seconds a rank waits in a collective for the others before it fails"})
    overwrite_output_dir: bool = field(default=False, metadata={
        "help": "a fresh run into a folder that holds an earlier run: delete that run's files first "
                "(false: stop with an error; --resume continues the earlier run instead)"})
    resume_with_changes: bool = field(default=False, metadata={
        "help": "--resume: continue also when a field that changes what the run means (the games, the model, the "
                "size of a saved buffer) differs from the saved config (false: stop with an error naming it)"})

    def validate(self) -> None:
        if not self.output_dir:
            self.output_dir = f"runs/{self.run_name}"
        positive(self, "collective_timeout_s")


@dataclass
class PeriodicCheckpoints(Config):
    """A part beside :class:`RunConfig` for the recipes that checkpoint every N steps (its
    ``checkpoint_every`` goes to :class:`Run`, read by :meth:`Run.checkpoint_due`); recipes that
    checkpoint once per iteration or phase (SPIN, R-Zero) do not take it, so the flag is never
    accepted and then ignored."""

    _argument_group_name = "checkpoints (lmselfplay.utils.run.PeriodicCheckpoints)"
    renamed_keys: ClassVar[dict[str, str]] = {"save_every": "checkpoint_every"}
    checkpoint_every: int = field(default=10, metadata={
        "help": "steps (iterations) between checkpoints (0: none; the iteration recipes also save the last one)"})

    def validate(self) -> None:
        non_negative(self, "checkpoint_every")


class RunLocked(UserError):
    """Another live run holds this output folder."""


class RunFolderTaken(ConfigError):
    """A fresh run into a folder that already holds files (an output_dir only ``--resume`` or
    ``--overwrite_output_dir`` can use)."""


def is_main_rank() -> bool:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) or 0) == 0


def claim_output_dir(cfg: Any) -> Path:
    """Check, lock and (with ``overwrite_output_dir``) empty ``cfg.output_dir`` for this run
    (see the module doc); returns it as a Path. ``cfg`` has ``output_dir``, ``resume`` and
    :class:`RunConfig`'s fields."""
    out = Path(cfg.output_dir)
    overwrite = cfg.overwrite_output_dir
    if cfg.resume and overwrite:
        raise ConfigError("resume and overwrite_output_dir exclude each other: --resume continues the run "
                          f"in {out}, --overwrite_output_dir deletes it")
    if not is_main_rank():
        return out
    names = _entries(out)
    made_by_a_run = any(m in names for m in RUN_MARKS)
    if LOCK_FILE in names:
        lock_output_dir(out)  # a live run's folder: refused before anything else is said
    left = sorted(n for n in names if n != LOCK_FILE)
    shown = ", ".join(left[:4]) + (f" and {len(left) - 4} more" if len(left) > 4 else "")
    if left and cfg.resume and not made_by_a_run:
        raise RunFolderTaken(f"{out} holds files that no run made ({shown}); --resume only continues a run of "
                             f"this project: choose another output_dir")
    if left and not cfg.resume:
        if not overwrite:
            raise RunFolderTaken(f"{out} already holds files ({shown}): --resume true continues that run, "
                                 f"--overwrite_output_dir true deletes it first, or choose another output_dir")
        if not made_by_a_run:
            raise RunFolderTaken(f"{out} holds files that no run made ({shown}); --overwrite_output_dir only "
                                 f"empties a run's folder: choose another output_dir")
        _empty(out, left)
    lock_output_dir(out)
    return out


def _entries(out: Path) -> set[str]:
    """The names in ``out`` (none when it does not exist yet); a file or an unreadable
    folder is a one-line error."""
    if out.exists() and not out.is_dir():
        raise UserError(f"output_dir {out} is a file, not a folder: choose another output_dir")
    try:
        return set(os.listdir(out)) if out.exists() else set()
    except OSError as e:
        raise UserError(f"cannot read output_dir {out}: {e.strerror or e}") from None


def _empty(out: Path, names: list[str]) -> None:
    for name in names:
        p = out / name
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except OSError as e:
            raise UserError(f"--overwrite_output_dir: cannot delete {p}: {e.strerror or e}") from None


def lock_output_dir(output_dir: str | Path) -> Path | None:
    """Hold ``output_dir`` for this run (see the module doc). Returns the lock file's path,
    None on other ranks or where ``fcntl`` is missing (Windows)."""
    try:
        import fcntl
    except ImportError:
        return None
    if not is_main_rank():
        return None
    out = Path(output_dir)
    key = out.resolve()
    if key in _held:
        return key / LOCK_FILE
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied (the folder is not writable)")
        fd = os.open(key / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        what = "is a file, not a folder" if isinstance(e, (FileExistsError, NotADirectoryError)) else \
            f"cannot be written: {e.strerror or e}"
        raise UserError(f"output_dir {out} {what}: choose another output_dir or fix its permissions") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunLocked(f"{out} is in use by a live run (pid {pid}); wait for it to finish, stop it "
                        f"(kill {pid}), or choose another output_dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[key] = fd
    return key / LOCK_FILE


def release_output_dir(output_dir: str | Path) -> None:
    """Let go of ``output_dir`` before the process ends (closing the fd drops the flock)."""
    fd = _held.pop(Path(output_dir).resolve(), None)
    if fd is not None:
        os.close(fd)


# --- a resume's config -----------------------------------------------------------------------

RESUME_ITSELF = ("resume", "resume_with_changes", "resume_fallback", "overwrite_output_dir")  # how, not what


def config_changes(saved: dict[str, Any], config: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{field: (saved value, new value)} for every field of ``config`` (the flat dict of the
    recipe's fields) and of ``saved`` whose value differs, compared as ``config.json`` stores
    them; the fields that say how the run is resumed (:data:`RESUME_ITSELF`) are not compared. A
    field one side lacks is ``"(absent)"``."""
    new = json.loads(json.dumps(config, default=str))
    names = list(new) + [k for k in saved if k not in new]
    return {k: (saved.get(k, "(absent)"), new.get(k, "(absent)")) for k in names
            if k not in RESUME_ITSELF and saved.get(k, "(absent)") != new.get(k, "(absent)")}


def read_run_config(path: Path) -> dict[str, Any]:
    """The run config saved at ``path``; a damaged one (unreadable, not JSON, not a mapping)
    is a one-line ConfigError naming the file."""
    try:
        data = json.loads(path.read_bytes())
    except OSError as e:
        raise ConfigError(f"--resume: cannot read the run's config {path}: {e.strerror or e}") from None
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"--resume: the run's config {path} is damaged (not JSON: {' '.join(str(e).split())[:100]}); "
                          "restore it, or start in another output_dir") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--resume: the run's config {path} is damaged (a {type(data).__name__}, not a mapping of "
                          "fields); restore it, or start in another output_dir")
    return data


def check_nothing_to_resume(out: Path) -> None:
    """``--resume`` found no checkpoint in ``out``: fine for an empty (or new) folder, where the
    run starts fresh; a folder that holds a run's results is refused in one line (a finished
    run saved with ``checkpoint_every 0``, or one killed before its first checkpoint): starting
    fresh there would replace them."""
    left = sorted(set(_entries(out)) - {LOCK_FILE})
    if not left:
        return
    shown = ", ".join(left[:4]) + (f" and {len(left) - 4} more" if len(left) > 4 else "")
    what = "a finished run" if any(n.startswith("final") for n in left) else "a run's results"
    raise RunFolderTaken(f"--resume: {out} holds {what} ({shown}) but no checkpoint to continue from, so there is "
                         f"nothing to resume; --overwrite_output_dir true runs it again from the start, or choose "
                         f"another output_dir")


def check_resumed_config(cfg: RunConfig, config: dict[str, Any], out: Path, say: Callable[[str], None],
                         fixed: Collection[str]) -> None:
    """A resume's config (``config``, the flat dict of the recipe's fields) against the one the
    run saved (``out/config.json``, written by the last start): each differing field is said as
    ``field: old -> new``; when one of them is in ``fixed`` (:class:`RunConfig`'s rule), a
    one-line ConfigError naming them, unless ``cfg.resume_with_changes``. Nothing is said when
    nothing differs or nothing was saved."""
    path = out / "config.json"
    if not path.is_file():
        return
    changes = config_changes(read_run_config(path), config)
    if not changes:
        return
    say(f"--resume: the config differs from the saved one ({path}):")
    for name, (old, new) in changes.items():
        say(f"{name}: {old!r} -> {new!r}")
    changed = [name for name in changes if name in fixed]
    if changed and not cfg.resume_with_changes:
        raise ConfigError(f"--resume: {', '.join(changed)} changed since the run was saved, which changes what the run "
                          "means: resume with the saved values, choose another output_dir, or pass "
                          "--resume_with_changes true")


# --- the run skeleton -------------------------------------------------------------------------

def make_accelerator(gradient_accumulation_steps: int = 1, timeout_s: float | None = None):
    """An Accelerator; on CPU with several processes the process group is gloo (NCCL
    needs GPUs). A single process gets no process group at all. ``timeout_s`` (the recipes'
    ``collective_timeout_s``) bounds how long a rank waits in a collective for a peer that
    died: it then fails with an error instead of hanging.

    Under ``accelerate launch`` (torchrun) on a machine without CUDA, accelerate finds no
    device and sets ``distributed_type`` NO unless ``cpu=True``: the ranks would then
    train unsynced copies. So several processes without CUDA get ``cpu=True``
    (``MULTI_CPU``, gloo), except under DeepSpeed, which runs on its CPU accelerator and
    needs its own process-group init (skipped by accelerate when ``cpu=True``)."""
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    pg: dict[str, Any] = {"timeout": datetime.timedelta(seconds=timeout_s)} if timeout_s else {}
    cpu = False
    if not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        pg["backend"] = "gloo"
        cpu = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true"
    handlers = [InitProcessGroupKwargs(**pg)] if pg else []
    return Accelerator(gradient_accumulation_steps=gradient_accumulation_steps, kwargs_handlers=handlers, cpu=cpu)


def process_state(timeout_s: float):
    """The processes of a run whose trainers make their own Accelerator (TRL's) or that
    train without one: accelerate's PartialState. ``cpu=True`` is what makes accelerate see
    a multi-process CPU launch (gloo) as distributed."""
    from accelerate import PartialState

    cpu = not torch.cuda.is_available() or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")
    return PartialState(cpu=cpu, timeout=datetime.timedelta(seconds=timeout_s))


class Run:
    """One recipe run, from process set-up to teardown:
    ``with Run(cfg.run, cfg.as_dict(), resume_fixed=cfg.fixed_on_resume(), checkpoint_every=...) as run: ...``.

    Rules:

    * Built from its own :class:`RunConfig` (``cfg``); what it needs from the rest of the recipe
      is passed: ``config``, the flat dict of all the recipe's fields (``config.json``, compared on
      a resume; default: ``cfg``'s own), ``resume_fixed``, the fields of ``config`` a resume may
      not change (the recipe's ``cfg.fixed_on_resume()``; default: ``cfg``'s class's
      ``resume_fixed``), ``gradient_accumulation_steps`` (the trainer's, for the accelerator) and
      ``checkpoint_every`` (:class:`PeriodicCheckpoints`'; 0: none).

    * Process set-up, one way: ``trains_with="accelerator"`` (the recipes whose
      ``PolicyTrainer`` shares it) makes ``run.acc`` with :func:`make_accelerator`;
      ``"state"`` (TRL's trainers, which make their own Accelerator, or plain torch) makes a
      PartialState with :func:`process_state`. Either has ``is_main_process``,
      ``process_index``, ``device``, ``print`` and ``wait_for_everyone``.
    * The folder is claimed (:func:`claim_output_dir`) once the process is set up, so a
      recipe checks its config before it builds the Run: a bad config never waits on a
      busy folder.
    * Fresh or resumed is decided here, once: ``run.checkpoint`` is the newest intact
      checkpoint (``checkpoints(output_dir)`` lists them, oldest first; default
      ``checkpoint-<step>``) when ``--resume`` finds one, else None; ``--resume`` without a
      checkpoint starts fresh only in an empty folder (:func:`check_nothing_to_resume`), unless
      the recipe's ``partial_progress(output_dir)`` says the folder holds work a resume continues
      from (SPIN's iteration data and DPO trainer checkpoints before its first ``checkpoint-<t>``).
      :meth:`report_start` says which, in the one wording. A resume from a checkpoint
      compares the config with the saved one first (:func:`check_resumed_config`).
    * :meth:`open_log` writes ``config.json`` and opens ``metrics.jsonl`` on the main
      process; :meth:`log` writes a row there (other processes: nothing).
    * :meth:`checkpoint_due` is the one use of ``checkpoint_every``; every checkpoint
      is written through :func:`lmselfplay.utils.checkpoint.commit_dir`.
    * :meth:`save_final_model` gathers the weights on every rank (ZeRO-3 shards) and saves
      them atomically on the main process.
    * At exit the resources handed to :meth:`closing` close (last first), the log closes
      and the process group goes (``end_training``), also on an exception; only a run that
      ends normally waits for the other ranks first (a failed peer would hang it).
    """

    def __init__(self, cfg: RunConfig, config: dict[str, Any] | None = None, *, gradient_accumulation_steps: int = 1,
                 checkpoint_every: int = 0, trains_with: str = "accelerator", resume_fixed: Collection[str] | None = None,
                 checkpoints: Callable[[Path], list[Path]] = checkpoint_dirs,
                 partial_progress: Callable[[Path], bool] | None = None):
        if trains_with not in ("accelerator", "state"):
            raise ValueError(f"trains_with must be accelerator or state, got {trains_with!r}")
        self.cfg = cfg
        self.config = config_dict(cfg) if config is None else config
        self.resume_fixed = type(cfg).resume_fixed if resume_fixed is None else frozenset(resume_fixed)
        self.checkpoint_every = checkpoint_every
        self.acc = make_accelerator(gradient_accumulation_steps, timeout_s=cfg.collective_timeout_s) \
            if trains_with == "accelerator" else process_state(cfg.collective_timeout_s)
        self.logger: MetricsLogger | None = None
        self._open: list[Any] = []
        try:
            self.out = claim_output_dir(cfg)
            self.checkpoint = newest_intact(checkpoints(self.out), self.out, cfg.resume_fallback) \
                if cfg.resume else None
            if cfg.resume and self.checkpoint is None and not (partial_progress and partial_progress(self.out)):
                check_nothing_to_resume(self.out)
            if self.checkpoint is not None:
                check_resumed_config(cfg, self.config, self.out, lambda line: self.acc.print(line, file=sys.stderr),
                                     self.resume_fixed)
        except BaseException:  # a refused folder or no intact checkpoint: no process group left behind
            self._end_processes()
            raise

    @property
    def is_main(self) -> bool:
        return self.acc.is_main_process

    def report_start(self, at: object, unit: str = "step") -> None:
        """Say where the run starts: resumed from ``run.checkpoint`` at ``unit`` ``at``, or fresh."""
        if self.checkpoint is not None:
            self.acc.print(f"resumed from {self.checkpoint} at {unit} {at}", file=sys.stderr)
        elif self.cfg.resume:
            self.acc.print(f"--resume: no checkpoint in {self.out}, starting fresh", file=sys.stderr)

    def resume_trainer(self, trainer: Any, restore: Callable[[dict[str, Any]], None]) -> int:
        """--resume: ``trainer``'s state from ``run.checkpoint`` (its ``load_checkpoint``) and
        the recipe's own state through ``restore(extra)``; the trainer step to go on from
        (0 for a fresh run). Nothing is read when there is no checkpoint."""
        if self.checkpoint is not None:
            restore(trainer.load_checkpoint(self.checkpoint))
        return trainer.step_count

    def open_log(self, resume_step: int | None) -> MetricsLogger | None:
        """``config.json`` and the metrics log, on the main process (None elsewhere).
        ``resume_step``: the step a resumed run continues from (later rows of the killed
        run are dropped), None for a fresh run."""
        if self.is_main:
            save_json(self.out / "config.json", self.config)
            self.logger = MetricsLogger(self.out, tensorboard=self.cfg.tensorboard, resume_step=resume_step)
        return self.logger

    def log(self, step: int, row: dict[str, Any]) -> None:
        if self.logger is not None:
            self.logger.log(step, row)

    def checkpoint_due(self, step: int, last: bool = False) -> bool:
        """Whether a checkpoint is written after ``step`` (every ``checkpoint_every``; with
        ``last``, also after the final step)."""
        every = self.checkpoint_every
        return bool(every and step % every == 0) or (last and every > 0)

    def save_final_model(self, model: Any, unwrapped: Any, tokenizer: Any, name: str = "final_model") -> Path:
        """``output_dir/name``: the weights of ``model`` (the trainer's wrapped model:
        every rank gathers), saved from ``unwrapped`` atomically by the main process."""
        state = self.acc.get_state_dict(model)  # accelerator runs only (trains_with="accelerator")
        if self.is_main:
            save_model(self.out / name, unwrapped, tokenizer, state)
        return self.out / name

    def closing(self, resource: Any) -> Any:
        """Close ``resource`` (anything with ``close()``) when the run ends; returns it."""
        self._open.append(resource)
        return resource

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            while self._open:
                resource = self._open.pop()
                if hasattr(resource, "close"):
                    resource.close()
            if self.logger is not None:
                self.logger.close()
            if exc_type is None:
                self.acc.wait_for_everyone()
        finally:
            self._end_processes()

    def _end_processes(self) -> None:
        if hasattr(self.acc, "end_training"):
            self.acc.end_training()
        else:
            self.acc.destroy_process_group()
