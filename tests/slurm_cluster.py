"""A real single-node SLURM on this machine for the tests: munged, slurmctld and slurmd
(Debian's slurm-wlm, which `make test` installs where apt-get can), each started with a
config, key, ports and state folders of its own under a temporary folder, and stopped by
their process ids. Commands that should talk to it get `cluster.env` (SLURM_CONF)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")
PARTITION = "cpu"  # the partition the documented CPU command names


def missing() -> list[str]:
    """The SLURM and munge programs not on this machine (their sbin folders included)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [name for name in DAEMONS if shutil.which(name, path=path) is None]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def memory_mb() -> int:
    """A node memory slurmd will accept: 80% of what the machine has."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(int(line.split()[1]) / 1024 * 0.8)
    raise RuntimeError("no MemTotal in /proc/meminfo")


@dataclass
class Cluster:
    root: Path
    env: dict[str, str]  # os.environ with SLURM_CONF set to this cluster's config

    def run(self, *cmd: str) -> str:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True,
                              check=True, timeout=60).stdout

    def pids(self, array_id: str, task: int) -> list[int]:
        """The processes of an array task, found by the SLURM variables in their environment."""
        wanted = {f"SLURM_ARRAY_JOB_ID={array_id}".encode(), f"SLURM_ARRAY_TASK_ID={task}".encode()}
        found = []
        for environ in Path("/proc").glob("[0-9]*/environ"):
            with contextlib.suppress(OSError):
                if wanted <= set(environ.read_bytes().split(b"\0")):
                    found.append(int(environ.parent.name))
        return found

    def states(self) -> dict[str, str]:
        """{job id: state} of every job in the queue (array tasks as <array>_<task>)."""
        out = self.run("squeue", "-h", "-r", "-o", "%i %T")
        return dict(line.split() for line in out.splitlines() if line.strip())


def write_config(root: Path, host: str, cpus: int) -> Path:
    conf = root / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=critbatch-test", f"SlurmctldHost={host}", "SlurmUser=root",
        "SlurmdUser=root", "AuthType=auth/munge", f"AuthInfo=socket={root}/munge/sock",
        "CredType=cred/munge", f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
        f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/slurmctld.log", f"SlurmdLogFile={root}/slurmd.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
        "SchedulerType=sched/backfill", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU_Memory", "JobAcctGatherType=jobacct_gather/none",
        # no accounting: the state comes from scontrol and squeue, as on many small clusters
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
        "ReturnToService=2", "MinJobAge=600", "SchedulerParameters=sched_interval=1",
        f"NodeName={host} CPUs={cpus} RealMemory={memory_mb()} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP", "",
    ]))
    return conf


def alive(pid: int) -> bool:
    """The process runs (a zombie, ended but not reaped by its parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def processes_of(conf: Path) -> list[int]:
    """The processes (job steps, tasks) started under this cluster: SLURM_CONF=conf in their
    environment; this process and its parents aside."""
    wanted, mine = f"SLURM_CONF={conf}".encode(), {os.getpid(), os.getppid()}
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            pid = int(environ.parent.name)
            if pid not in mine and wanted in environ.read_bytes().split(b"\0"):
                found.append(pid)
    return found


def pid_of(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().split()[0])
    return None


@contextlib.contextmanager
def local_cluster(root: Path, cpus: int | None = None) -> Iterator[Cluster]:
    """Start munged, slurmctld and slurmd under `root`; yield the cluster once its node is
    idle; stop the three (and any job left) by their pids."""
    host = socket.gethostname().split(".")[0]
    for sub in ("munge", "state", "spool"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "munge").chmod(0o700)
    key = root / "munge" / "key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = write_config(root, host, cpus or os.cpu_count() or 1)
    env = {**os.environ, "SLURM_CONF": str(conf),
           "PATH": os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])}
    pids = {"munged": root / "munge" / "pid", "slurmctld": root / "slurmctld.pid",
            "slurmd": root / "slurmd.pid"}
    try:
        subprocess.run(["munged", "--force", f"--key-file={key}", f"--socket={root}/munge/sock",
                        f"--pid-file={pids['munged']}", f"--log-file={root}/munge/log",
                        f"--seed-file={root}/munge/seed"], env=env, check=True, timeout=30)
        subprocess.run(["slurmctld", "-c"], env=env, check=True, timeout=30)
        subprocess.run(["slurmd", "-c"], env=env, check=True, timeout=30)
        cluster = Cluster(root, env)
        deadline = time.monotonic() + 60
        while cluster.run("sinfo", "-h", "-o", "%t").strip() != "idle":
            if time.monotonic() > deadline:
                raise RuntimeError("the test SLURM node never came up: "
                                   + (root / "slurmd.log").read_text()[-1000:])
            time.sleep(0.5)
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["scancel", "--full", "-u", "root"], env=env, timeout=30)
        for name in ("slurmd", "slurmctld", "munged"):
            pid = pid_of(pids[name])
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        for name in ("slurmd", "slurmctld", "munged"):  # gone, or killed outright
            pid = pid_of(pids[name])
            deadline = time.monotonic() + 10
            while pid and time.monotonic() < deadline and alive(pid):
                time.sleep(0.1)
            if pid and alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for pid in processes_of(conf):  # a job step slurmd left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
