"""The in-process launcher: trains in this process, keeping its trainer between segments."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

from kgpipe.checkpoint import TrainState
from kgpipe.devices import resolve_device
from kgpipe.errors import RunError
from kgpipe.evaluation import ProgressFn
from kgpipe.launch.build import BuiltTrainer, build_trainer
from kgpipe.process import ThreadGovernor, configure
from kgpipe.runs.callbacks import MetricsWriter
from kgpipe.runs.folder import RunFolder, StagedData
from kgpipe.runs.segments import SegmentResult
from kgpipe.training.hooks import Callback

__all__ = ["InProcessLauncher"]


class InProcessLauncher:
    """Trains ``run`` in this process; ``callbacks`` and ``rank_callbacks`` both run next to the
    trainer here (the distinction matters on a gang)."""

    def __init__(
        self,
        run: RunFolder,
        *,
        callbacks: Sequence[Callback] = (),
        rank_callbacks: Sequence[Callback] = (),
        log: Callable[[str], None] | None = None,
        after: SegmentResult | None = None,
    ) -> None:
        self.run = run
        # say what trains when a trainer is built; a launcher that goes on ``after`` a segment
        # of the same command need not: the trainer is the same as before
        self.announce = after is None
        self.callbacks = list(callbacks)
        self.rank_callbacks = list(rank_callbacks)
        self.say = log or (lambda _msg: None)
        self.checkpoints = run.checkpoints()
        self.writer = MetricsWriter(run.store)
        self.governor: ThreadGovernor | None = None
        self._built: BuiltTrainer | None = None
        self._data: StagedData | None = None

    @property
    def restarts(self) -> int:
        return 0

    def test_split(self, progress: ProgressFn | None = None) -> None:
        """None: the model is in this process, where finish_run ranks the test split."""
        return None

    def train_until(self, until: int) -> SegmentResult:
        self._train(until)
        committed = self.checkpoints.committed()  # manifests only: no re-download of the state
        if not committed or committed[-1].epoch != until:
            raise RunError(f"{self.run.url}: training to epoch {until} left no checkpoint of it")
        ckpt = committed[-1]
        return SegmentResult(until, ckpt.url, list(ckpt.manifest["history"]), 0)

    def _train(self, until: int) -> None:
        built = self._built
        committed = self.checkpoints.committed() if built is not None else []
        new = built is None or not committed or committed[-1].epoch != built.trainer.epoch
        if new:
            latest = self.checkpoints.resume_point()
            built = self._build(latest[1] if latest else None, until)
            del latest  # copied into the tables and the optimiser: no second copy in training
        assert built is not None and built.saver is not None
        built.saver.until = until
        trainer = built.trainer
        if trainer.epoch >= until:
            return
        config = self.run.config
        steps = trainer.steps_per_epoch
        if new and self.announce:  # going on with the same trainer, there is nothing new
            self.say(
                f"training {config.model.name} (dim {config.model.dim}, "
                f"{'bf16' if trainer.bf16 else 'fp32'} scores) epochs "
                f"{trainer.epoch + 1}..{config.training.epochs}, "
                f"{steps} step{'' if steps == 1 else 's'} each -> {self.run.url}"
            )
        try:
            trainer.fit(until=until)
        except BaseException:
            with contextlib.suppress(Exception):  # the training error is the one to report
                self.close()
            raise

    def _build(self, state: TrainState | None, until: int) -> BuiltTrainer:
        config = self.run.config
        if self._data is None:
            self._data = self.run.staged()
        self.close()
        t = config.training
        configure(threads=t.threads, allocator=t.allocator, deterministic=t.deterministic)
        if t.threads is None and self.governor is None:
            self.governor = ThreadGovernor().start()
        built = build_trainer(
            self.run,
            self._data,
            device=resolve_device(t.device),
            until=until,
            recorder=self.writer,
            governor=self.governor,
            rank_callbacks=self.rank_callbacks,
            callbacks=self.callbacks,
            state=state,
        )
        self.writer.reset(built.trainer.history)
        self._built = built
        return built

    def close(self) -> None:
        """Finish a pending background checkpoint upload and release its thread."""
        if self._built is not None:
            built, self._built = self._built, None
            if built.saver is not None:
                built.saver.close()
