"""The tampering fuzzer (issue 35): during 2-node loopback jobs of seven shapes (clean exit, a
rank failure with a restart, a rank failure, a hang, a paused rank continued by `agent debug`,
`agent exec`, resident agents serving a run), an outsider with torch's own client lists the job
store's keys and applies random operations at a seeded schedule (tests/outsider.py). The job's
exit codes, root cause kind and rank, and attempts (and the client's exit where there is one)
must equal the untampered shape's, within a bounded delay. scripts/soak_tampering.py runs
hundreds of them; this runs one job a shape. A failure names its seed: replay it with
`python scripts/soak_tampering.py --jobs 1 --seed SEED --shapes SHAPE`."""

from __future__ import annotations

import pytest
from outsider import SHAPES, run_job

DELAY = 30.0  # seconds a tampered job may take beyond its shape's typical untampered time
SEEDS = {
    "clean": 7,
    "restart": 8,
    "failure": 9,
    "hang": 10,
    "debug": 11,
    "exec": 12,
    "resident": 13,
}
# What it found (issue 35) and is fixed, each with a test of its own: a counter set to a
# non-number (the store client resets it), a barrier or health round waiting for a counter an
# outsider deleted or set back (they look past it), a claim ticket handed out twice, a peer's
# beat forged or deleted (a first beat has its own bound; a tampered one is waited past once),
# hosts read after the join waiting for ever past a garbled note, garbage at the public key
# check taken for a secret mismatch, and agents falling back to torch's client when torch
# 2.13's server left their handshake unanswered (~1 connection in 50, ~5 s).
# Then (the soak of 2026-11-26, 8 of 16 changes → 1 of 24): records garbled faster than anyone
# read them (each record written again is now also a secret-named copy the reader blocks on), a
# plan deleted (written again), a hang's standing garbled before node 0 read it (node 0 asks).
# Last (2026-11-26, fourth session): an agent whose reconnect was refused while node 0 still
# served took the store for lost; a refused reconnect is now tried again for 1 s and the error
# says why. The soak then ran 210 tampered jobs (seeds 9000-9209, 29,558 operations) with no
# outcome changed - BENCHMARKS.md, "Tampering soak, fourth session". Fifth session: three more
# shapes (debug, exec, resident); 210 jobs over the seven (seeds 10000-10209, 27,067
# operations), no outcome changed - BENCHMARKS.md, "Tampering soak, fifth session".
# Seventh: this test's hang seed 10 failed once in CI (node 0 never ended the hung job): garbage
# at a node's stacks answer, read once, was waited past with no bound. The wait now ends with the
# capture's own bound and names the node (tests/test_desk_trust.py).
pytestmark = pytest.mark.e2e


@pytest.fixture
def run_job_for(tmp_path):
    return lambda shape, seed: run_job(tmp_path, SHAPES[shape], seed, SHAPES[shape].typical + DELAY)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_an_outsider_changes_no_outcome(run_job_for, shape):
    _check(run_job_for, shape, SEEDS[shape])


def test_a_counter_set_to_garbage_before_an_agent_adds_to_it_is_not_a_lost_store(run_job_for):
    """Seed 1 of the restart shape found it: garbage over `r0/a0/standing-seq` (or a claim or
    arrival counter) made torch's server close the agent's connection at its next add(): exit 3
    and no summary. The store client resets the counter and adds again (tests/test_store_client)."""
    _check(run_job_for, "restart", 1)


def _check(run_job_for, shape: str, seed: int) -> None:
    result = run_job_for(shape, seed)
    assert not result.changed, f"{result.describe()}\n{result.dump[-4000:]}"
    assert result.outsider is not None and sum(result.outsider.tried.values()) > 0, (
        f"seed {seed}: the outsider did nothing"
    )
