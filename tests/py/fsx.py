"""Random operations on one file, each checked against an in-memory model (after fsx).

    fsx.py FILE [--ops N] [--seconds S] [--seed K] [--max-size BYTES]

Writes, truncates (down and up), mmap writes with msync, reads and whole-file reads,
fsyncs, and closes and reopens (which, on a stagefs mount, stage the file again or
serve it from the copy filled as it was written), chosen at random from --seed, on
FILE, which is created. Every read is compared with the model; the first mismatch
ends the run with the operations that led to it. Bounded by --ops and --seconds,
whichever comes first. Prints one JSON line: ops run, the seed, and "ok".
"""

import argparse
import json
import mmap
import os
import random
import sys
import time

PAGE = mmap.PAGESIZE


class Mismatch(Exception):
    pass


class Fsx:
    def __init__(self, path, rng, max_size):
        self.path, self.rng, self.max_size = path, rng, max_size
        self.model = bytearray()
        self.log = []
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

    def note(self, text):
        self.log.append(text)
        del self.log[:-40]

    def span(self, limit):
        offset = self.rng.randrange(0, max(limit, 1))
        length = self.rng.randrange(1, 256 << 10)
        return offset, length

    def write(self):
        offset, length = self.span(self.max_size - 1)
        length = min(length, self.max_size - offset)
        data = self.rng.randbytes(length)
        self.note(f"write {offset} +{length}")
        os.pwrite(self.fd, data, offset)
        if offset > len(self.model):
            self.model.extend(bytes(offset - len(self.model)))
        self.model[offset : offset + length] = data

    def truncate(self):
        size = self.rng.randrange(0, self.max_size)
        self.note(f"truncate {size}")
        os.ftruncate(self.fd, size)
        if size < len(self.model):
            del self.model[size:]
        else:
            self.model.extend(bytes(size - len(self.model)))

    def mapped_write(self):
        if len(self.model) < PAGE:
            return self.write()
        offset, length = self.span(len(self.model))
        length = min(length, len(self.model) - offset)
        start = offset - offset % PAGE
        data = self.rng.randbytes(length)
        self.note(f"mapwrite {offset} +{length}")
        with mmap.mmap(self.fd, offset + length - start, offset=start) as m:
            m[offset - start : offset - start + length] = data
            m.flush()
        self.model[offset : offset + length] = data

    def read(self):
        offset, length = self.span(len(self.model) + 4096)
        self.note(f"read {offset} +{length}")
        got = os.pread(self.fd, length, offset)
        self.expect(got, bytes(self.model[offset : offset + length]), f"read {offset} +{length}")

    def read_all(self):
        self.note("read all")
        with open(self.path, "rb") as f:
            got = f.read()
        self.expect(got, bytes(self.model), "read of the whole file by a new open")

    def reopen(self):
        self.note("close, reopen")
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_RDWR)
        self.expect(os.fstat(self.fd).st_size, len(self.model), "size after a reopen")

    def fsync(self):
        self.note("fsync")
        os.fsync(self.fd)

    def expect(self, got, wanted, what):
        if got != wanted:
            where = ""
            if isinstance(got, bytes):
                first = next((i for i, (a, b) in enumerate(zip(got, wanted)) if a != b), min(len(got), len(wanted)))
                where = f" (lengths {len(got)} and {len(wanted)}, first difference at {first})"
            raise Mismatch(f"{what}{where}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--max-size", type=int, default=4 << 20)
    args = parser.parse_args()
    fsx = Fsx(args.file, random.Random(args.seed), args.max_size)
    ops = [
        (fsx.write, 30),
        (fsx.mapped_write, 10),
        (fsx.truncate, 8),
        (fsx.read, 30),
        (fsx.read_all, 6),
        (fsx.reopen, 10),
        (fsx.fsync, 6),
    ]
    actions, weights = zip(*ops)
    deadline = time.monotonic() + args.seconds
    done = 0
    try:
        # A file of the stage size or more from the start, so reopens stage it.
        fsx.write()
        while done < args.ops and time.monotonic() < deadline:
            fsx.rng.choices(actions, weights)[0]()
            done += 1
        fsx.read_all()
    except (Mismatch, OSError) as e:
        print(json.dumps({"ok": False, "seed": args.seed, "ops": done, "error": str(e), "last": fsx.log}))
        sys.exit(1)
    print(json.dumps({"ok": True, "seed": args.seed, "ops": done, "size": len(fsx.model)}))


if __name__ == "__main__":
    main()
