"""A rank for the debug benchmark: rank 1 runs `x = 42; breakpoint(); print("after", x)`; rank 0
waits, silent, until rank 1 went on (as it would in its next collective)."""

import os
import time

done = os.path.join(os.environ["AGENT_LOG_DIR"], "went-on")
if os.environ["RANK"] == "1":
    x = 42
    breakpoint()
    print("after", x, flush=True)
    open(done, "w").close()
else:
    while not os.path.exists(done):
        time.sleep(0.05)
