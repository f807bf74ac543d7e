"""hub_client.py's clients, for the write-through fault tests (tests/tests/write_faults.rs),
with a model big enough that a download over a capped link takes seconds, and a
download that can be paused half-way. Each mode prints one JSON line last.

    fault_client.py make-model DIR   as hub_client.py, with 16 MiB of weights
    fault_client.py snapshot REPO    snapshot_download(REPO), online
    fault_client.py load REPO        offline load, as hub_client.py (these weights)
    fault_client.py paused REPO      snapshot_download(REPO), whose weights' download
                                     stops once PAUSE_AT bytes are written to the
                                     .incomplete file (flushed), prints
                                     {"paused": PATH, "bytes": N}, and goes on when a
                                     line (or EOF) arrives on stdin

The hub modes read HF_ENDPOINT and HF_HUB_CACHE from the environment.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hub_client  # noqa: E402


# hub_client's model, with 16 MiB of weights (its tensors() reads this at each call).
os.environ["MODEL_MIB"] = "16"


class PausedFile:
    """A file object that stops once `at` bytes have gone through it."""

    def __init__(self, f, at):
        self.f, self.at, self.n = f, at, 0

    def write(self, data):
        view = memoryview(data)
        if self.n < self.at <= self.n + len(view):
            head = self.at - self.n
            self.f.write(view[:head])
            self.f.flush()
            self.n += head
            view = view[head:]
            print(json.dumps({"paused": self.f.name, "bytes": self.n}), flush=True)
            sys.stdin.readline()
        self.f.write(view)
        self.n += len(view)
        return len(data)

    def __getattr__(self, name):
        return getattr(self.f, name)


def paused(repo):
    import huggingface_hub.file_download as fd

    at = int(os.environ["PAUSE_AT"])
    http_get = fd.http_get

    def pausing_http_get(url, temp_file, **kwargs):
        if url.endswith(".safetensors"):
            temp_file = PausedFile(temp_file, at)
        return http_get(url, temp_file, **kwargs)

    # _download_to_tmp_and_move looks http_get up in its module at each call.
    fd.http_get = pausing_http_get
    return hub_client.snapshot(repo)


MODES = {
    "make-model": hub_client.make_model,
    "snapshot": hub_client.snapshot,
    "load": hub_client.load,
    "paused": paused,
}

if __name__ == "__main__":
    hub_client.main(MODES)
