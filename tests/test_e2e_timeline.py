"""`agent logs LOG_DIR --timeline` on a real job: 1 node × 2 ranks, rank 1 fails in attempt 0,
`--max-restarts 1` runs attempt 1. The SVG parses, shows both attempts and marks the failure;
where a headless renderer exists (Debian's chromium, else librsvg's rsvg-convert) it renders to
a PNG kept next to the log dir as the test's artifact."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from cluster import FIXTURE, REPO

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def restarted(cluster_factory):
    args = ["--nproc-per-node", "2", "--max-restarts", "1", FIXTURE, "--on", "1", "--exit", "9",
            "--stderr", "rank 1 gives up", "--fail-attempts", "1"]  # fmt: skip
    cluster = cluster_factory(1).start(args)
    assert cluster.wait(120) == [0], cluster.dump()
    assert len(cluster.summary()["attempts"]) == 2
    return cluster


def draw(log_dir, target) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "agent", "logs", str(log_dir), "--timeline", str(target)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip


@pytest.mark.e2e
def test_timeline_of_a_job_with_one_restart(restarted, tmp_path):
    target = tmp_path / "job.svg"
    done = draw(restarted.log_dir, target)
    assert done.returncode == 0, done.stderr
    assert "2 lane(s) by rank, 2 attempt(s)" in done.stdout
    root = ET.parse(target).getroot()
    attempts = root.findall(f".//{SVG}g[@class='attempt']")
    assert [a.get("data-attempt") for a in attempts] == ["0", "1"]
    assert "exit code 9" in attempts[0].findtext(f"{SVG}title")
    assert len(root.findall(f".//{SVG}line[@class='restart']")) == 1
    (failed,) = root.findall(f".//{SVG}rect[@class='bar failed']")
    assert failed.findtext(f"{SVG}title").startswith("rank 1 · 127.0.0.1 attempt 0")
    (cause,) = root.findall(f".//{SVG}g[@class='mark cause']")
    assert "rank 1 on 127.0.0.1 (node 0) exit code 9" in cause.findtext(f"{SVG}title")
    succeeded = [
        bar.findtext(f"{SVG}title") for bar in root.findall(f".//{SVG}rect[@class='bar succeeded']")
    ]
    # Both ranks of the restart; rank 0 of attempt 0 may have finished before rank 1 failed, or
    # been torn down by it: the race is the job's, not the picture's.
    assert sum(" attempt 1" in title for title in succeeded) == 2, succeeded

    renderer = shutil.which("chromium") or shutil.which("rsvg-convert")
    if renderer is None:
        pytest.skip("no headless renderer (chromium or rsvg-convert) to take a screenshot")
    png = restarted.log_dir / "timeline.png"  # the artifact, beside the job's logs
    if renderer.endswith("chromium"):
        argv = [renderer, "--headless", "--no-sandbox", "--disable-gpu",
                f"--screenshot={png}", "--window-size=1200,400", target.as_uri()]  # fmt: skip
    else:
        argv = [renderer, str(target), "-o", str(png)]
    shot = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert shot.returncode == 0, shot.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 1200 and height >= 100, (width, height)


def test_timeline_refuses_without_a_summary(tmp_path):
    (tmp_path / "logs").mkdir()
    done = draw(tmp_path / "logs", tmp_path / "x.svg")
    assert done.returncode == 2 and "no summary.json" in done.stderr
    assert done.stderr.count("\n") == 1 and not (tmp_path / "x.svg").exists()
