"""Paused ranks: `breakpoint()` and post-mortem pdb sessions inside a rank (`hook`), carried over a
unix socket in the agent's private directory (`frames`) to the node's agent (`link`: one paused
rank; `desk`: this node's paused ranks, and the requests node 0 relays through the attempt's
scope), described by `paused` (pure: where a rank stopped, the console line, collated answers)."""
