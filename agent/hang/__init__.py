"""Hang dumps: every rank's Python stacks, captured per node and collated on node 0.

`capture` dumps a node's ranks with py-spy (a faulthandler signal where py-spy cannot attach),
`stacks` holds the bounded records that travel between nodes, and `collate` groups identical
stacks `dshbak -c` style, smallest groups (the odd ones out) first. Nothing here imports torch.
"""
