"""The go pipe, agent → rank, one per warm rank: nothing of the rank runs before the agent
writes to it. GO once the agent knows the rank's pid (the request came with the fork); for a
standby (forked ahead of its run, before any request), REQUEST, the request's length as 8
big-endian bytes, and the request as JSON. EOF, or anything else: the rank exits unrun."""

GO, REQUEST = b"g", b"r"
REQUEST_LIMIT = 64 << 20  # a rank's argv and environment, as JSON
