"""Distributed training on a real Dask LocalCluster with a gloo process group."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from kgpipe.config import parse_config
from kgpipe.distributed.client import open_cluster
from kgpipe.distributed.clusters import QUIET_WORKER_CONFIG, cluster_kwargs, worker_threads
from kgpipe.distributed.gang import GangError, live_workers, pick_workers
from kgpipe.errors import RunError
from kgpipe.pipeline import train
from kgpipe.training.hooks import Callback, NotInViewError, TrainerView
from kgpipe.training.records import EpochStats

BASE = {
    "run": {"seed": 3},
    "data": {"dataset": "umls"},
    "evaluation": {"test": False},
}


def _run(
    tmp_path: Path, name: str, rank_callbacks: list[Callback] | None = None, **sections: dict
) -> dict[str, torch.Tensor]:
    data = {**BASE, **sections, "run": {**BASE["run"], "root": str(tmp_path), "name": name}}
    train(parse_config(data), rank_callbacks=rank_callbacks or [])
    return load_file(tmp_path / name / "model.safetensors")


@pytest.mark.parametrize("model", ["transe", "complex"])
@pytest.mark.parametrize("exchange", ["dense", "sparse"])
def test_step_sync_equals_single_process(tmp_path: Path, model: str, exchange: str) -> None:
    """2 ranks with step-level sync end where one process ends (same global batch and seed)."""
    sections = {
        "model": {"name": model, "dim": 32, "init": "uniform", "init_scale": 0.1},
        "training": {"epochs": 2, "batch_size": 512, "negatives": 32, "chunk_size": 64,
                     "loss": "margin", "lr": 0.01},
    }  # fmt: skip
    single = _run(tmp_path, "single", **sections)
    gang = _run(
        tmp_path, "gang", **sections,
        distributed={"workers": 2, "sync": "step", "exchange": exchange},
    )  # fmt: skip
    for key in ("entity", "relation"):
        diff = (single[key] - gang[key]).abs().max().item()
        assert diff <= 1e-5, (key, diff)
    # and training did move the parameters
    init = _run(tmp_path, "init", **{**sections, "training": {**sections["training"], "epochs": 0}})
    assert (init["entity"] - gang["entity"]).abs().max() > 1e-3
    metrics = [
        json.loads(x) for x in (tmp_path / "gang" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["world_size"] for m in metrics] == [2, 2]
    assert all(m["bytes_sent"] > 0 and m["comm_seconds"] >= 0 for m in metrics)


def test_plateau_schedule_step_sync_equals_single_process(tmp_path: Path) -> None:
    """Under schedule=plateau every rank takes its rate from the validation history of the
    checkpoint its gang starts from (rank 0 alone validates): 2 ranks, in segments of two
    epochs, still end where one process ends, through a cut of the rate."""
    sections = {
        "model": {"name": "complex", "dim": 32, "init": "uniform", "init_scale": 0.1},
        "training": {"epochs": 5, "batch_size": 512, "negatives": 32, "chunk_size": 64,
                     "loss": "margin", "lr": 0.01, "schedule": "plateau",
                     "plateau": {"factor": 0.5, "patience": 0, "threshold": 10.0}},
        "evaluation": {"test": False, "every": 2, "sampled": 50},
    }  # fmt: skip
    single = _run(tmp_path, "single", **sections)
    gang = _run(tmp_path, "gang", **sections, distributed={"workers": 2, "sync": "step"})
    for key in ("entity", "relation"):
        diff = (single[key] - gang[key]).abs().max().item()
        assert diff <= 1e-5, (key, diff)
    for name in ("single", "gang"):
        rows = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(x)["lr"] for x in rows] == [0.01, 0.01, 0.01, 0.01, 0.005], name


@pytest.mark.parametrize("candidates", [None, 30])
def test_every_rank_of_a_gang_validates_its_share_of_the_entities(
    tmp_path: Path, candidates: int | None
) -> None:
    """Full filtered validation on a gang is split over its ranks (each scores its range of
    entities, the counts are all-reduced): with updates too small to change a value both runs
    validate the same model, and the gang's validation metrics are the single process's.
    Per-query candidates (`evaluation.candidates`) are cheap: rank 0 alone ranks them, with the
    same metrics as one process."""
    sections = {
        "model": {"name": "complex", "dim": 32, "init": "uniform", "init_scale": 0.1},
        # updates below float32's resolution: the model stays as initialised
        "training": {"epochs": 2, "batch_size": 512, "negatives": 8, "lr": 1e-30},
        "evaluation": {"test": False, "every": 1, "candidates": candidates},
    }  # fmt: skip
    from rank_callbacks import CountSplitRanking

    _run(tmp_path, "single", **sections)
    _run(tmp_path, "gang", **sections, distributed={"workers": 2, "sync": "epoch"},
         rank_callbacks=[CountSplitRanking(tmp_path)])  # fmt: skip
    split = [(tmp_path / f"split-{r}").read_text().split() for r in (0, 1)]
    if candidates is None:  # each rank scored blocks of its half of UMLS's 135 entities
        assert all(int(calls) > 0 and 0 < int(widest) <= 68 for calls, widest in split), split
    else:
        assert all(calls == "0" for calls, _ in split), split  # rank 0 ranked them alone
    rows = {
        name: [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        for name in ("single", "gang")
    }
    for key in ("valid_mrr", "valid_mr", "valid_hits@10"):
        one, two = [r[key] for r in rows["single"]], [r[key] for r in rows["gang"]]
        assert two == pytest.approx(one, rel=1e-9), key
    assert [r["valid_ranks"] for r in rows["gang"]] == ([1, 1] if candidates else [2, 2])
    assert [r["valid_ranks"] for r in rows["single"]] == [1, 1]
    want = f"per-query-{candidates}" if candidates else "all"
    assert [r["valid_candidates"] for r in rows["gang"]] == [want, want]


def test_cluster_spec_is_pure() -> None:
    cfg = parse_config({**BASE, "distributed": {"workers": 2}}).distributed
    kw = cluster_kwargs(cfg.workers)
    assert kw["n_workers"] == 2 and kw["threads_per_worker"] == 1 and kw["host"] == "127.0.0.1"
    assert worker_threads(cfg.workers, cfg.threads_per_worker, cores=8) == 4
    assert worker_threads(cfg.workers, cfg.threads_per_worker, cores=1) == 1
    assert worker_threads(cfg.workers, 3, cores=8) == 3


def _worker_setup() -> dict[str, object]:
    import dask
    import torch

    keys = [*QUIET_WORKER_CONFIG, "distributed.worker.profile.enabled"]
    return {
        "config": {k: dask.config.get(k) for k in keys},
        "malloc_trim": os.environ.get("MALLOC_TRIM_THRESHOLD_"),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "torch_threads": torch.get_num_threads(),
    }


def test_local_cluster_workers_are_set_up_for_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the worker processes of our LocalCluster actually run with: quiet event-loop
    housekeeping, no statistical profiler, malloc left alone, one torch thread share -- also
    after a plain Dask LocalCluster in this process, whose nanny wrote Dask's malloc setting
    into os.environ for good (every later worker inherited it: CI found it after a test
    started one)."""
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")  # what such a nanny leaves
    cfg = parse_config({**BASE, "distributed": {"workers": 2}}).distributed
    with open_cluster(cfg.cluster, workers=cfg.workers) as client:
        seen = client.run(_worker_setup)
    assert len(seen) == 2
    threads = worker_threads(cfg.workers, cfg.threads_per_worker)
    for got in seen.values():
        assert got["config"] == {**QUIET_WORKER_CONFIG, "distributed.worker.profile.enabled": False}
        assert got["malloc_trim"] is None
        assert got["omp"] == str(threads) and got["torch_threads"] == threads


def test_memory_limit_reaches_the_workers_dask_starts() -> None:
    from kgpipe.errors import ConfigError
    from kgpipe.launch.dask import open_run_cluster

    config = parse_config({**BASE, "distributed": {"workers": 2, "memory_limit": "1.5GiB"}})
    assert config.distributed.memory_limit_bytes == 3 * 2**29
    assert cluster_kwargs(2, 1000)["memory_limit"] == 1000
    assert "memory_limit" not in cluster_kwargs(2)  # Dask's default
    with open_run_cluster(config) as client:
        limits = [w["memory_limit"] for w in live_workers(client).values()]
    assert limits == [3 * 2**29] * 2
    for bad in ("lots", "-1GB", "0"):
        with pytest.raises(ConfigError, match=r"distributed\.memory_limit"):
            parse_config({**BASE, "distributed": {"workers": 2, "memory_limit": bad}})


def test_a_tls_scheduler_without_its_settings_is_one_line() -> None:
    """A tls:// address without Dask's TLS config was a TypeError traceback."""
    from kgpipe.errors import KgpipeError

    failing = pytest.raises(KgpipeError, match=r"scheduler tls://127\.0\.0\.1:1: TLS expects")
    with failing, open_cluster("tls://127.0.0.1:1", workers=1):
        pass


def test_the_workers_are_asked_of_the_scheduler_not_read_from_a_racing_cache() -> None:
    """``Client.scheduler_info()`` returns a cache that the client's periodic refresh replaces
    with an answer listing no worker; a CI run read it mid-refresh and launched a gang of 0
    ranks. With the refresh every millisecond, every read here must still see both workers."""
    import dask

    from kgpipe.errors import KgpipeError

    with (
        dask.config.set({"distributed.client.scheduler-info-interval": "1ms"}),
        open_cluster("local", workers=2, threads_per_worker=1) as client,
    ):
        for _ in range(200):
            assert len(live_workers(client)) == 2
            assert len(pick_workers(client, 2)) == 2
        with pytest.raises(KgpipeError, match="at least one worker"):
            pick_workers(client, 0)
        with pytest.raises(GangError, match="has 2 workers, the gang needs 3") as err:
            pick_workers(client, 3)  # one left after the gang was sized: relaunched
        assert err.value.retryable


def test_a_scheduler_that_does_not_answer_skips_a_poll_and_is_named_elsewhere() -> None:
    """A poll of the gang's workers that the scheduler does not answer is skipped (no rank is
    declared dead for it); a read outside the polls fails naming the scheduler."""
    from kgpipe.distributed import gang
    from kgpipe.errors import KgpipeError

    class _Unreachable:  # a client whose scheduler connection is closed
        class scheduler:  # the attribute Client has: an rpc to the scheduler
            address = "tcp://127.0.0.1:1"
            identity = None

        def sync(self, *args: object, **kwargs: object) -> object:
            raise OSError("connection closed")

    client: Any = _Unreachable()
    assert gang._polled(client) is None
    assert gang._dead_rank(client, ["tcp://127.0.0.1:2"], poll_s=0.0) is None
    with pytest.raises(KgpipeError, match=r"lost the Dask scheduler tcp://127\.0\.0\.1:1"):
        live_workers(client)


def _worker_pids() -> list[int]:
    """Dask nanny/worker processes started from this process (multiprocessing spawn children;
    multiprocessing's resource tracker lives as long as this process and is not counted)."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "spawn_main" in cmd:
            out.append(p.pid)
    return out


def test_killed_worker_fails_the_epoch_promptly_and_leaves_no_process(tmp_path: Path) -> None:
    """Without restarts allowed, a killed worker fails the run promptly, naming rank and worker."""

    class KillOnce(Callback):
        killed: int | None = None

        def on_batch_end(self, trainer, epoch, step, steps, loss):  # type: ignore[no-untyped-def]
            if self.killed is None and trainer.global_step >= 2:
                self.killed = _worker_pids()[-1]  # a worker process (nannies run in-process)
                os.kill(self.killed, signal.SIGKILL)

    killer = KillOnce()
    data = {
        **BASE,
        "run": {**BASE["run"], "root": str(tmp_path), "name": "killed"},
        "model": {"name": "complex", "dim": 64},
        "training": {"epochs": 50, "batch_size": 64, "mode": "1vsall", "loss": "cross_entropy"},
        "distributed": {"workers": 2, "timeout_s": 20},
        "fault_tolerance": {"max_restarts": 0},
    }
    t0 = time.monotonic()
    with pytest.raises(RunError) as err:
        train(parse_config(data), callbacks=[killer])
    elapsed = time.monotonic() - t0
    assert killer.killed is not None
    assert "died" in str(err.value) and "tcp://127.0.0.1:" in str(err.value)
    assert "max_restarts" in str(err.value)
    assert elapsed < 60, elapsed
    deadline = time.monotonic() + 15
    while _worker_pids() and time.monotonic() < deadline:
        time.sleep(0.5)
    import psutil

    left = [" ".join(psutil.Process(p).cmdline())[:200] for p in _worker_pids()]
    assert left == []  # the cluster and all its processes are gone


REPO = Path(__file__).resolve().parents[1]


def _demo(tmp_path: Path, name: str, *overrides: str) -> tuple[float, list[dict]]:
    from kgpipe.config import load_config

    cfg = load_config(
        str(REPO / "configs" / "umls-complex.yaml"),
        [f"run.root={tmp_path}", f"run.name={name}", "evaluation.every=0", *overrides],
    )
    result = train(cfg)
    assert result.results is not None
    metrics = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return result.results["mrr"], metrics


@pytest.mark.slow
def test_epoch_sync_quality_and_compression_on_umls(tmp_path: Path) -> None:
    """Model averaging (epoch sync) and compressed exchanges keep UMLS test MRR within 0.02 of
    single-process training, and the compressed exchanges send fewer bytes."""
    single, _ = _demo(tmp_path, "single")
    epoch, m_epoch = _demo(tmp_path, "epoch", "distributed.workers=2", "distributed.sync=epoch")
    step, m_step = _demo(tmp_path, "step", "distributed.workers=2")
    int8, m_int8 = _demo(tmp_path, "int8", "distributed.workers=2", "distributed.compression=int8")
    topk, m_topk = _demo(tmp_path, "topk", "distributed.workers=2", "distributed.compression=topk")
    assert single >= 0.8
    for mrr in (epoch, step, int8, topk):
        assert abs(mrr - single) <= 0.02, (mrr, single)
    sent = {k: m[-1]["bytes_sent"] for k, m in
            {"step": m_step, "int8": m_int8, "topk": m_topk, "epoch": m_epoch}.items()}  # fmt: skip
    assert sent["int8"] < 0.3 * sent["step"] and sent["topk"] < 0.3 * sent["step"], sent
    assert sent["epoch"] < sent["step"], sent
    assert all(m["triples"] == 5216 for m in m_epoch)  # global triples, not one rank's


class _Seen(Callback):
    """Records what a driver-side callback is told of the gang's steps."""

    def __init__(self) -> None:
        self.starts: list[tuple[int, int, int]] = []
        self.steps: set[int] = set()
        self.last_step = 0

    def on_train_start(self, trainer: TrainerView) -> None:
        self.starts.append((trainer.steps_per_epoch, trainer.total_steps, trainer.world_size))

    def on_batch_end(
        self, trainer: TrainerView, epoch: int, step: int, steps: int, loss: float
    ) -> None:
        self.steps.add(steps)
        self.last_step = trainer.global_step


def test_the_gang_reports_the_steps_of_its_mode(tmp_path: Path) -> None:
    """KvsAll steps over (anchor, relation, side) queries, not over training triples: the
    driver's progress total is the trainer's own count, reported by rank 0 (it was computed
    from the number of training triples: 21 steps an epoch here instead of 7)."""
    from kgpipe.data.dataset import load_dataset
    from kgpipe.training.steps.kvsall import KvsAllIndex

    data = {
        **BASE,
        "run": {**BASE["run"], "root": str(tmp_path), "name": "kvsall"},
        "model": {"name": "distmult", "dim": 16},
        "training": {"epochs": 2, "batch_size": 256, "mode": "kvsall", "loss": "bce"},
        "distributed": {"workers": 2, "sync": "step"},
    }
    seen = _Seen()
    train(parse_config(data), callbacks=[seen])
    ds = load_dataset(parse_config(data).data)
    per_epoch = -(-len(KvsAllIndex(ds.train, ds.num_relations, False)) // 256)
    assert per_epoch != -(-ds.train.shape[0] // 256)  # the two counts differ here
    assert seen.starts == [(per_epoch, 2 * per_epoch, 2)]
    assert seen.steps == {per_epoch} and seen.last_step == 2 * per_epoch


def test_modes_that_need_every_triple_on_a_rank_are_refused_where_a_rank_has_a_part(
    tmp_path: Path,
) -> None:
    """Under epoch sync a rank trains on its shards of the triples: KvsAll's multi-hot targets
    then marked the answers other ranks held as false (on UMLS with 2 workers, 9,649 known
    answers against 10,432 true labels). Refused where a run starts or resumes, not where a
    config is read (a run finished before must still open). A sharded table cannot score every
    entity."""
    from kgpipe.errors import ConfigError
    from kgpipe.runs.stage import preflight

    def config(mode: str, **distributed: Any) -> Any:
        loss = "bce" if mode == "kvsall" else "cross_entropy"
        return parse_config({**BASE, "run": {"root": str(tmp_path), "name": mode},
                             "training": {"mode": mode, "loss": loss},
                             "distributed": distributed})  # fmt: skip

    refused = config("kvsall", workers=2, sync="epoch")  # read: as a finished run's would be
    with pytest.raises(ConfigError, match="answers held by other ranks would be trained as false"):
        preflight(refused)
    with pytest.raises(ConfigError, match="every rank would need the whole table"):
        config("1vsall", workers=2, strategy="sharded")
    for ok in (config("kvsall", workers=2, sync="step"),  # every rank holds every triple
               config("kvsall", workers=1, sync="epoch"),
               config("1vsall", workers=2, sync="epoch")):  # one query a triple  # fmt: skip
        preflight(ok)


class _ReadsTheModel(Callback):
    def on_epoch_end(self, trainer: TrainerView, stats: EpochStats) -> None:
        trainer.model  # type: ignore[attr-defined]  # noqa: B018


@pytest.mark.parametrize("workers", [1, 2])
def test_a_callback_reading_the_model_gets_a_clear_error_in_one_process_and_on_a_gang(
    tmp_path: Path, workers: int
) -> None:
    """Callbacks get a read-only view of training, the same in one process as on the driver of
    a gang (where the model lives on the ranks): reading the model is a clear error in both."""
    data = {
        **BASE,
        "run": {**BASE["run"], "root": str(tmp_path), "name": f"w{workers}"},
        "model": {"name": "distmult", "dim": 8},
        "training": {"epochs": 1, "batch_size": 1024, "negatives": 8, "chunk_size": 64},
        "distributed": {"workers": workers},
    }
    with pytest.raises(NotInViewError, match=r"trainer\.model is not available to callbacks"):
        train(parse_config(data), callbacks=[_ReadsTheModel()])


@pytest.mark.parametrize("workers", [1, 2])
def test_rank_callbacks_run_next_to_the_model(tmp_path: Path, workers: int) -> None:
    """What a driver-side callback may not read, a rank callback may: it runs on every rank
    (pickled to the workers of a gang) and its view has the model."""
    from rank_callbacks import RecordModel

    data = {
        **BASE,
        "run": {**BASE["run"], "root": str(tmp_path), "name": f"w{workers}"},
        "model": {"name": "distmult", "dim": 8},
        "training": {"epochs": 1, "batch_size": 1024, "negatives": 8, "chunk_size": 64},
        "distributed": {"workers": workers},
    }
    train(parse_config(data), rank_callbacks=[RecordModel(tmp_path)])
    seen = sorted(p.read_text() for p in tmp_path.glob("model-*"))
    assert seen == [f"{rank}:135x8" for rank in range(workers)]  # UMLS: 135 entities


def test_a_heartbeat_that_meets_a_closing_cluster_is_not_logged() -> None:
    """Once the driver has told the workers that it closes the cluster, a heartbeat failure is
    a normal shutdown (not Dask's 25-line CommClosedError traceback); before that it is logged."""
    import logging

    from kgpipe.distributed import client as dask_client

    record = logging.LogRecord(
        "distributed.worker", logging.ERROR, __file__, 1,
        "Failed to communicate with scheduler during heartbeat.", None, None,
    )  # fmt: skip
    quiet = dask_client._QuietClose()
    dask_client._closing.clear()
    try:
        assert quiet.filter(record)
        dask_client._cluster_closing()
        assert not quiet.filter(record)
    finally:
        dask_client._closing.clear()


def test_a_closing_workers_last_heartbeat_is_quiet_without_the_drivers_word() -> None:
    """Dask's Worker.close tears its plugins down before it stops heartbeating: the teardown
    took the quiet filter away, and a heartbeat already under way printed the traceback after
    a SIGTERM (CI, one run in many). A worker of a cluster kgpipe started now keeps it quiet
    once torn down, even when the driver's word that it closes did not arrive."""
    from types import SimpleNamespace

    from kgpipe.distributed import client as dask_client

    log = logging.getLogger("distributed.worker")
    record = logging.LogRecord(
        "distributed.worker", logging.ERROR, __file__, 1,
        "Failed to communicate with scheduler during heartbeat.", None, None,
    )  # fmt: skip
    worker = SimpleNamespace(state=SimpleNamespace(nthreads=1))
    filters = list(log.filters)
    threads, sigint = torch.get_num_threads(), signal.getsignal(signal.SIGINT)
    plugin = dask_client.TorchWorkerSetup(1, owned=True)
    dask_client._closing.clear()
    try:
        plugin.setup(worker)
        assert log.filter(record)  # while it trains, a failed heartbeat is logged
        plugin.teardown(worker)
        assert not log.filter(record)
        assert torch.get_num_threads() == threads  # the rest is put back as before
    finally:
        dask_client._closing.clear()
        for f in [f for f in log.filters if f not in filters]:
            log.removeFilter(f)
        dask_client._filters.clear()
        signal.signal(signal.SIGINT, sigint)


def test_a_segment_after_another_on_fewer_workers_is_quiet(tmp_path: Path) -> None:
    """The flow trains each segment with its own launcher: one going on after a segment that
    said the gang runs on fewer workers than configured does not say it again (it compared
    with the configured workers and repeated the line at every segment)."""
    from kgpipe.pipeline import make_launcher
    from kgpipe.runs.stage import prepare_run

    data = {**BASE, "run": {**BASE["run"], "root": str(tmp_path), "name": "fewer"},
            "model": {"name": "complex", "dim": 8}, "training": {"epochs": 2},
            "evaluation": {"test": False, "every": 1}, "distributed": {"workers": 2}}  # fmt: skip
    run = prepare_run(parse_config(data))
    said: list[str] = []
    with open_cluster("local", workers=1, threads_per_worker=1) as client:
        first = make_launcher(run, client=client, log=said.append).train_until(1)
        assert [s for s in said if "Dask worker(s)" in s] == [
            "epochs 1..2 on 1 Dask worker(s) (sync=step)"
        ], said
        assert first.announced == (1, 0, True)
        second = make_launcher(run, client=client, log=said.append, after=first)
        assert second.train_until(2).epoch == 2
    lines = [s for s in said if "Dask worker(s)" in s]
    assert lines == ["epochs 1..2 on 1 Dask worker(s) (sync=step)"], said


def test_a_diverged_gang_is_not_relaunched(tmp_path: Path) -> None:
    """A gang whose loss went to NaN fails once, with the reason: relaunching it from the
    checkpoint would diverge again."""
    data = {**BASE, "run": {**BASE["run"], "root": str(tmp_path), "name": "nan"},
            "model": {"name": "complex", "dim": 8}, "training": {"epochs": 2, "lr": 1e20},
            "distributed": {"workers": 2},
            "fault_tolerance": {"max_restarts": 3, "restart_backoff_s": 0.1}}  # fmt: skip
    from kgpipe.errors import Diverged

    with pytest.raises(Diverged, match="training diverged") as info:  # (a search prunes it)
        train(parse_config(data))
    assert "restart" not in str(info.value), info.value


def _trainers_alive() -> int:
    import gc

    from kgpipe.training.loop import Trainer

    return sum(isinstance(x, Trainer) for x in gc.get_objects())


def test_a_gang_leaves_no_trainer_in_its_workers(tmp_path: Path) -> None:
    """Each segment is a gang of its own: its trainer (model, optimiser state) is freed when
    its rank ends. It lived on in reference cycles until a rare full collection, one more
    per segment (0, 1, 2, 2, 3, 4, ... in a worker), until the memory check refused a gang."""
    from kgpipe.pipeline import make_launcher
    from kgpipe.runs.stage import prepare_run

    data = {**BASE, "run": {**BASE["run"], "root": str(tmp_path), "name": "freed"},
            "model": {"name": "complex", "dim": 8}, "training": {"epochs": 3},
            "evaluation": {"test": False, "every": 1}, "distributed": {"workers": 2}}  # fmt: skip
    run = prepare_run(parse_config(data))
    with open_cluster("local", workers=2, threads_per_worker=1) as client:
        for until in (1, 2, 3):
            make_launcher(run, client=client).train_until(until)
            assert set(client.run(_trainers_alive).values()) == {0}
        # nor a gang that failed: its traceback held the rank's frames, and so its trainer
        data["training"] = {"epochs": 4, "lr": 1e20}
        data["run"] = {**data["run"], "name": "failed"}
        failed = prepare_run(parse_config(data))
        with pytest.raises(RunError, match="diverged"):
            make_launcher(failed, client=client).train_until(4)
        assert set(client.run(_trainers_alive).values()) == {0}


def test_three_ranks_agree_on_how_to_exchange_a_step(tmp_path: Path) -> None:
    """`exchange: auto` chose dense or sparse per rank from the rows it touched, which differ
    by rank under negative sampling: at 3 ranks one went sparse while the others went dense,
    and gloo aborted its worker on the mismatched collective (each relaunch alike)."""
    data = {**BASE, "run": {**BASE["run"], "root": str(tmp_path), "name": "three"},
            "model": {"name": "complex", "dim": 16},
            "training": {"epochs": 1, "mode": "negative_sampling", "loss": "softplus"},
            "distributed": {"workers": 3, "exchange": "auto"},
            "fault_tolerance": {"max_restarts": 0}}  # fmt: skip
    result = train(parse_config(data))
    assert [s.epoch for s in result.history] == [1]


@pytest.mark.slow
def test_an_epoch_synchronised_gang_resumes_as_it_would_have_gone_on(tmp_path: Path) -> None:
    """Under sync: epoch ranks hold unequal shares and step unequally; each went on from its
    own global step, a resumed gang from rank 0's, so dropout masks and learning rates (and a
    run's outcome) changed with a resume (max |Δ| 0.22 in a longer run). Every rank now goes
    on from the largest count, as a resumed gang does. And the first epoch after the resume
    averages from the loaded tables, not the fresh ones (the same sum, rounded otherwise: 2e-10
    apart here, 6e-8 in a reviewer's probe): bit-identical."""
    sections: dict[str, Any] = {
        "model": {"name": "complex", "dim": 16, "dropout": {"entity": 0.2}},
        "training": {"mode": "negative_sampling", "loss": "softplus", "threads": 1,
                     "warmup_steps": 60, "epochs": 2},
        "distributed": {"workers": 3, "sync": "epoch"},
    }  # fmt: skip
    whole = _run(tmp_path, "whole", **sections)
    once = {**sections, "training": {**sections["training"], "epochs": 1}}
    data = {**BASE, **once, "run": {**BASE["run"], "root": str(tmp_path), "name": "split"}}
    train(parse_config(data))
    data["training"] = sections["training"]
    train(parse_config(data), resume=True)
    split = load_file(tmp_path / "split" / "model.safetensors")
    for key in ("entity", "relation"):
        diff = (whole[key] - split[key]).abs().max().item()
        assert diff == 0.0, (key, diff)  # (9.5e-5 before the shared step count, then 2e-10)


def test_a_pinned_thread_count_holds_on_a_gang(tmp_path: Path) -> None:
    """training.threads (pinned for bit-identical resumes) was ignored on Dask: each rank took
    its worker's share of the cores, as measured at each launch."""
    from rank_callbacks import ThreadsSeen

    seen = tmp_path / "threads"
    data = {**BASE, "run": {**BASE["run"], "root": str(tmp_path), "name": "pinned"},
            "model": {"name": "distmult", "dim": 8},
            "training": {"epochs": 1, "threads": 1},
            "distributed": {"workers": 1, "launch": "dask", "threads_per_worker": 2}}  # fmt: skip
    train(parse_config(data), rank_callbacks=[ThreadsSeen(seen)])
    assert seen.read_text() == "1"


def _trains_until_cancelled(work: str) -> str:
    from types import SimpleNamespace

    from kgpipe.launch.rank import CancelWatch
    from kgpipe.launch.rank_test import _Progress

    watch, view = CancelWatch(), SimpleNamespace(rank=0)
    ranking = _Progress(None, 1)  # a rank of the test ranking, between its chunks
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # a rank's batches, or its chunks of test queries
        time.sleep(0.01)
        if work == "train":
            watch.on_batch_end(view, 1, 1, 10, 0.0)  # type: ignore[arg-type]
        else:
            ranking(1, 10)
    return "trained on"


@pytest.mark.parametrize("work", ["train", "test"])
def test_a_cancelled_rank_stops_and_frees_its_worker(work: str) -> None:
    """Dask cannot stop a running thread: a cancelled rank trained on to its next commit
    (Ctrl-C on an existing scheduler: 40 s more), holding its worker's only thread while the
    relaunch's rank waited behind it. It now stops at its next batch, or its next chunk of
    test queries (validation chunks: `test_validation_stops_between_chunks_when_told`)."""
    with open_cluster("local", workers=1, threads_per_worker=1) as client:
        rank = client.submit(_trains_until_cancelled, work, pure=False)
        time.sleep(1.0)
        client.cancel(rank, force=True)
        t0 = time.monotonic()
        assert client.submit(int, "7", pure=False).result(timeout=30) == 7
        assert time.monotonic() - t0 < 10  # (it waited the 60 s out before)


def test_validation_stops_between_chunks_when_told(tmp_path: Path) -> None:
    """A rank's validation asks between its chunks whether to stop (its task cancelled):
    it was asked only after every training batch, so a cancelled rank validated to the end
    (minutes against a large graph) before it let its worker go."""
    from kgpipe.errors import RunError
    from kgpipe.launch.build import build_trainer
    from kgpipe.runs.stage import prepare_run

    data = {**BASE, "run": {**BASE["run"], "root": str(tmp_path), "name": "told"},
            "model": {"name": "distmult", "dim": 8}, "training": {"epochs": 1},
            "evaluation": {"test": False, "every": 1, "batch_size": 16}}  # fmt: skip
    run = prepare_run(parse_config(data))
    asked: list[int] = []

    def interrupt() -> None:
        asked.append(1)
        if len(asked) == 3:
            raise RunError("rank 0: its task was cancelled by the driver")

    built = build_trainer(
        run, run.staged(), device=torch.device("cpu"), until=1, interrupt=interrupt
    )
    try:
        with pytest.raises(RunError, match="cancelled"):
            built.trainer.fit(until=1)
    finally:
        assert built.saver is not None
        built.saver.close()
    valid = int(run.staged().valid.shape[0])
    assert len(asked) == 3 < 2 * -(-valid // 16)  # stopped at its third chunk of many
    assert not run.checkpoints().committed()  # nothing committed for the stopped epoch


def _queues(dask_scheduler: Any) -> list[str]:
    return list(dask_scheduler.extensions["queues"].queues)


def test_an_existing_scheduler_keeps_no_progress_queue_of_a_run(tmp_path: Path) -> None:
    """Every gang's progress queue stayed on a scheduler kgpipe did not start (one a
    segment, and the test ranking's): the driver and rank 0 now close theirs."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None, host="127.0.0.1") as outside:  # fmt: skip
        data = {"run": {"seed": 3, "root": str(tmp_path), "name": "q"},
                "data": {"dataset": "umls"}, "model": {"name": "distmult", "dim": 8},
                "training": {"epochs": 2}, "evaluation": {"every": 1},
                "distributed": {"workers": 1, "cluster": outside.scheduler_address}}  # fmt: skip
        train(parse_config(data))
        with Client(outside.scheduler_address) as client:
            assert client.run_on_scheduler(_queues) == []


def _threads_here() -> tuple[str | None, int]:
    return os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()


def test_an_existing_schedulers_workers_size_their_threads_themselves() -> None:
    """The workers of an existing scheduler run elsewhere: their torch threads were this
    host's cores divided by the workers (a 2-core driver gave 32-core workers 1 thread each).
    They now take their own Dask thread count; distributed.threads_per_worker still rules."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=3, processes=True,
                      dashboard_address=None, host="127.0.0.1") as outside:  # fmt: skip
        with open_cluster(outside.scheduler_address, workers=1) as client:
            assert list(client.run(_threads_here).values()) == [("3", 3)]
            from kgpipe.launch.rank import rank_threads  # what a rank (a task) takes

            assert client.submit(rank_threads, None, pure=False).result() == 3
            from kgpipe.tune.trial import _sized  # and so does a search's trial

            config = parse_config(BASE)
            assert client.submit(_sized, config, pure=False).result().training.threads == 3
        with open_cluster(outside.scheduler_address, workers=1, threads_per_worker=2) as client:
            assert list(client.run(_threads_here).values()) == [("2", 2)]


def _settings_here(dask_worker: Any) -> tuple[Any, ...]:
    kgpipe_plugins = [name for name in dask_worker.plugins if name.startswith("kgpipe")]
    filters = [type(f).__name__ for f in logging.getLogger("distributed.worker").filters]
    return (
        _threads_here(), os.environ.get("MKL_NUM_THREADS"),
        torch.are_deterministic_algorithms_enabled(), kgpipe_plugins, filters,
    )  # fmt: skip


def test_an_existing_schedulers_workers_get_their_settings_back() -> None:
    """kgpipe's worker set-up stayed registered on a scheduler it did not start: the workers
    kept the run's thread count, environment and deterministic kernels, and every worker
    that joined later took them too. Leaving the cluster now removes it, which restores them."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=3, processes=True,
                      dashboard_address=None, host="127.0.0.1") as outside:  # fmt: skip
        with Client(outside.scheduler_address) as client:
            before = list(client.run(_settings_here).values())
        assert before[0][2] is False and before[0][3] == []  # the worker's own settings
        with open_cluster(outside.scheduler_address, workers=1, threads_per_worker=2) as client:
            during = list(client.run(_settings_here).values())
        assert during[0][0] == ("2", 2) and during[0][2] is True and len(during[0][3]) == 1
        with Client(outside.scheduler_address) as client:
            assert list(client.run(_settings_here).values()) == before


def test_runs_that_overlap_on_a_worker_leave_it_as_it_was() -> None:
    """Two runs share an existing scheduler's worker: the first to leave restored the settings
    it had found (the other's still in force: threads, environment, deterministic kernels, log
    filters gone under it), and the last left the first run's behind. Now the worker keeps the
    latest run's settings while one is in force, and gets its own back after the last."""
    from types import SimpleNamespace

    from kgpipe.distributed.client import TorchWorkerSetup

    worker = SimpleNamespace(state=SimpleNamespace(nthreads=1))
    before = _threads_here(), torch.are_deterministic_algorithms_enabled()
    filters = list(logging.getLogger("distributed.worker").filters)
    a, b = TorchWorkerSetup(2, {"KGPIPE_PROBE": "a"}), TorchWorkerSetup(3)
    try:
        a.setup(worker)
        b.setup(worker)
        a.teardown(worker)
        assert _threads_here() == ("3", 3) and torch.are_deterministic_algorithms_enabled()
        assert "KGPIPE_PROBE" not in os.environ  # a's own variable went with it
        assert len(logging.getLogger("distributed.worker").filters) == len(filters) + 2
        b.teardown(worker)
        assert (_threads_here(), torch.are_deterministic_algorithms_enabled()) == before
        assert logging.getLogger("distributed.worker").filters == filters
    finally:
        for plugin in (a, b):
            plugin.teardown(worker)
