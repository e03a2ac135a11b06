"""Where an attempt's ranks meet for init_process_group (MASTER_ADDR:MASTER_PORT)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RanksStore:
    """`port`: MASTER_PORT. `agent_store`: the agent hosts a store there and every rank joins it
    as a client (TORCHELASTIC_USE_AGENT_STORE); otherwise rank 0 hosts one on that port, and a
    rank that asks before rank 0 listens waits out torch's connect back-off (0.4-0.7 s here)."""

    port: int
    agent_store: bool
