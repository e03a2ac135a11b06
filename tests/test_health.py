"""Health checks before every attempt: real commands, real files; NVML through a fake module."""

from __future__ import annotations

import os
import sys
import time

import psutil
import pytest
from cluster import wait_for

from agent.run.gpu_faults import gpu_faults
from agent.run.health import Health, HealthCheck, examine, low_space, run_command

ENV = dict(os.environ)


def _check(tmp_path, **kw) -> HealthCheck:
    values = {"log_dir": str(tmp_path), "gpus": (), "min_free_mib": 0, "command": None}
    values.update(kw)
    return HealthCheck(timeout=kw.pop("timeout", 10.0), shm=str(tmp_path), **values)


def _healthy(check, present=(), faults=()):
    return examine(check, lambda: set(present), lambda: list(faults), ENV)


@pytest.mark.parametrize(
    ("free", "minimum", "problem"),
    [
        (None, 64, None),
        (64 << 20, 64, None),
        ((64 << 20) - 1, 64, "/x has 64 MiB free, less than --min-free-mib 64"),
        (10 << 20, 64, "/x has 10 MiB free, less than --min-free-mib 64"),
        (0, 0, None),
    ],
)
def test_low_space_table(free, minimum, problem):
    assert low_space("/x", free, minimum) == ([problem] if problem else [])


def test_a_healthy_node_has_no_problems(tmp_path):
    health = _healthy(_check(tmp_path, gpus=("0000:07:00.0",)), present={"0000:07:00.0"})
    assert health.ok and health.problems == () and health.output == ()


def test_an_unwritable_log_dir_is_a_problem(tmp_path):
    health = _healthy(_check(tmp_path / "missing"))
    assert not health.ok and "is not writable" in health.problems[0]


def test_too_little_free_space_is_a_problem(tmp_path):
    health = _healthy(_check(tmp_path, min_free_mib=1 << 40))
    assert len(health.problems) == 2  # the log dir and "/dev/shm" (here the same tmp dir)
    assert all("less than --min-free-mib" in p for p in health.problems)


def test_missing_gpus_and_gpu_faults_are_problems(tmp_path):
    check = _check(tmp_path, gpus=("0000:07:00.0", "0000:0a:00.0"))
    health = _healthy(check, present={"0000:07:00.0"}, faults=["GPU 0000:07:00.0: ecc"])
    assert health.problems == (
        "GPU(s) 0000:0a:00.0 no longer visible",
        "GPU 0000:07:00.0: ecc",
    )


def test_gpus_are_not_looked_at_when_none_is_used(tmp_path):
    health = examine(_check(tmp_path), _boom, _boom, ENV)
    assert health.ok


def _boom():
    raise AssertionError("must not be called")


def test_a_failing_command_gives_its_code_and_last_lines(tmp_path):
    script = "import sys\nfor i in range(50): print('line', i)\nsys.exit(3)"
    problems, lines = run_command(f'{sys.executable} -c "{script}"', 10, ENV, None)
    assert problems == ["--health-check exited with code 3"]
    assert lines == tuple(f"line {i}" for i in range(30, 50))


def test_a_passing_command_is_healthy_and_its_output_dropped(tmp_path):
    health = _healthy(_check(tmp_path, command=f"{sys.executable} -c \"print('fine')\""))
    assert health.ok and health.output == ()


def test_a_slow_command_is_killed_with_its_children_at_the_timeout(tmp_path):
    marker = tmp_path / "child.pid"
    child = tmp_path / "child.py"
    child.write_text(
        f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n"
    )
    command = f"sh -c '{sys.executable} {child} & wait'"
    begin = time.monotonic()
    problems, _ = run_command(command, 1.0, ENV, None)
    assert problems == ["--health-check did not finish within 1s"]
    assert time.monotonic() - begin < 10
    pid = int(marker.read_text())
    wait_for(lambda: not _alive(pid), 5, "the check's child to die")  # SIGKILL lands async


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # a zombie is dead
    except psutil.NoSuchProcess:
        return False


def _slow_child(tmp_path) -> tuple[str, object]:
    marker = tmp_path / "child.pid"
    child = tmp_path / "child.py"
    child.write_text(
        f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n"
    )
    return f"sh -c '{sys.executable} {child} & wait'", marker


def _written(marker) -> bool:
    """The child has written its pid (the file exists a moment before it has content)."""
    return marker.exists() and marker.read_text() != ""


def test_a_round_that_failed_elsewhere_stops_the_command(tmp_path):
    """`over` is asked while the command runs: True kills it with its children at once."""
    command, marker = _slow_child(tmp_path)
    begin = time.monotonic()
    problems, _ = run_command(command, 300, ENV, None, over=lambda: _written(marker))
    assert problems == ["--health-check stopped: the round failed on another node"]
    assert time.monotonic() - begin < 10
    wait_for(lambda: not _alive(int(marker.read_text())), 5, "the check's child to die")


class Stop(BaseException):
    """Stands in for the agent's Interrupted (a stop signal raised in the waiting thread)."""


def test_a_signal_while_the_command_runs_kills_it(tmp_path):
    command, marker = _slow_child(tmp_path)

    def signalled() -> bool:
        if _written(marker):
            raise Stop
        return False

    with pytest.raises(Stop):
        run_command(command, 300, ENV, None, over=signalled)
    wait_for(lambda: not _alive(int(marker.read_text())), 5, "the check's child to die")


def test_a_command_that_cannot_run_is_one_line(tmp_path):
    problems, lines = run_command(str(tmp_path / "nope"), 5, ENV, None)
    assert problems[0].startswith(f"--health-check {tmp_path / 'nope'}: cannot run it")
    assert lines == ()


def test_a_command_that_floods_its_output_keeps_memory_bounded(tmp_path):
    flood = f"{sys.executable} -c \"import sys; sys.stdout.write('x' * (64 << 20)); sys.exit(1)\""
    problems, lines = run_command(flood, 30, ENV, None)
    assert problems == ["--health-check exited with code 1"]
    assert sum(len(line) for line in lines) <= 300 * 20


def test_health_json_is_bounded_on_the_way_in():
    data = {"problems": ["p"] * 100, "output": ["o" * 10_000] * 100, "s": 1.5}
    health = Health.from_json(data)
    assert len(health.problems) == 20 and len(health.output) == 20
    assert all(len(line) == 300 for line in health.output)
    assert Health.from_json(health.to_json()) == health


class FakeNvml:
    """The pynvml calls gpu_faults makes, over a table of devices."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0

    class NVMLError(Exception):
        pass

    class _Pci:
        def __init__(self, bus: str) -> None:
            self.busId = bus.encode()

    def __init__(self, devices: list[dict]) -> None:
        self.devices = devices

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict:
        return self.devices[index]

    def nvmlDeviceGetPciInfo(self, handle: dict):
        return self._Pci(handle["bus"])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: dict) -> int:
        if "pending" not in handle:
            raise self.NVMLError("not supported")
        return handle["pending"]

    def nvmlDeviceGetRemappedRows(self, handle: dict):
        if "rows" not in handle:
            raise self.NVMLError("not supported")
        return handle["rows"]

    def nvmlDeviceGetTotalEccErrors(self, handle: dict, kind: int, counter: int) -> int:
        assert (kind, counter) == (1, 0)
        return handle.get("ecc", 0)


def test_gpu_faults_reads_retired_pages_remapped_rows_and_ecc():
    nvml = FakeNvml(
        [
            {"bus": "00000000:07:00.0", "pending": 1, "ecc": 2},
            {"bus": "00000000:0A:00.0", "rows": (0, 1, True, False)},
            {"bus": "00000000:0B:00.0", "rows": (0, 0, False, True)},
            {"bus": "00000000:0C:00.0", "pending": 1},  # not ours
            {"bus": "00000000:0D:00.0", "pending": 0, "rows": (0, 0, False, False)},
        ]
    )
    ours = ["0000:07:00.0", "0000:0a:00.0", "0000:0b:00.0", "0000:0d:00.0"]
    assert gpu_faults(ours, nvml) == [
        "GPU 0000:07:00.0: retired pages pending (reset the GPU)",
        "GPU 0000:07:00.0: 2 uncorrected ECC error(s) since the driver loaded",
        "GPU 0000:0a:00.0: remapped rows pending (reset the GPU)",
        "GPU 0000:0b:00.0: row remapping failed",
    ]
