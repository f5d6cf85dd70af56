#!/usr/bin/env python3
"""Where a drained job's CPU goes, process by process, on PostgreSQL.

For each target, a drain of JOBS loaded jobs at 32 connections (fetch +
ack, `svc bench --workload drain`) while every process's CPU time is read
from /proc every 10 ms; the figures count the drain alone, in µs of CPU a
job: the database (its server processes together, with the backends it
has reaped), the svc node, and the load generator. Targets:

  plain    svc bench --target postgres: the hand-written queue, every
           statement its own transaction
  merged   svc bench --target postgres-merged: the same queue with the
           connections' requests merged as svc merges them
  pg       svc serve --postgres, one node, loaded by batch enqueue first
  local    svc serve on a data dir, loaded the same way

PostgreSQL runs from Debian's packages in a temp dir, with fsync and
synchronous_commit on, as in benches/postgres.sh. On a machine of N cores
a job can cost at most N / rate seconds of CPU in all: compare the sum
with that budget. Quote the ratios and the shares, not the figures.

  benches/postgres_cpu.py [JOBS] [ROUNDS] [TARGET ...]   (after cargo build --release)
"""

import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SVC = os.path.join(ROOT, "target", "release", "svc")
JOBS = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
TARGETS = sys.argv[3:] or ["plain", "merged", "pg", "local"]
TICK = os.sysconf("SC_CLK_TCK")
AS_POSTGRES = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stat_fields(pid):
    """The fields of /proc/PID/stat after the command name, or None once gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def own_ticks(pid):
    fields = stat_fields(pid)
    return None if fields is None else int(fields[11]) + int(fields[12])


class Database:
    """A PostgreSQL cluster in a temp dir, and the CPU of its processes."""

    def __init__(self):
        # The newest installed version, as benches/postgres.sh picks it.
        bins = glob.glob("/usr/lib/postgresql/*/bin")
        if not bins:
            sys.exit("postgres_cpu.py: install Debian's postgresql package")
        self.bin = max(bins, key=lambda path: int(path.split("/")[-2]))
        self.work = tempfile.mkdtemp()
        if AS_POSTGRES:
            shutil.chown(self.work, "postgres")
        self.port = free_port()
        self.databases = 0
        subprocess.run(AS_POSTGRES + [f"{self.bin}/initdb", "--auth=trust", "--username=postgres",
                                      "--no-instructions", "-D", f"{self.work}/pg"],
                       check=True, stdout=subprocess.DEVNULL)
        options = f"-p {self.port} -k {self.work} -c listen_addresses=127.0.0.1 -c max_connections=200"
        subprocess.run(AS_POSTGRES + [f"{self.bin}/pg_ctl", "-D", f"{self.work}/pg", "-l", f"{self.work}/pg.log",
                                      "-w", "-o", options, "start"], check=True, stdout=subprocess.DEVNULL)
        with open(f"{self.work}/pg/postmaster.pid") as pid_file:
            self.postmaster = int(pid_file.readline())

    def fresh(self):
        """The URL of a new, empty database."""
        self.databases += 1
        name = f"cpu_{self.databases}"
        subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-qc",
                        f"CREATE DATABASE {name}"], check=True, stdout=subprocess.DEVNULL)
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def ticks(self):
        """The postmaster's own time and its reaped children's, plus its live children's."""
        fields = stat_fields(self.postmaster)
        total = sum(int(value) for value in fields[11:15])
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                child = stat_fields(entry)
                if child is not None and int(child[1]) == self.postmaster:
                    total += int(child[11]) + int(child[12])
        return total

    def stop(self):
        subprocess.run(AS_POSTGRES + [f"{self.bin}/pg_ctl", "-D", f"{self.work}/pg", "-m", "fast", "-w", "stop"],
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(self.work, ignore_errors=True)


def load(address, jobs):
    for start in range(0, jobs, 1000):
        batch = [{"type": "bench.job", "args": [n], "options": {"queue": "bench"}}
                 for n in range(start, min(jobs, start + 1000))]
        request = urllib.request.Request(f"http://{address}/svc/v1/jobs/batch", method="POST",
                                         data=json.dumps({"jobs": batch}).encode(),
                                         headers={"content-type": "application/svc+json"})
        urllib.request.urlopen(request).read()


def serve(database, target):
    """Starts a node for `pg` or `local`, loads it; answers (process, address)."""
    port = free_port()
    data_dir = tempfile.mkdtemp()
    command = [SVC, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data_dir]
    if target == "pg":
        command += ["--postgres", database.fresh()]
    node = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"
    for _ in range(400):
        try:
            urllib.request.urlopen(f"http://{address}/svc/v1/health").read()
            break
        except OSError:
            time.sleep(0.05)
    load(address, JOBS)
    return node, address


def run(database, target):
    node = None
    if target in ("pg", "local"):
        node, address = serve(database, target)
        bench = [SVC, "bench", "--address", address, "--workload", "drain", "--jobs", "0", "--connections", "32"]
    else:
        kind = "postgres" if target == "plain" else "postgres-merged"
        bench = [SVC, "bench", "--address", database.fresh(), "--workload", "drain", "--jobs", str(JOBS),
                 "--connections", "32", "--target", kind]
    time.sleep(1.0)
    generator = subprocess.Popen(bench, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    samples = []
    while generator.poll() is None:
        node_ticks = own_ticks(node.pid) if node else 0
        samples.append((time.monotonic(), database.ticks(), node_ticks, own_ticks(generator.pid)))
        time.sleep(0.01)
    ended = time.monotonic()
    output = generator.stdout.read()
    if node:
        node.kill()
        node.wait()
    rate = float(re.findall(r" jobs/s=([0-9.]+)", output)[-1])
    # The drain is the last JOBS / rate seconds of the run (the plain and
    # merged targets load their table first, inside the generator).
    started = ended - JOBS / rate
    first = min(samples, key=lambda sample: abs(sample[0] - started))
    last = next(sample for sample in reversed(samples) if sample[3] is not None)
    jobs_counted = rate * (last[0] - first[0])
    per_job = [(last[i] - first[i]) / TICK / jobs_counted * 1e6 for i in (1, 2, 3)]
    return rate, per_job


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def main():
    database = Database()
    results = {target: [] for target in TARGETS}
    try:
        for round_number in range(1, ROUNDS + 1):
            for target in TARGETS:
                rate, (db, node, generator) = run(database, target)
                results[target].append((rate, db, node, generator))
                print(f"round {round_number} {target:6} jobs/s={rate:.0f} cpu_us_per_job: database={db:.0f} "
                      f"node={node:.0f} load_generator={generator:.0f} total={db + node + generator:.0f}",
                      flush=True)
        for target in TARGETS:
            rate, db, node, generator = (median(column) for column in zip(*results[target]))
            print(f"median {target:6} jobs/s={rate:.0f} cpu_us_per_job: database={db:.0f} node={node:.0f} "
                  f"load_generator={generator:.0f}")
    finally:
        database.stop()


if __name__ == "__main__":
    main()
