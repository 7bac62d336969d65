"""A process's resident memory and CPU time, from /proc (Linux)."""
import os


def rss_bytes(pid="self"):
    """Resident set size (VmRSS) of process `pid` ("self": this one), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS line (a kernel thread, or a zombie)")


def cpu_seconds(pid):
    """utime + stime of process `pid`, all threads, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
