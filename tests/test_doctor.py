"""Doctor on fake trees (RoCE GIDs, NICs, GPUs) and on this real machine."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from agent.doctor import Gid, advise, main, read_facts
from tests.fake_sysfs import add_gpu, add_nic, add_rdma_port, single_node, two_socket_cpus

V4 = "0000:0000:0000:0000:0000:ffff:c0a8:0101"  # ::ffff:192.168.1.1
V4_LINK = "0000:0000:0000:0000:0000:ffff:0a00:0005"  # ::ffff:10.0.0.5
LINK_LOCAL = "fe80:0000:0000:0000:a288:c2ff:fe3b:506a"
GLOBAL_V6 = "2010:0200:0000:0002:a288:c2ff:fe3b:506a"
ROCE_GIDS = {
    0: (LINK_LOCAL, "IB/RoCE v1", "eth2"),
    1: (LINK_LOCAL, "RoCE v2", "eth2"),
    2: (V4, "IB/RoCE v1", "eth2"),
    3: (V4, "RoCE v2", "eth2"),
    4: (GLOBAL_V6, "IB/RoCE v1", "eth2"),
    5: (GLOBAL_V6, "RoCE v2", "eth2"),
}


def four_gpu_roce_node(root: Path) -> Path:
    two_socket_cpus(root)
    for index, pci in enumerate(["0000:07:00.0", "0000:0f:00.0", "0000:87:00.0", "0000:90:00.0"]):
        add_gpu(root, pci, index // 2, range(64))
    add_rdma_port(root, "mlx5_0", 1, ROCE_GIDS)
    (root / "sys/class/infiniband/mlx5_0/ports/1/gids/6").write_text(
        "0000:0000:0000:0000:0000:0000:0000:0000\n"
    )
    add_nic(root, "lo", "unknown", physical=False)
    add_nic(root, "eth0")
    add_nic(root, "eth2")
    return root


def run(argv: list[str], env: dict[str, str], root: Path = Path("/")) -> tuple[int, str]:
    out = io.StringIO()
    code = main(argv, env, root, Console(file=out, width=200))
    return code, out.getvalue()


def suggestions(root: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    advice = advise(read_facts(root, env or {}))
    return dict(s.setting.split("=", 1) for s in advice.suggestions if "=" in s.setting)


@pytest.mark.parametrize(
    ("gid", "ipv4"),
    [(V4, "192.168.1.1"), (V4_LINK, "10.0.0.5"), (LINK_LOCAL, None), (GLOBAL_V6, None)],
)
def test_gid_ipv4(gid: str, ipv4: str | None) -> None:
    assert Gid(0, gid, "RoCE v2", "eth2").ipv4 == ipv4


def test_roce_v2_ipv4_gid_index_is_suggested(tmp_path: Path) -> None:
    root = four_gpu_roce_node(tmp_path)
    (port,) = read_facts(root, {}).ib_ports
    assert [g.index for g in port.gids] == [0, 1, 2, 3, 4, 5]  # the all-zero slot 6 is skipped
    assert suggestions(root) == {
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_IB_HCA": "mlx5_0",
        "NCCL_SOCKET_IFNAME": "eth2",  # the netdev behind the GID, not the first NIC
    }


def test_printed_report(tmp_path: Path) -> None:
    env = {
        "NCCL_DEBUG": "INFO",
        "NCCL_IB_GID_INDEX": "0",
        "HOME": "/root",
        "AGENT_SECRET": "s3cret",
    }
    code, text = run(["--sysfs-root", str(four_gpu_roce_node(tmp_path))], env)
    assert code == 0
    assert "export NCCL_IB_GID_INDEX=3" in text
    assert "now NCCL_IB_GID_INDEX=0" in text
    assert "export NCCL_IB_HCA=mlx5_0" in text
    assert "3 (192.168.1.1)" in text
    assert "NCCL_DEBUG=INFO" in text
    assert "s3cret" not in text and "HOME" not in text
    for pci in ("0000:07:00.0", "0000:90:00.0"):
        assert pci in text
    assert "Default --numa-binding here: node" in text
    assert "local rank 3 (0000:90:00.0): CPUs 16-31,48-63, memory node 1" in text


def test_devices_that_disagree_on_the_index(tmp_path: Path) -> None:
    single_node(tmp_path)
    add_rdma_port(tmp_path, "mlx5_0", 1, {3: (V4, "RoCE v2", "eth2")})
    add_rdma_port(tmp_path, "mlx5_1", 1, {5: (V4_LINK, "RoCE v2", "eth3")})
    advice = advise(read_facts(tmp_path, {}))
    settings = [s.setting for s in advice.suggestions]
    assert "unset NCCL_IB_GID_INDEX" in settings
    assert "NCCL_IB_HCA=mlx5_0,mlx5_1" in settings


def test_infiniband_and_down_ports(tmp_path: Path) -> None:
    single_node(tmp_path)
    add_rdma_port(
        tmp_path, "mlx5_1", 1, {0: (LINK_LOCAL, "IB/RoCE v1", "")}, link_layer="InfiniBand"
    )
    add_rdma_port(
        tmp_path,
        "mlx5_10",
        1,
        {0: (LINK_LOCAL, "IB/RoCE v1", "")},
        state="1: DOWN",
        link_layer="InfiniBand",
    )
    add_rdma_port(tmp_path, "mlx5_2", 1, {0: (LINK_LOCAL, "RoCE v2", "eth9")})  # RoCE without IPv4
    found = suggestions(tmp_path)
    assert "NCCL_IB_GID_INDEX" not in found  # InfiniBand needs none
    assert found["NCCL_IB_HCA"] == "=mlx5_1"  # exact: a prefix would also take mlx5_10


def test_socket_interface_without_rdma(tmp_path: Path) -> None:
    single_node(tmp_path)
    add_nic(tmp_path, "lo", "unknown", physical=False)
    add_nic(tmp_path, "docker0", "up", physical=False)
    add_nic(tmp_path, "enp1s0", "down")
    add_nic(tmp_path, "enp2s0", "up")
    assert suggestions(tmp_path) == {"NCCL_SOCKET_IFNAME": "enp2s0"}


def test_empty_tree_says_what_it_did_not_find(tmp_path: Path) -> None:
    code, text = run(["--sysfs-root", str(tmp_path)], {})
    assert code == 0
    assert "found no NVIDIA GPUs" in text
    assert "found no InfiniBand/RoCE devices" in text
    assert "nothing to suggest" in text


def test_bad_cuda_visible_devices_is_a_note(tmp_path: Path) -> None:
    single_node(tmp_path)
    add_gpu(tmp_path, "0000:01:00.0", 0, [0, 1])
    code, text = run(["--sysfs-root", str(tmp_path)], {"CUDA_VISIBLE_DEVICES": "3"})
    assert code == 0
    assert "index 3 is out of range" in text


def test_this_machine() -> None:
    code, text = run([], {"OMP_NUM_THREADS": "2"})
    assert code == 0
    assert "OMP_NUM_THREADS=2" in text
    assert "Allowed CPUs:" in text
    if not Path("/sys/bus/pci/devices").is_dir() or "0x10de" not in _vendors():
        assert "found no NVIDIA GPUs" in text


def _vendors() -> str:
    return " ".join(p.read_text() for p in Path("/sys/bus/pci/devices").glob("*/vendor"))
