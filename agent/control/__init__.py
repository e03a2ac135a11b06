"""Node 0's control plane, shared by the one-shot and resident agents (torch-free): the
authenticated wire (`wire`, `channel`, `framing`), the endpoint that serves it, the connection
record clients find it by (`connection`), and the answers to `agent stacks` (`stacks_service`)."""
