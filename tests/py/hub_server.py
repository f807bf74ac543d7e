"""A local Hub endpoint for tests: serves one generated model repository with the
routes huggingface_hub's download path uses (checked against its source:
`HfApi.repo_info`, `HfApi.list_repo_tree`, `get_hf_file_metadata`, `http_get`), so
`HF_ENDPOINT=http://127.0.0.1:PORT hf download REPO` works without a network.

    python hub_server.py DIR REPO [--lfs-min BYTES] [--rate BYTES_PER_SECOND]

DIR holds the repository's files (any depth). Files of at least --lfs-min bytes, and
every *.safetensors, are served as LFS files (their ETag is their sha256, as on the
Hub); the others as git blobs (ETag: the git blob sha1). The commit is derived from
the content, so one DIR always gives one commit. --rate paces each download's body
(as a slow link would), so that concurrent clients overlap. Prints `PORT COMMIT` on its first
line, then serves until killed.

Routes:
  GET  /api/models/{repo}/revision/{rev}    {"id", "sha", "siblings": [{"rfilename"}]}
  GET  /api/models/{repo}/tree/{rev}        [{"type": "file", "path", "size", "oid", "lfs"}]
  HEAD /{repo}/resolve/{rev}/{path}         X-Repo-Commit, ETag, X-Linked-Etag,
                                            X-Linked-Size, Content-Length, Accept-Ranges
  GET  /{repo}/resolve/{rev}/{path}         the bytes, with Range support (206)
"""

import hashlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


def load(root, lfs_min):
    files = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            data = open(full, "rb").read()
            lfs = len(data) >= lfs_min or rel.endswith(".safetensors")
            sha256 = hashlib.sha256(data).hexdigest()
            git_oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            files[rel] = {"data": data, "lfs": lfs, "sha256": sha256, "oid": git_oid}
    listing = "".join(f"{p} {f['oid']}\n" for p, f in sorted(files.items()))
    commit = hashlib.sha1(listing.encode()).hexdigest()
    return files, commit


def main():
    root, repo = sys.argv[1], sys.argv[2]
    lfs_min = 1 << 20
    if "--lfs-min" in sys.argv:
        lfs_min = int(sys.argv[sys.argv.index("--lfs-min") + 1])
    rate = None
    if "--rate" in sys.argv:
        rate = int(sys.argv[sys.argv.index("--rate") + 1])
    files, commit = load(root, lfs_min)
    revisions = {"main", commit}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            sys.stderr.write("hub: " + (fmt % args) + "\n")

        def send_json(self, body, status=200):
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        def not_found(self, what):
            self.send_response(404)
            self.send_header("X-Error-Code", what)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def api(self, path):
            prefix = f"/api/models/{repo}/"
            if not path.startswith(prefix):
                return self.not_found("RepoNotFound")
            kind, _, rev = path[len(prefix):].partition("/")
            rev = unquote(rev).split("/")[0]
            if rev not in revisions:
                return self.not_found("RevisionNotFound")
            if kind == "revision":
                siblings = [{"rfilename": p} for p in sorted(files)]
                return self.send_json({"id": repo, "sha": commit, "siblings": siblings})
            if kind == "tree":
                entries = []
                for p, f in sorted(files.items()):
                    entry = {"type": "file", "path": p, "size": len(f["data"]), "oid": f["oid"]}
                    if f["lfs"]:
                        entry["lfs"] = {"oid": f["sha256"], "size": len(f["data"]), "pointerSize": 134}
                    entries.append(entry)
                return self.send_json(entries)
            return self.not_found("EntryNotFound")

        def resolve(self, path):
            prefix = f"/{repo}/resolve/"
            if not path.startswith(prefix):
                return self.not_found("RepoNotFound")
            rev, _, rel = path[len(prefix):].partition("/")
            rev, rel = unquote(rev), unquote(rel)
            if rev not in revisions:
                return self.not_found("RevisionNotFound")
            f = files.get(rel)
            if f is None:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("X-Repo-Commit", commit)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = f["data"]
            etag = f["sha256"] if f["lfs"] else f["oid"]
            start, end = 0, len(data) - 1
            status = 200
            ranged = self.headers.get("Range")
            if ranged and ranged.startswith("bytes=") and self.command == "GET":
                lo, _, hi = ranged[len("bytes="):].partition("-")
                start = int(lo) if lo else 0
                end = min(int(hi), len(data) - 1) if hi else len(data) - 1
                status = 206
            body = data[start:end + 1]
            self.send_response(status)
            self.send_header("X-Repo-Commit", commit)
            self.send_header("ETag", f'"{etag}"')
            if f["lfs"]:
                self.send_header("X-Linked-Etag", f'"{etag}"')
                self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("Accept-Ranges", "bytes")
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command == "GET":
                self.send_body(body)

        def send_body(self, body):
            if rate is None:
                return self.wfile.write(body)
            step = max(1, rate // 20)
            for at in range(0, len(body), step):
                self.wfile.write(body[at:at + step])
                time.sleep(step / rate)

        def route(self):
            path = urlparse(self.path).path
            if path.startswith("/api/"):
                self.api(path)
            else:
                self.resolve(path)

        do_GET = route
        do_HEAD = route

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], commit, flush=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    # Serves until killed, or until its stdin closes (the test that started it ended).
    sys.stdin.read()


if __name__ == "__main__":
    main()
