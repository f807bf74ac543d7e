"""A real S3 API server for the tests: moto's, on a loopback port, filled with boto3.

Usage: python s3_server.py

Prints "ready URL" once it serves, then takes one JSON command per line on stdin and
answers each with one JSON line ({"ok": true, ...} or {"error": "..."}):
  {"op": "bucket", "bucket": B}                      creates a bucket
  {"op": "put", "bucket": B, "key": K, "file": PATH} uploads a file ("text": T instead: those bytes)
  {"op": "sync", "bucket": B, "prefix": P, "dir": D} uploads every file under D as `aws s3 sync`
                                                     does: links are followed, so an HF cache's
                                                     snapshots hold real files
  {"op": "many", "bucket": B, "prefix": P, "count": N}  N small objects P/key-00000 ...
  {"op": "delete", "bucket": B, "key": K}
  {"op": "hold", "from": N}    ranged GETs that start at byte N or later wait until "release"
                               (a server stuck mid-transfer); the earlier bytes flow
  {"op": "release"}
  {"op": "slow_down", "requests": N}   the next N ranged GETs answer 503 SlowDown
  {"op": "slowed_left"}        how many of those are still to come
It serves until stdin closes or it is killed (the tests kill it to take the store away).
With INITIAL_NO_AUTH_ACTION_COUNT=0 in its environment, moto checks credentials.

With --fast-ranges (bench/s3-staging.sh), a ranged GET of an object is answered from
moto's store by reading that range alone: moto itself reads the whole object for every
ranged GET, under the object's lock, which bounds any client at a few MiB/s on a large
object whatever its concurrency.
"""

import json
import logging
import os
import re
import sys
import threading

import boto3
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server

HELD = {"from": None}
# Ranged GETs still to answer with 503 SlowDown, as a throttling S3 does.
SLOW_DOWN = {"left": 0}
SLOW_DOWN_BODY = b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>'
RELEASED = threading.Event()


def holding(app):
    """The app, with ranged GETs past the hold point waiting for a release."""

    def wrapped(environ, start_response):
        start = re.match(r"bytes=(\d+)-", environ.get("HTTP_RANGE", ""))
        if environ["REQUEST_METHOD"] == "GET" and start and SLOW_DOWN["left"] > 0:
            SLOW_DOWN["left"] -= 1
            start_response("503 Slow Down", [("Content-Type", "application/xml")])
            return [SLOW_DOWN_BODY]
        if environ["REQUEST_METHOD"] == "GET" and start and HELD["from"] is not None:
            if int(start.group(1)) >= HELD["from"]:
                RELEASED.wait()
        return app(environ, start_response)

    return wrapped


def fast_ranges(app):
    """The app, with ranged GETs of an object read from moto's store directly."""
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    def wrapped(environ, start_response):
        asked = re.fullmatch(r"bytes=(\d+)-(\d+)", environ.get("HTTP_RANGE", ""))
        bucket, _, key = environ["PATH_INFO"].lstrip("/").partition("/")
        if environ["REQUEST_METHOD"] != "GET" or not asked or not key or environ.get("QUERY_STRING"):
            return app(environ, start_response)
        try:
            found = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].get_object(bucket, key)
        except Exception:  # noqa: BLE001 - moto answers every other case itself
            found = None
        if found is None:
            return app(environ, start_response)
        if_match = environ.get("HTTP_IF_MATCH")
        if if_match and if_match.strip('"') != found.etag.strip('"'):
            return app(environ, start_response)
        begin, end = int(asked.group(1)), min(int(asked.group(2)), found.size - 1)
        with found.lock:
            found._value_buffer.seek(begin)
            body = found._value_buffer.read(end - begin + 1)
        start_response(
            "206 Partial Content",
            [
                ("Content-Type", "binary/octet-stream"),
                ("Content-Length", str(len(body))),
                ("Content-Range", f"bytes {begin}-{end}/{found.size}"),
                ("Accept-Ranges", "bytes"),
                ("ETag", found.etag),
                ("Last-Modified", found.last_modified_RFC1123),
            ],
        )
        return [body]

    return wrapped


def upload_tree(client, bucket: str, prefix: str, root: str) -> int:
    count = 0
    for dirpath, _, files in os.walk(root, followlinks=True):
        for name in files:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            key = f"{prefix}/{rel}" if prefix else rel
            client.upload_file(path, bucket, key)
            count += 1
    return count


def run(client, command: dict) -> dict:
    op, bucket = command["op"], command.get("bucket")
    if op == "bucket":
        client.create_bucket(Bucket=bucket)
    elif op == "put":
        if "file" in command:
            client.upload_file(command["file"], bucket, command["key"])
        else:
            client.put_object(Bucket=bucket, Key=command["key"], Body=command["text"].encode())
    elif op == "sync":
        return {"ok": True, "files": upload_tree(client, bucket, command["prefix"], command["dir"])}
    elif op == "many":
        # Into moto's store directly: ten thousand PUTs over HTTP take a minute.
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        prefix = command["prefix"]
        for i in range(command["count"]):
            backend.put_object(bucket, f"{prefix}/key-{i:05}", b"x")
    elif op == "delete":
        client.delete_object(Bucket=bucket, Key=command["key"])
    elif op == "hold":
        RELEASED.clear()
        HELD["from"] = command["from"]
    elif op == "slow_down":
        SLOW_DOWN["left"] = command["requests"]
    elif op == "slowed_left":
        return {"ok": True, "left": SLOW_DOWN["left"]}
    elif op == "release":
        HELD["from"] = None
        RELEASED.set()
    else:
        return {"error": f"unknown op {op}"}
    return {"ok": True}


def main() -> None:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = holding(DomainDispatcherApplication(create_backend_app))
    if "--fast-ranges" in sys.argv[1:]:
        app = fast_ranges(app)
    server = make_server("127.0.0.1", 0, app, True, request_handler=MotoRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    client = boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    print(f"ready {url}", flush=True)
    for line in sys.stdin:
        try:
            answer = run(client, json.loads(line))
        except Exception as e:  # noqa: BLE001 - the test reads any failure
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
