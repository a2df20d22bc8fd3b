"""What SLURM says about the sweep's array tasks, read fresh at each look.

submitit reads a task's state through `sacct` alone, caches it, and on a cluster without
accounting keeps every task "UNKNOWN" (with a warning at each look) and waits on a task that
died without a result for ever. The sweep asks the scheduler itself instead:

- `sacct` where accounting exists (it keeps a task's state after it leaves the queue);
- else `scontrol show job`, which knows a task until MinJobAge (300 s by default) after it
  ended, and lists the pending ones;
- a task neither knows, with no result file, has left the queue: it ended (cancelled while
  pending, or forgotten) and is failed after GONE_GRACE_S, never waited on.

Also here: sbatch's refusals as one line that names the launcher field to change
(`explain_sbatch`), and submitit's repeated log lines folded into one (`FoldRepeats`).
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from dataclasses import dataclass

# a task in one of these has ended; its result file (if any) is final
ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
         "PREEMPTED", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"}
GONE = "GONE"  # in no list of the scheduler's: it left the queue, its state forgotten
GONE_GRACE_S = 60.0  # a task gone with no result is failed after this long (a slow file system
#                      may show the result file late)


@dataclass(frozen=True)
class TaskState:
    state: str  # SLURM's (RUNNING, CANCELLED, OUT_OF_MEMORY, ...), or GONE
    exit_code: str = ""  # "code:signal" as SLURM prints it; "" when unknown

    @property
    def ended(self) -> bool:
        return self.state in ENDED or self.state == GONE

    def describe(self) -> str:
        """The state and, where it says more, the exit code or signal: "CANCELLED (signal
        15)", "FAILED (exit code 1)", "GONE from the queue"."""
        if self.state == GONE:
            return "gone from SLURM's queue with no result (cancelled before it started, or " \
                   "ended long ago)"
        code, _, signal = self.exit_code.partition(":")
        if signal not in ("", "0"):
            return f"{self.state} (signal {signal})"
        if code not in ("", "0"):
            return f"{self.state} (exit code {code})"
        return self.state


def task_ids(text: str) -> list[int]:
    """Array task ids from SLURM's notation: "3", "1-3%2", "[0,2-4]" -> [3], [1, 2, 3], ..."""
    ids = []
    for part in text.strip("[]").split("%")[0].split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (high.isdigit() or not high):
            ids += range(int(low), int(high or low) + 1)
    return ids


def job_keys(job_id: str) -> list[str]:
    """submitit's ids for what SLURM prints as `job_id`: "7_[2-3%2]" -> ["7_2", "7_3"] (array
    tasks), "8" -> ["8"] (a job of its own: submitit submits an array of one that way)."""
    base, _, tasks = job_id.partition("_")
    return [f"{base}_{i}" for i in task_ids(tasks)] if tasks else [base]


def parse_sacct(text: str) -> dict[str, TaskState]:
    """`sacct -X -n -P -o JobID,State,ExitCode` lines ("7_0|CANCELLED by 0|0:15",
    "7_[2-3%2]|PENDING|0:0") as {job id: state}."""
    states = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) >= 3 and fields[0]:
            words = fields[1].split()  # "CANCELLED by 0": the state is the first word
            state = TaskState(words[0] if words else "UNKNOWN", fields[2])
            states.update(dict.fromkeys(job_keys(fields[0]), state))
    return states


def parse_scontrol(text: str) -> dict[str, TaskState]:
    """`scontrol show job -o <id>` (one line per task, or per pending range of an array) as
    {job id: state}."""
    states = {}
    for line in text.splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if "JobState" not in fields or "JobId" not in fields:
            continue
        state = TaskState(fields["JobState"], fields.get("ExitCode", ""))
        key = f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}" if "ArrayTaskId" in fields \
            else fields["JobId"]
        states.update(dict.fromkeys(job_keys(key), state))
    return states


def run(cmd: list[str]) -> str | None:
    """A command's output, or None when it is missing or fails (no accounting, job unknown)."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def job_states(job_ids: list[str]) -> dict[str, TaskState]:
    """The state of each of submitit's `job_ids` ("7_0", "8") as SLURM has it now: from sacct
    where accounting keeps it, else from scontrol; GONE for one neither lists."""
    bases = sorted({j.split("_")[0] for j in job_ids})
    states = parse_sacct(run(["sacct", "-j", ",".join(bases), "-X", "-n", "-P", "-o",
                              "JobID,State,ExitCode"]) or "")
    if not set(job_ids) <= states.keys():
        for base in bases:
            states = {**parse_scontrol(run(["scontrol", "show", "job", "-o", base]) or ""),
                      **states}
    return {j: states.get(j, TaskState(GONE)) for j in job_ids}


# sbatch's refusal (a line of its message) -> the launcher field that fixes it
SBATCH_FIXES = [
    ("generic resource", "hydra.launcher.gpus_per_node: no GPU of that kind here; on a CPU "
                         "cluster use hydra/launcher=slurm_cpu (or gpus_per_node=null)"),
    ("invalid partition", "hydra.launcher.partition: name one `sinfo` lists"),
    ("invalid account", "hydra.launcher.account: name one `sacctmgr show assoc user=$USER` "
                        "lists"),
    ("memory specification", "hydra.launcher.mem_gb: more than any node has"),
    ("node configuration is not available", "hydra.launcher.cpus_per_task, mem_gb or "
                                            "gpus_per_node: no node has that much"),
    ("time limit", "hydra.launcher.timeout_min: over the partition's limit"),
    ("qos", "hydra.launcher.qos: one your account may use"),
]


def explain_sbatch(message: str) -> str:
    """One line for sbatch's refusal of the array: what it said and the field to change."""
    lines = [re.sub(r"^sbatch: error:\s*", "", ln.strip()) for ln in message.splitlines()
             if "error" in ln.lower()] or [message.strip().splitlines()[-1]]
    said = lines[0]
    for pattern, fix in SBATCH_FIXES:
        if any(pattern in line.lower() for line in lines):
            return f"sbatch refused the array ({said}); change {fix}"
    return (f"sbatch refused the array ({said}); check the hydra.launcher.* resources "
            "(conf/hydra/launcher/slurm.yaml or slurm_cpu.yaml)")


class FoldRepeats(logging.Filter):
    """Let each kind of log line through once (numbers aside), and count the rest: submitit
    repeats its sacct warning at every look at a cluster without accounting."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = re.sub(r"\d+", "#", record.getMessage())
        self.seen[key] = self.seen.get(key, 0) + 1
        return self.seen[key] == 1

    def folded(self) -> int:
        """Lines held back so far."""
        return sum(n - 1 for n in self.seen.values())
