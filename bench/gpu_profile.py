"""Where a GPU training step's time goes: ``torch.profiler`` over one epoch of 20 steps.

    python bench/gpu_profile.py ../shared/datasets > bench/results/gpu_profile_step.txt

FB15k-237 TransE, d=200, batch 1024, 256 shared negatives, row-wise Adam (bench/speed.py's
step) after one warm-up epoch. Prints the operators by self CPU time and by self CUDA time;
compare "Self CPU time total" with "Self CUDA time total" to see whether the GPU is starved
by kernel launches. Run by bench/gpu_check.sh.
"""

from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from kgpipe.config import DataConfig, ModelConfig, RegularizerConfig, TrainingConfig
from kgpipe.data.dataset import load_dataset
from kgpipe.models.model import KGEModel
from kgpipe.training.loop import Trainer


def main(data_root: str) -> None:
    ds = load_dataset(DataConfig(dataset="fb15k-237", root=data_root))
    model = KGEModel.build(
        ModelConfig(name="transe", dim=200, p=2),
        num_entities=ds.num_entities,
        num_relations=ds.num_relations,
        seed=0,
    ).to("cuda")
    cfg = TrainingConfig(
        batch_size=1024, negatives=256, chunk_size=512, loss="margin", optimizer="adam",
        lr=1e-3, epochs=1,
    )  # fmt: skip
    trainer = Trainer(
        model, ds.train[: 1024 * 20], training=cfg, regularizer=RegularizerConfig(), seed=0
    )
    trainer.train_epoch()  # warm-up
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        trainer.train_epoch()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/datasets")
