"""A server's process tree from /proc, and the CPU it has used: shared by the
Python benches (peers.py, abuse.py, tcp_hold.py), which count a server's CPU
time, children included."""

import os


def descendants(pid):
    """pid and all its descendants, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_ticks(pid):
    """utime + stime of pid and its descendants, in clock ticks (a process
    that exits while it is read counts nothing)."""
    ticks = 0
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)
        except (OSError, IndexError, ValueError):
            continue
    return ticks
