"""Command lines for the three ways to start the same ranks: no launcher, ours, torchrun (c10d)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bench import common as c

Cmd = tuple[list[str], dict[str, str], Path]


def floor(
    nodes: int,
    nproc: int,
    prog: Sequence[str],
    work: Path,
    tag: str,
    env: dict[str, str] | None = None,
) -> list[Cmd]:
    """The ranks started directly with a preset env; rank 0 hosts the store (env://)."""
    port, world = c.free_port(), nodes * nproc
    return [
        (
            [c.PY, *prog],
            c.base_env(**c.rank_env(r, r % nproc, world, nproc, port), **(env or {})),
            work / f"{tag}-rank{r}.log",
        )
        for r in range(world)
    ]


def ours_log_dir(work: Path, tag: str) -> Path:
    return work / f"{tag}-logs"


def ours(
    nodes: int,
    nproc: int,
    prog: Sequence[str],
    work: Path,
    tag: str,
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> list[Cmd]:
    """`python -m agent` per simulated node, fake SLURM env, store port picked free."""
    job, port = c.unique_job(), c.free_port()
    argv = [
        c.PY,
        "-m",
        "agent",
        "--master-port",
        str(port),
        "--log-dir",
        str(ours_log_dir(work, tag)),
        "--nproc-per-node",
        str(nproc),
        *extra,
        *prog,
    ]
    return [
        (
            argv,
            c.base_env(**c.slurm_env(job, nodes, i), **(env or {})),
            work / f"{tag}-agent{i}.log",
        )
        for i in range(nodes)
    ]


def torchrun(
    nodes: int,
    nproc: int,
    prog: Sequence[str],
    work: Path,
    tag: str,
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> list[Cmd]:
    """torchrun per simulated node, c10d rendezvous hosted by node 0's torchrun."""
    job, port = c.unique_job(), c.free_port()
    cmds = []
    for i in range(nodes):
        argv = [
            c.PY,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(nodes),
            "--nproc-per-node",
            str(nproc),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            f"bench{job}",
            "--rdzv-conf",
            f"is_host={int(i == 0)}",
            "--local-addr",
            f"127.0.0.{i + 1}",
            "--max-restarts",
            "0",
            *extra,
            *prog,
        ]
        cmds.append((argv, c.base_env(**(env or {})), work / f"{tag}-torchrun{i}.log"))
    return cmds


def build(
    mode: str,
    nodes: int,
    nproc: int,
    prog: Sequence[str],
    work: Path,
    tag: str,
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> list[Cmd]:
    if mode == "floor":
        return floor(nodes, nproc, prog, work, tag, env)
    if mode == "ours":
        return ours(nodes, nproc, prog, work, tag, extra, env)
    if mode == "torchrun":
        return torchrun(nodes, nproc, prog, work, tag, extra, env)
    raise ValueError(mode)
