"""Device placement (``training.device``) and the process-group backend that goes with it.

The CUDA tests run only where torch sees a GPU (and dask-cuda for the cluster one); on a CPU-only
machine they are skipped and everything else here still checks the CPU side of the same code.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from kgpipe.config import RunConfig, config_hash
from kgpipe.devices import (
    device_identity,
    native_bf16,
    process_group_backend,
    resolve_device,
    resolve_precision,
    shared_devices,
)
from kgpipe.errors import ConfigError

HAS_CUDA = torch.cuda.is_available()


def test_cpu_is_always_the_cpu() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("cpu", cluster="cuda") == torch.device("cpu")


def test_auto_keeps_local_cluster_ranks_on_the_cpu() -> None:
    # LocalCluster workers all see the same GPUs: they must not pile onto one of them
    assert resolve_device("auto", cluster="local") == torch.device("cpu")


def test_auto_uses_a_gpu_only_when_there_is_one() -> None:
    assert resolve_device("auto").type == ("cuda" if HAS_CUDA else "cpu")
    assert resolve_device("auto", cluster="tcp://10.0.0.1:8786").type == (
        "cuda" if HAS_CUDA else "cpu"
    )


@pytest.mark.skipif(HAS_CUDA, reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"training\.device=cuda: torch sees no CUDA GPU"):
        resolve_device("cuda")


def test_workers_that_would_share_a_gpu_are_found_before_a_gang_launches() -> None:
    """Found on one H100: a 2-worker gang on a scheduler address put both ranks on the card, and
    NCCL failed it three restarts in a row ("Duplicate GPU detected")."""
    idents = {"tcp://a:1": "h/GPU-1", "tcp://a:2": "h/GPU-1", "tcp://b:1": "g/GPU-1",
              "tcp://b:2": None, "tcp://b:3": None}  # fmt: skip
    assert shared_devices(idents) == {"h/GPU-1": ["tcp://a:1", "tcp://a:2"]}
    assert shared_devices({"x": None, "y": None}) == {}
    assert device_identity("cpu", "tcp://s:8786") is None
    assert device_identity("auto", "local") is None  # LocalCluster ranks stay on the CPU
    if not torch.cuda.is_available():
        assert device_identity("auto", "tcp://s:8786") is None
        assert device_identity("cuda", "tcp://s:8786") is None  # the rank says why, itself
    else:
        assert device_identity("auto", "tcp://s:8786") == device_identity("cuda", None)


def test_backend_follows_the_device() -> None:
    assert process_group_backend("auto", torch.device("cpu")) == "gloo"
    assert process_group_backend("auto", torch.device("cuda", 0)) == "nccl"
    assert process_group_backend("gloo", torch.device("cuda", 0)) == "gloo"
    with pytest.raises(ConfigError, match="nccl needs CUDA tensors"):
        process_group_backend("nccl", torch.device("cpu"))


def test_device_does_not_change_the_config_hash() -> None:
    base = {"data": {"dataset": "umls"}}
    a = RunConfig.model_validate(base)
    b = RunConfig.model_validate({**base, "training": {"device": "cpu"}})
    assert config_hash(a) == config_hash(b)  # a run may resume on another device
    for precision in ("bf16", "auto"):  # ... where precision auto may resolve differently
        c = RunConfig.model_validate({**base, "training": {"precision": precision}})
        assert config_hash(a) == config_hash(c)
    e = RunConfig.model_validate({**base, "training": {"allocator": "system"}})
    assert config_hash(a) == config_hash(e)  # where freed memory goes is not what is trained
    d = RunConfig.model_validate({**base, "training": {"lr": 0.5}})
    assert config_hash(a) != config_hash(d)


@pytest.mark.skipif(HAS_CUDA, reason="this machine has a GPU")
def test_cli_cuda_without_gpu_fails_cleanly(tmp_path: Path, datasets_root: Path) -> None:
    cfg = {
        "run": {"root": str(tmp_path / "runs"), "name": "gpu"},
        "data": {"dataset": "umls", "root": str(datasets_root)},
        "model": {"name": "distmult", "dim": 16},
        "training": {"epochs": 1, "device": "cuda"},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "kgpipe.cli", "train", "-c", str(path), "--no-prefect", "-q"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert "torch sees no CUDA GPU" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gpu_training_matches_cpu_training(precision: str) -> None:
    from kgpipe.config import ModelConfig, RegularizerConfig, TrainingConfig
    from kgpipe.models.model import KGEModel
    from kgpipe.training.loop import Trainer

    gen = torch.Generator().manual_seed(0)
    triples = torch.stack(
        [torch.randint(0, 50, (400,), generator=gen), torch.randint(0, 5, (400,), generator=gen),
         torch.randint(0, 50, (400,), generator=gen)], dim=1
    )  # fmt: skip
    cfg = TrainingConfig(
        mode="1vsall", loss="cross_entropy", batch_size=64, epochs=2, optimizer="adagrad",
        lr=0.1, precision=precision,
    )  # fmt: skip
    tables = []
    for device in ("cpu", "cuda"):
        model = KGEModel.build(
            ModelConfig(name="complex", dim=16, reciprocal=True),
            num_entities=50, num_relations=5, seed=0,
        ).to(device)  # fmt: skip
        Trainer(model, triples, training=cfg, regularizer=RegularizerConfig(), seed=0).fit()
        tables.append(model.entity.detach().cpu())
    tol = 1e-4 if precision == "fp32" else 2e-2
    torch.testing.assert_close(tables[0], tables[1], rtol=tol, atol=tol)


@pytest.mark.skipif(HAS_CUDA, reason="this machine has a GPU")
def test_dask_rank_refusing_its_device_fails_at_once(tmp_path: Path, datasets_root: Path) -> None:
    """A rank's ConfigError is not retried: every relaunch would fail the same way. (On a
    cluster started here the run is refused before anything is written; an existing
    scheduler's workers are other hosts, whose GPUs only a rank there sees.)"""
    from distributed import LocalCluster

    from kgpipe.errors import ConfigError, RunError
    from kgpipe.pipeline import train

    data = {
        "run": {"root": str(tmp_path), "name": "dev"},
        "data": {"dataset": "umls", "root": str(datasets_root)},
        "model": {"name": "distmult", "dim": 16},
        "training": {"epochs": 1, "device": "cuda"},
        "distributed": {"launch": "dask", "workers": 1},
        "fault_tolerance": {"max_restarts": 3, "restart_backoff_s": 30},
    }
    with pytest.raises(ConfigError, match="torch sees no CUDA GPU"):
        train(RunConfig.model_validate(data))
    assert not (tmp_path / "dev").exists()
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None, host="127.0.0.1") as outside:  # fmt: skip
        data["distributed"] = {**data["distributed"], "cluster": outside.scheduler_address}
        with pytest.raises(RunError, match="torch sees no CUDA GPU") as info:
            train(RunConfig.model_validate(data))
    assert "rank 0 on worker" in str(info.value) and "restart" not in str(info.value)


XEON = "fpu vme sse sse2 avx2 avx512f avx512bw avx512_vnni avx512_vbmi2"  # no bf16 (measured slow)
SAPPHIRE_RAPIDS = XEON + " avx512_bf16 amx_bf16 amx_tile amx_int8"


def test_native_bf16_reads_the_cpu_flags() -> None:
    cpu = torch.device("cpu")
    assert not native_bf16(cpu, cpu_flags=XEON)
    assert native_bf16(cpu, cpu_flags=SAPPHIRE_RAPIDS)
    assert native_bf16(cpu, cpu_flags="flags : fpu avx512_bf16")
    assert not native_bf16(cpu, cpu_flags="")


def test_auto_precision_is_bf16_only_for_bilinear_models_on_native_hardware(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import kgpipe.devices as devices

    cpu = torch.device("cpu")
    assert resolve_precision("fp32", "complex", cpu) == "fp32"
    assert resolve_precision("bf16", "complex", cpu) == "bf16"  # asked for: even if emulated
    for native in (False, True):
        monkeypatch.setattr(devices, "native_bf16", lambda _d, _f=None, n=native: n)
        for model in ("complex", "distmult"):
            assert resolve_precision("auto", model, cpu) == ("bf16" if native else "fp32")
        for model in ("transe", "rotate"):  # distances: never bf16
            assert resolve_precision("auto", model, cpu) == "fp32"


@pytest.mark.parametrize("native", [False, True])
def test_trainer_resolves_auto_precision(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config with precision auto trains; the trainer takes bf16 only for the bilinear models
    and only where the (here simulated) CPU flags say bf16 products are native."""
    import kgpipe.devices as devices
    from kgpipe.models.model import KGEModel
    from kgpipe.training.loop import Trainer

    monkeypatch.setattr(devices, "native_bf16", lambda _d, _f=None: native)
    for name in ("rotate", "complex"):
        cfg = RunConfig.model_validate(
            {"data": {"dataset": "umls"}, "model": {"name": name, "dim": 8},
             "training": {"precision": "auto", "mode": "1vsall", "loss": "cross_entropy",
                          "batch_size": 2}}
        )  # fmt: skip
        model = KGEModel.build(cfg.model, num_entities=5, num_relations=2, seed=0)
        trainer = Trainer(
            model, torch.tensor([[0, 0, 1], [1, 1, 2]]), training=cfg.training,
            regularizer=cfg.model.regularizer, seed=0,
        )  # fmt: skip
        assert trainer.bf16 is (native and name == "complex")
        assert trainer.train_epoch().loss > 0


_FAULTS = """
import resource, sys
import torch
from kgpipe.process import retain_freed_memory
if sys.argv[1] == "retain":
    assert retain_freed_memory()
    assert retain_freed_memory()  # idempotent
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
n = (128 << 20) // 4  # a 128 MiB float32 block: above glibc's default mmap threshold
for _ in range(12):  # first touches; retained, the heap grows over the first rounds (an aligned
    x = torch.empty(n).fill_(1.0); del x  # block does not fit the one freed before it; how many
    # rounds depends on what the imports left on the heap: 5-9 measured)
before = faults()
for _ in range(5):
    x = torch.empty(n).fill_(1.0); del x
print(faults() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")
def test_retain_freed_memory_stops_refaulting_large_blocks() -> None:
    # the mechanism itself: with the C library's defaults every 128 MiB allocation is a fresh
    # mmap whose 32k pages fault in again; retained, the freed pages are reused once the heap
    # has reached its steady size
    faults = {}
    for mode in ("system", "retain"):
        out = subprocess.run(
            [sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True
        )
        faults[mode] = int(out.stdout.strip().splitlines()[-1])
    pages = 5 * (128 << 20) // 4096
    assert faults["system"] >= 0.9 * pages, faults
    assert faults["retain"] <= 0.1 * pages, faults


def test_where_the_ranks_train_is_checked_before_anything_is_written(tmp_path: Path) -> None:
    """A scheduler that does not answer (it took a 30-s timeout after staging) and a cuda
    cluster without dask-cuda were refused after the run folder was staged, so the corrected
    command found a run of that name and asked for --resume or --overwrite."""
    import importlib.util

    from kgpipe.errors import ConfigError
    from kgpipe.pipeline import train

    def config(**distributed: object) -> RunConfig:
        return RunConfig.model_validate({
            "run": {"root": str(tmp_path), "name": "placed"}, "data": {"dataset": "umls"},
            "model": {"name": "distmult", "dim": 8}, "training": {"epochs": 1},
            "distributed": distributed,
        })  # fmt: skip

    for address in ("tcp://127.0.0.1:9", "127.0.0.1:9"):
        with pytest.raises(ConfigError, match=r"Dask scheduler cannot be reached \(connection"):
            train(config(cluster=address))
    if importlib.util.find_spec("dask_cuda") is None:
        with pytest.raises(ConfigError, match="needs dask-cuda"):
            train(config(cluster="cuda"))
    assert not (tmp_path / "placed").exists()
