"""DistributedDataParallel on synthetic data: the smallest real training job for the agent.

    python -m agent --nproc-per-node 2 scripts/examples/ddp_train.py configs/data.yml configs/model.yml \
        -- --epochs 3 --out ckpt/

A tiny MLP learns a fixed random linear map (deterministic seed) with a DistributedSampler, so
each rank sees its own shard; rank 0 prints the mean loss of each epoch and saves one checkpoint
to --out DIR (default $AGENT_LOG_DIR, else the working directory). Hyperparameters come from the
command line, else the resolved config the agent names in $AGENT_CONFIG, else defaults:

    train_micro_batch_size_per_gpu   batch size per rank
    optimizer.type / .params.lr      adam, adamw or sgd, and its learning rate (betas for adam)
    hidden_size, num_samples, data_seed

gloo on CPU, NCCL on GPUs. Exits 1 if the ranks' parameters end up different.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

FEATURES = 16
CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class Hyper:
    micro_batch: int = 8
    lr: float = 0.01
    optimizer: str = "adam"
    betas: tuple[float, float] = (0.9, 0.999)
    hidden: int = 32
    samples: int = 256
    seed: int = 1234
    epochs: int = 3


def load_config(path: str | None) -> dict[str, Any]:
    """The agent's resolved config (JSON), or {} when there is none."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def hyper_from_config(config: Mapping[str, Any], base: Hyper = Hyper()) -> Hyper:
    """The config's say on the hyperparameters; keys it lacks keep `base`'s values."""
    optimizer = config.get("optimizer") or {}
    params = optimizer.get("params") or {}
    betas = params.get("betas")
    return replace(
        base,
        micro_batch=int(config.get("train_micro_batch_size_per_gpu", base.micro_batch)),
        lr=float(params.get("lr", base.lr)),
        optimizer=str(optimizer.get("type", base.optimizer)).lower(),
        betas=(float(betas[0]), float(betas[1])) if betas else base.betas,
        hidden=int(config.get("hidden_size", base.hidden)),
        samples=int(config.get("num_samples", base.samples)),
        seed=int(config.get("data_seed", base.seed)),
    )


def hyper_from_args(args: argparse.Namespace, base: Hyper) -> Hyper:
    """Command-line values win over the config's."""
    given = {
        k: v for k, v in vars(args).items() if k in Hyper.__dataclass_fields__ and v is not None
    }
    return replace(base, **given)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, help=f"passes over the data (default {Hyper.epochs})")
    p.add_argument("--samples", type=int, help="synthetic samples in all (config num_samples)")
    p.add_argument(
        "--micro-batch",
        dest="micro_batch",
        type=int,
        help="batch per rank (config train_micro_batch_size_per_gpu)",
    )
    p.add_argument("--lr", type=float, help="learning rate (config optimizer.params.lr)")
    p.add_argument(
        "--out", default=os.environ.get("AGENT_LOG_DIR") or os.getcwd(), help="checkpoint directory"
    )
    return p.parse_args(argv)


def synthetic_data(samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x ~ N(0, 1), y = x·w + small noise, the same on every rank for one seed."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=gen)
    w = torch.randn(FEATURES, 1, generator=gen)
    return x, x @ w + 0.01 * torch.randn(samples, 1, generator=gen)


def make_optimizer(hyper: Hyper, params) -> torch.optim.Optimizer:
    import torch

    if hyper.optimizer == "sgd":
        return torch.optim.SGD(params, lr=hyper.lr)
    kind = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}.get(hyper.optimizer)
    if kind is None:
        raise SystemExit(f"ddp_train: optimizer {hyper.optimizer!r}: use adam, adamw or sgd")
    return kind(params, lr=hyper.lr, betas=hyper.betas)


def mean_across_ranks(total: float, count: int, device: torch.device) -> float:
    import torch
    import torch.distributed as dist

    pair = torch.tensor([total, float(count)], dtype=torch.float64, device=device)
    dist.all_reduce(pair)
    return float(pair[0] / pair[1])


def params_in_sync(model: torch.nn.Module, device: torch.device) -> bool:
    """Every rank's flattened parameters, gathered: DDP must have kept them identical."""
    import torch
    import torch.distributed as dist

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).to(device)
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return all(torch.equal(gathered[0], other) for other in gathered[1:])


def save_checkpoint(out_dir: str, state: Mapping[str, Any]) -> str:
    """Atomic: a reader never sees half a checkpoint."""
    import torch

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, CHECKPOINT)
    torch.save(dict(state), path + ".tmp")
    os.replace(path + ".tmp", path)
    return path


def train(hyper: Hyper, out_dir: str, config_path: str | None) -> int:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    # modulo: under srun --gpus-per-task each rank sees only its own GPU, as cuda:0
    device = (
        torch.device("cuda", local_rank % torch.cuda.device_count())
        if cuda
        else torch.device("cpu")
    )
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(hyper.seed)
    if rank == 0:
        print(
            f"ddp_train: {world} ranks, {asdict(hyper)} (config {config_path or 'none'})",
            flush=True,
        )

    data = TensorDataset(*synthetic_data(hyper.samples, hyper.seed))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=hyper.seed)
    loader = DataLoader(data, batch_size=hyper.micro_batch, sampler=sampler)
    net = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, hyper.hidden), torch.nn.ReLU(), torch.nn.Linear(hyper.hidden, 1)
    ).to(device)
    model = DDP(net, device_ids=[device.index] if cuda else None)
    optimizer = make_optimizer(hyper, model.parameters())
    loss_fn = torch.nn.MSELoss()

    for epoch in range(hyper.epochs):
        sampler.set_epoch(epoch)
        total, count = 0.0, 0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            total, count = total + loss.item() * len(x), count + len(x)
        mean = mean_across_ranks(total, count, device)
        if rank == 0:
            print(f"epoch {epoch} loss {mean:.6f}", flush=True)

    in_sync = params_in_sync(model, device)
    if rank == 0:
        state = {
            "model": net.state_dict(),
            "optimizer": optimizer.state_dict(),
            "epochs": hyper.epochs,
            "world_size": world,
            "hyper": asdict(hyper),
        }
        print(f"saved checkpoint {save_checkpoint(out_dir, state)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if not in_sync:
        print("ddp_train: parameters differ between ranks", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    config_path = os.environ.get("AGENT_CONFIG")
    hyper = hyper_from_args(args, hyper_from_config(load_config(config_path)))
    return train(hyper, args.out, config_path)


if __name__ == "__main__":
    sys.exit(main())
