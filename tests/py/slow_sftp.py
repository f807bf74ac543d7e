#!/usr/bin/env python3
"""An sftp server that answers every request late: a source that is slow at every
call, for tests (a NAS across a slow link, a disk spinning up). sshfs runs it as its
server (`-o sftp_server=.../slow_sftp.py DELAY_FILE`, through NetFs's sshfs options);
it runs OpenSSH's sftp-server behind it and holds each request the client sends for
the seconds DELAY_FILE holds (none while the file is absent or empty), read as the
request arrives. Requests are held side by side, as on a link with that latency,
and passed on in the order they came (4 requests sent at once, held 1 s, are all
answered after 1.0 s). Through sshfs's mount they do not come side by side,
though: on the host, 4 stats of 4 names in parallel took 12 s at 3 s a call, so
the source a test sees is a queue of slow calls.

    slow_sftp.py DELAY_FILE
"""

import os
import subprocess
import sys
import threading
import time
from collections import deque

SERVERS = ["/usr/lib/openssh/sftp-server", "/usr/libexec/sftp-server", "/usr/lib/sftp-server"]


def delay(path):
    try:
        return float(open(path).read().strip() or 0)
    except (OSError, ValueError):
        return 0.0


def read_exactly(f, n):
    data = b""
    while len(data) < n:
        chunk = f.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def main():
    delay_file = sys.argv[1]
    server = next(s for s in SERVERS if os.path.exists(s))
    proc = subprocess.Popen([server], stdin=subprocess.PIPE, stdout=sys.stdout.buffer, bufsize=0)
    queue, cond = deque(), threading.Condition()

    def forward():
        while True:
            with cond:
                while not queue:
                    cond.wait()
                due, packet = queue.popleft()
            if packet is None:
                proc.stdin.close()
                return
            time.sleep(max(0.0, due - time.monotonic()))
            proc.stdin.write(packet)

    sender = threading.Thread(target=forward, daemon=True)
    sender.start()
    stdin = sys.stdin.buffer
    while True:
        head = read_exactly(stdin, 4)
        body = read_exactly(stdin, int.from_bytes(head, "big")) if head else None
        packet = head + body if body is not None else None
        due = time.monotonic() + (delay(delay_file) if packet else 0)
        with cond:
            queue.append((due, packet))
            cond.notify()
        if packet is None:
            break
    sender.join()
    proc.wait()


if __name__ == "__main__":
    main()
