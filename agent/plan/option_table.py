"""The agent's options as one table: it drives the CLI flags, the configs' `launcher:` section,
the ranges every value is checked against, and the help text."""

from __future__ import annotations

from agent.plan.option import DAY, Option, OptionScope, number_text  # noqa: F401  (re-exported)

MAX_CONFIG_BYTES = 16 * 1024 * 1024  # --max-config-bytes' default
# Seconds between two heartbeats of an agent (agent.node.membership: node 0 reads every beat at
# this pace too). --heartbeat-timeout is at least two of them: a node is declared lost only
# after a whole beat went by unseen, never between two beats on time.
HEARTBEAT_PERIOD = 1.0


OPTIONS: tuple[Option, ...] = (
    Option(
        "nproc_per_node",
        str,
        "auto",
        "ranks per node: N, 'gpu' (one per visible GPU, error if none) or 'auto' (GPUs, else 1)",
    ),
    Option(
        "log_dir",
        str,
        None,
        "where rank files, agent logs and summary.json go (default logs/ID: logs/8.0 for job 8's step 0)",
    ),
    Option(
        "console_ranks",
        str,
        "all",
        "ranks shown on the console: 'all', 'none' or a list like 0,3-5 (files always get every rank)",
    ),
    Option("grace", float, 5.0, "seconds between SIGTERM and SIGKILL at teardown", low=0, high=DAY),
    Option(
        "max_restarts",
        int,
        0,
        "restart the whole world together up to K times after a program failure (an exception "
        "or exit code from a rank whose peers were healthy); the same failure twice in a row "
        "stops the job (exit 5) unless --restart-same-failure",
        low=0,
        high=10000,
    ),
    Option(
        "max_infra_restarts",
        int,
        3,
        "restart the whole world up to K times after an infrastructure failure (a lost node, "
        "a hang, a collective error after a peer died), counted apart from --max-restarts",
        low=0,
        high=10000,
    ),
    Option(
        "restart_same_failure",
        bool,
        False,
        "restart even when two attempts in a row failed the same way (the same exception at "
        "the same line of the script, or the same exit code); default: stop, exit 5",
    ),
    Option(
        "checkpoint_dir",
        str,
        None,
        "where the ranks write checkpoints: after a --preempt-signal, node 0 says whether a "
        "file there was written after it ('checkpoint written: DIR/...' or 'no checkpoint "
        "written after the signal') in the summary, the history and the console, and the next "
        "job with this dir names an unsaved stop first",
    ),
    Option(
        "preempt_signal",
        str,
        "USR2",
        "with --checkpoint-dir: the signal that announces preemption or the time limit "
        "(bootstrap's --requeue sends USR2)",
        ("USR2", "USR1", "TERM"),
    ),
    # Failures at scale: hot spares, exclusions, shrinking, health checks.
    Option(
        "spares",
        int,
        0,
        "keep the last K agents idle as hot spares: one takes the place of a node that is lost, "
        "fails its health check or is excluded (node 0 cannot be replaced)",
        low=0,
        high=1_000_000,
    ),
    Option(
        "min_nodes",
        int,
        0,
        "with no spare left, go on with the nodes left while there are at least M "
        "(configs parsed again for the smaller world; 0: never shrink)",
        low=0,
        high=1_000_000,
    ),
    Option(
        "exclude",
        str,
        None,
        "hosts never to run ranks on, e.g. 'gpu[003,017]' (a spare takes their place)",
    ),
    Option(
        "health_check",
        str,
        None,
        "a command every node runs before every attempt: non-zero or too slow means the node is "
        "excluded (its last output lines go to summary.json)",
    ),
    Option(
        "health_timeout",
        float,
        60.0,
        "seconds a node's health checks may take",
        low=0,
        high=DAY,
        above=True,
    ),
    Option(
        "min_free_mib",
        int,
        0,
        "a node whose log dir or /dev/shm has less free space (MiB) fails its health check "
        "(0: not checked; a full log disk alone never stops a job)",
        low=0,
        high=1 << 40,
    ),
    Option(
        "numa_binding",
        str,
        "auto",
        "bind each rank's CPUs and memory: auto, off, node, socket, exclusive",
        ("auto", "off", "node", "socket", "exclusive"),
    ),
    Option("numa_strict", bool, False, "strict memory binding (membind) instead of preferred"),
    Option(
        "config_parser",
        str,
        "default",
        "how configs become the payload: default, savanna, or module:function",
    ),
    Option(
        "max_config_bytes",
        int,
        MAX_CONFIG_BYTES,
        "the largest config file read, in bytes (a guard against huge files and devices)",
        in_config=False,  # it guards reading the configs, so it cannot come from one
        low=1,
        high=1 << 30,
    ),
    Option(
        "deepspeed", bool, False, "pass --local_rank=N to the script, as DeepSpeed's launcher does"
    ),
    Option("no_python", bool, False, "run the script as a program, not with python"),
    Option("module", bool, False, "the script is a module name: run it like python -m"),
    Option(
        "rank_prefix",
        str,
        None,
        "command prefix per rank, e.g. 'nsys profile -o out-{rank}' ({rank}, {local_rank}, {node})",
    ),
    Option(
        "rank_prefix_ranks", str, "all", "which ranks get --rank-prefix: 'all' or a list like 0,8"
    ),
    Option(
        "hang_warning",
        float,
        300.0,
        "warn when a rank prints nothing for this many seconds",
        low=0,
        high=365 * DAY,
        above=True,
    ),
    Option(
        "flight_recorder",
        bool,
        True,
        "torch's flight recorder on in every rank, and a probe there that answers the agent with "
        "its last collectives: `agent stacks` and hangs say which collective, and who never came",
    ),
    Option(
        "hang_timeout",
        float,
        0.0,
        "when no rank of the job made progress for this many seconds: capture every rank's "
        "stack, report the hang as the root cause, tear down (0: never)",
        low=0,
        high=365 * DAY,
    ),
    Option(
        "pdb",
        bool,
        False,
        "a rank's uncaught exception pauses it in pdb at the frame that raised (`python -m agent "
        "debug LOG_DIR --rank R`); the job waits until it is continued or quit, or "
        "--debug-timeout passes, then fails as it would have",
    ),
    Option(
        "debug_timeout",
        float,
        600.0,
        "with --pdb: the most seconds a failed rank stays paused in pdb",
        low=0,
        high=365 * DAY,
        above=True,
    ),
    Option(
        "progress_regex",
        str,
        None,
        "what counts as progress for --hang-timeout: an output line matching this regular "
        "expression, RE2 syntax (linear time; no backreferences or lookaround; default: any "
        "output)",
    ),
    Option(
        "straggler_factor",
        float,
        1.5,
        "with --progress-regex (a group named `step` numbers the steps): a rank or node whose "
        "median step time (its last 20 steps) exceeds this many times the job's median is "
        "named a straggler",
        low=1,
        high=1000,
        above=True,
    ),
    Option(
        "restart_without_progress",
        bool,
        False,
        "with --max-restarts and --progress-regex: restart even when this attempt and the one "
        "before both failed before any progress line (default: stop, exit 5)",
    ),
    Option(
        "metrics_port",
        int,
        None,
        "node 0 serves Prometheus metrics at http://ADDR:PORT/metrics while the run lasts "
        "(0: any free port, named on the console) and writes LOG_DIR/metrics.prom at its end",
        low=0,
        high=65535,
    ),
    Option(
        "metrics_addr",
        str,
        None,
        "the address /metrics listens on (default: node 0's address in the job, the one the "
        "other nodes reach it at; 0.0.0.0: every interface)",
    ),
    Option(
        "cold",
        bool,
        False,
        "start every rank as a fresh interpreter, never forked from the warm one",
        scope=OptionScope.BOTH,
    ),
    Option(
        "preload",
        str,
        "auto",
        "modules the warm interpreter imports before ranks are forked from it: 'auto' (torch when "
        "it can be imported), 'none', or a list like torch,numpy",
        in_config=False,
        scope=OptionScope.NODE,
    ),
    Option("live", bool, True, "on a terminal, a live per-rank status table above the log lines"),
    Option(
        "sysfs_root",
        str,
        "/",
        "where sys/ is read from for GPU/NUMA topology (a host sysfs mounted elsewhere, or a fake tree in tests)",
    ),
    Option(
        "world",
        str,
        "auto",
        "where the world comes from",
        ("auto", "slurm", "slurm-task", "k8s", "mpi", "mpi-task", "explicit", "local"),
        False,
        scope=OptionScope.NODE,
    ),
    Option(
        "nnodes",
        int,
        None,
        "number of nodes (explicit world, e.g. ssh/tmux launches)",
        in_config=False,
        low=1,
        high=1_000_000,
        scope=OptionScope.NODE,
    ),
    Option(
        "node_rank",
        int,
        None,
        "this node's rank (explicit world)",
        in_config=False,
        low=0,
        high=999_999,
        scope=OptionScope.NODE,
    ),
    Option(
        "master_addr",
        str,
        None,
        "node 0's address (explicit world, OpenMPI)",
        in_config=False,
        scope=OptionScope.NODE,
    ),
    Option(
        "master_port",
        int,
        None,
        "the job store's port on node 0 (default: derived from job and step id)",
        in_config=False,
        low=1,
        high=65535,
        scope=OptionScope.NODE,
    ),
    Option(
        "job_id",
        str,
        None,
        "this job's identity where the scheduler gives none (explicit, k8s, mpi, local): every agent of the job passes the same; two jobs on one master stay apart (store keys and derived port)",
        in_config=False,
        scope=OptionScope.NODE,
    ),
    Option(
        "rdzv_timeout",
        float,
        300.0,
        "seconds to wait for every node to arrive",
        in_config=False,
        low=0,
        high=7 * DAY,
        above=True,
        scope=OptionScope.NODE,
    ),
    Option(
        "heartbeat_timeout",
        float,
        6.0,
        "a node silent this long is declared lost (heartbeats tick every "
        f"{number_text(HEARTBEAT_PERIOD)} s)",
        in_config=False,
        low=2 * HEARTBEAT_PERIOD,
        high=DAY,
        scope=OptionScope.NODE,
    ),
)

assert all(not o.in_config for o in OPTIONS if o.scope is OptionScope.NODE), (
    "a node's option comes from its command line, never from a run's configs"
)
