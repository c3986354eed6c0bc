"""A rank whose rendezvous failed joins the next gang of its worker: torch names a process's
groups by a count that a failed rendezvous left one ahead of its peers', so every later gang of
that worker timed out (a relaunch after a late peer failed for good)."""

from __future__ import annotations

import multiprocessing as mp
import socket

import torch
import torch.distributed as dist

from kgpipe.launch.rank import init_gang


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, lonely_port: int, port: int, fail_first: bool, out: mp.Queue) -> None:
    try:
        if fail_first:  # a gang whose peer never comes: the rendezvous times out
            try:
                init_gang("gloo", f"tcp://127.0.0.1:{lonely_port}", rank=0, world_size=2,
                          timeout_s=2)  # fmt: skip
            except Exception:
                pass
            else:
                raise AssertionError("a gang of one rank of two formed")
        init_gang("gloo", f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout_s=20)
        x = torch.ones(1)
        dist.all_reduce(x)
        dist.destroy_process_group()
        out.put((rank, float(x)))
    except Exception as err:
        out.put((rank, repr(err)))


def test_a_failed_rendezvous_does_not_spoil_the_next_gang() -> None:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    lonely, port = _free_port(), _free_port()
    late = ctx.Process(target=_rank, args=(0, lonely, port, True, out))
    late.start()
    fresh = ctx.Process(target=_rank, args=(1, lonely, port, False, out))
    fresh.start()
    results = dict(out.get(timeout=60) for _ in range(2))
    late.join(30)
    fresh.join(30)
    assert results == {0: 2.0, 1: 2.0}
