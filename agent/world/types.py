"""What the world sources produce: this agent's place in the job."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    """Per-task modes (srun-only / mpirun one-per-rank): this agent runs exactly one rank chosen by the scheduler."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int


@dataclass(frozen=True)
class WorldFlags:
    """The CLI's say on the world; every field optional."""

    source: str = "auto"
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    job_id: str | None = None


@dataclass(frozen=True)
class World:
    """Where this agent sits in the job: node count and index, hosts, node 0's address."""

    source: str
    job_id: str
    step_id: str
    nnodes: int
    node_rank: int
    hosts: tuple[str, ...]  # one per node (slurm, local); () where only node 0's address is known
    host: str  # this node's name in logs: the Slurm node name, else the hostname argument
    master_addr: str
    master_port: int | None  # None: nothing fixed it, so the caller derives one (derive_port)
    task: Task | None = None
    gpus_on_node: int | None = None
    visible_devices: tuple[str, ...] | None = None

    @property
    def agents(self) -> int:
        return self.task.world_size if self.task else self.nnodes

    @property
    def agent_index(self) -> int:
        return self.task.rank if self.task else self.node_rank
