# Usage: python3 bench/py/loopback_ceiling.py FILE copy|sendfile CONNECTIONS MIB
# Ceiling of loopback READ serving: N connections, one 1 MiB request in flight each.
# mode sendfile: the server sendfile()s from the page cache; mode copy: pread into a
# buffer, copy it (as packing does), send. The client recv_into()s and copies once
# (as unpacking does).
import os, socket, sys, time, multiprocessing as mp
path, mode, n, total_mib = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
CH = 1 << 20
size = os.path.getsize(path)

def server(sock):
    fd = os.open(path, os.O_RDONLY)
    buf = bytearray(CH)
    while True:
        req = sock.recv(8)
        if not req:
            return
        off = int.from_bytes(req, 'little') % (size - CH)
        if mode == 'sendfile':
            sent = 0
            while sent < CH:
                sent += os.sendfile(sock.fileno(), fd, off + sent, CH - sent)
        else:
            got = os.preadv(fd, [buf], off)
            sock.sendall(bytes(buf))

def client(port, q):
    s = socket.create_connection(('127.0.0.1', port))
    buf = bytearray(CH); out = bytearray(CH)
    per = total_mib // n
    t = time.perf_counter()
    for i in range(per):
        s.sendall(((i * n) * CH).to_bytes(8, 'little'))
        view = memoryview(buf); got = 0
        while got < CH:
            got += s.recv_into(view[got:], CH - got)
        out[:] = buf
    q.put((per, time.perf_counter() - t))

if __name__ == '__main__':
    ls = socket.socket(); ls.bind(('127.0.0.1', 0)); ls.listen(64)
    port = ls.getsockname()[1]
    q = mp.Queue()
    cs = [mp.Process(target=client, args=(port, q)) for _ in range(n)]
    for c in cs: c.start()
    ss = []
    for _ in range(n):
        conn, _ = ls.accept()
        p = mp.Process(target=server, args=(conn,)); p.start(); ss.append(p)
    res = [q.get() for _ in range(n)]
    for c in cs: c.join()
    mib = sum(r[0] for r in res); secs = max(r[1] for r in res)
    print(f"{mode} n={n}: {mib/secs:.0f} MiB/s")
    for p in ss: p.terminate()
