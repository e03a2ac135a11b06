"""launch-agent: one agent per node launches, supervises and logs every rank of a PyTorch job."""
