"""Timings for bench/s3-staging.sh, each printed as seconds on one line.

Usage:
    s3_timing.py download URL BUCKET KEY DEST   boto3's download_file, default settings
    s3_timing.py open PATH                      open() of a file through a stagefs mount:
                                                it returns once the file is staged whole
    s3_timing.py read PATH                      a sequential read of the whole file, 8 MiB at a time
"""

import sys
import time


def download(url: str, bucket: str, key: str, dest: str) -> float:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
        region_name="us-east-1",
    )
    started = time.perf_counter()
    client.download_file(bucket, key, dest)
    return time.perf_counter() - started


def open_file(path: str) -> float:
    started = time.perf_counter()
    with open(path, "rb"):
        return time.perf_counter() - started


def read(path: str) -> float:
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass
    return time.perf_counter() - started


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    seconds = {"download": download, "open": open_file, "read": read}[mode](*args)
    print(f"{seconds:.3f}")


if __name__ == "__main__":
    main()
