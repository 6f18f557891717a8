"""bench/_harness.py's process accounting: a server's CPU and memory are its whole process tree's, so that a server
that moves work into a child process (an engine core) is not measured as cheaper for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# bench/ only while importing: left on sys.path, its operator.py would shadow the standard library's in every child
# process a later test of this worker starts with sys.path as its PYTHONPATH.
BENCH = str(Path(__file__).resolve().parents[1] / "bench")
sys.path.insert(0, BENCH)
try:
    from _harness import cpu_seconds, process_tree, rss_mb
finally:
    sys.path.remove(BENCH)

#: A parent that starts a child which burns CPU and holds 200 MiB; the parent itself only waits.
PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", '''
import time
held = bytearray(200 * 2**20)
for i in range(0, len(held), 4096):
    held[i] = 1
print("ready", flush=True)
end = time.process_time() + 0.6
while time.process_time() < end:
    pass
print("burnt", flush=True)
time.sleep(60)
'''], stdout=sys.stdout)
child.wait()
"""


def test_the_cpu_and_memory_of_a_process_tree_count_its_children():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        assert parent.stdout.readline().strip() == "burnt"
        tree = process_tree(parent.pid)
        assert len(tree) == 2 and tree[0] == parent.pid
        assert cpu_seconds(tree) - cpu_seconds([parent.pid]) >= 0.5
        assert rss_mb(tree) - rss_mb([parent.pid]) >= 200
    finally:
        for pid in process_tree(parent.pid)[::-1]:
            subprocess.run(["kill", "-9", str(pid)], check=False)
        parent.wait()
    assert cpu_seconds([parent.pid]) == 0 and rss_mb([parent.pid]) == 0  # gone: nothing counted, nothing raised
