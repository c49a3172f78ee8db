"""Object-storage benchmark: `trajstore push` and `trajstore pull` against boto3 moving the same
files to and from the same S3-compatible server in the same run.

    python scripts/bench_remote.py --bin target/release/trajstore --n 10000000 [--repeat 3]

Run it with the Python of scripts/setup-python.sh (it has boto3 and moto). Without --endpoint it
starts moto's S3 server (`python -m moto.server`) on a free local port; with --endpoint URL it uses
that server and the AWS_* credentials of the environment.

Writes a D4RL-shaped dataset with `trajstore demo` (obs [17] f32, action [6] f32, default 256 MiB
segments), then times, best of --repeat runs each, every run into a fresh prefix or directory:
  boto3 upload:   upload_file of every file of the dataset, 8 files at once (TransferConfig
                  max_concurrency 8 within a file)
  trajstore push: trajstore push DATASET s3://BUCKET/PREFIX (8 files at once, the default)
  boto3 download: download_file of every object of the pushed dataset, 8 at once
  trajstore pull: trajstore pull s3://BUCKET/PREFIX --to DIR (checks every file's CRC-32C)
  trajstore info: trajstore info s3://BUCKET/PREFIX --json with an empty cache (fetches the
                  manifest and episode tables only; info_fetched_bytes is what it wrote)
and the peak RSS of the trajstore processes (/usr/bin/time -f %M). Prints one JSON line.

With --file the store is a local directory (file:// URLs) and the baseline is `cp -r` + sync of
the same files, which shows trajstore's own cost without a server in the way (with --cold, the page
cache is dropped before each step, so each reads its input from disk):
  cp:             cp -r DATASET DIR && sync
  trajstore push: trajstore push DATASET file:///DIR
  trajstore pull: trajstore pull file:///DIR --to DIR2
"""
import argparse, json, os, shutil, socket, subprocess, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor

import boto3
from boto3.s3.transfer import TransferConfig


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_moto():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("moto.server did not start")


def timed(cmd, env):
    """Runs cmd under /usr/bin/time; returns (seconds, peak RSS in bytes)."""
    with tempfile.NamedTemporaryFile("r") as rss:
        t = time.perf_counter()
        subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name] + cmd, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        secs = time.perf_counter() - t
        return secs, int(rss.read().strip().splitlines()[-1]) * 1024


def files_of(root):
    out = []
    for d, _, names in os.walk(root):
        for n in names:
            if n.startswith("_lock") or n.startswith("_pull"):
                continue
            p = os.path.join(d, n)
            out.append((p, os.path.relpath(p, root)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--endpoint")
    ap.add_argument("--work", help="scratch directory (default: a temporary one)")
    ap.add_argument("--file", action="store_true", help="file:// store against cp -r")
    ap.add_argument("--cold", action="store_true",
                    help="with --file: drop the page cache before every timed step (needs root), so "
                         "that each reads its input from disk")
    a = ap.parse_args()
    if a.file:
        return bench_file(a)

    server = None
    env = dict(os.environ)
    if a.endpoint:
        endpoint = a.endpoint
    else:
        server, endpoint = start_moto()
        env.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1")
    env.update(AWS_ENDPOINT_URL=endpoint, AWS_ALLOW_HTTP="true")
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name=env.get("AWS_REGION", "us-east-1"),
                      aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
                      aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"))
    cfg = TransferConfig(max_concurrency=8)
    work = tempfile.mkdtemp(dir=a.work)
    try:
        ds = os.path.join(work, "bench.trajstore")
        subprocess.run([a.bin, "demo", ds, "--transitions", str(a.n), "--json"], check=True,
                       stdout=subprocess.DEVNULL)
        files = files_of(ds)
        nbytes = sum(os.path.getsize(p) for p, _ in files)
        subprocess.run(["sync"], check=True)
        for b in ("bench-boto", "bench-ts"):
            s3.create_bucket(Bucket=b)

        def boto_upload(prefix):
            with ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda f: s3.upload_file(f[0], "bench-boto", f"{prefix}/{f[1]}", Config=cfg), files))

        res = {"transitions": a.n, "bytes": nbytes, "files": len(files), "endpoint": "moto" if server else endpoint}
        up, push, push_rss = [], [], 0
        for i in range(a.repeat):
            t = time.perf_counter()
            boto_upload(f"r{i}")
            up.append(time.perf_counter() - t)
            secs, rss = timed([a.bin, "push", ds, f"s3://bench-ts/r{i}"], env)
            push.append(secs)
            push_rss = max(push_rss, rss)

        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="bench-boto", Prefix="r0/")["Contents"]]

        def boto_download(dest):
            def one(k):
                p = os.path.join(dest, k)
                os.makedirs(os.path.dirname(p), exist_ok=True)
                s3.download_file("bench-boto", k, p, Config=cfg)
            with ThreadPoolExecutor(8) as ex:
                list(ex.map(one, keys))
            subprocess.run(["sync"], check=True)

        down, pull, pull_rss, info, info_bytes = [], [], 0, [], 0
        for i in range(a.repeat):
            d = os.path.join(work, f"boto{i}")
            t = time.perf_counter()
            boto_download(d)
            down.append(time.perf_counter() - t)
            shutil.rmtree(d)
            d = os.path.join(work, f"pull{i}")
            secs, rss = timed([a.bin, "pull", "s3://bench-ts/r0", "--to", d], env)
            pull.append(secs)
            pull_rss = max(pull_rss, rss)
            shutil.rmtree(d)
            cache = os.path.join(work, f"cache{i}")
            secs, _ = timed([a.bin, "info", "s3://bench-ts/r0", "--json"], dict(env, TRAJSTORE_CACHE=cache))
            info.append(secs)
            info_bytes = sum(os.path.getsize(p) for p, _ in files_of(cache))
            shutil.rmtree(cache)
        gb = nbytes / 1e9
        res.update({
            "boto3_upload_s": min(up), "trajstore_push_s": min(push),
            "push_ratio": min(push) / min(up), "push_gb_per_s": gb / min(push), "push_peak_rss_mb": push_rss / 1e6,
            "boto3_download_s": min(down), "trajstore_pull_s": min(pull),
            "pull_ratio": min(pull) / min(down), "pull_gb_per_s": gb / min(pull), "pull_peak_rss_mb": pull_rss / 1e6,
            "trajstore_info_s": min(info), "info_fetched_bytes": info_bytes,
        })
        print(json.dumps(res))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if server:
            server.kill()


def settle(cold):
    """Flushes earlier writes (so that a timed sync waits only for its own) and, when cold, drops
    the page cache."""
    subprocess.run(["sync"], check=True)
    if cold:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")


def bench_file(a):
    work = tempfile.mkdtemp(dir=a.work)
    try:
        ds = os.path.join(work, "bench.trajstore")
        subprocess.run([a.bin, "demo", ds, "--transitions", str(a.n), "--json"], check=True,
                       stdout=subprocess.DEVNULL)
        nbytes = sum(os.path.getsize(p) for p, _ in files_of(ds))
        cp, push, pull, rss = [], [], [], 0
        for i in range(a.repeat):
            d = os.path.join(work, f"cp{i}")
            settle(a.cold)
            t = time.perf_counter()
            subprocess.run(["cp", "-r", ds, d], check=True)
            subprocess.run(["sync"], check=True)
            cp.append(time.perf_counter() - t)
            shutil.rmtree(d)
            store = os.path.join(work, f"store{i}")
            settle(a.cold)
            secs, r = timed([a.bin, "push", ds, "file://" + store], os.environ)
            push.append(secs)
            rss = max(rss, r)
            d = os.path.join(work, f"pull{i}")
            settle(a.cold)
            secs, r = timed([a.bin, "pull", "file://" + store, "--to", d], os.environ)
            pull.append(secs)
            rss = max(rss, r)
            shutil.rmtree(d)
            shutil.rmtree(store)
        gb = nbytes / 1e9
        print(json.dumps({"transitions": a.n, "bytes": nbytes, "store": "file://", "cold": a.cold,
                          "cp_s": min(cp), "trajstore_push_s": min(push), "push_ratio": min(push) / min(cp),
                          "trajstore_pull_s": min(pull), "pull_ratio": min(pull) / min(cp),
                          "push_gb_per_s": gb / min(push), "pull_gb_per_s": gb / min(pull),
                          "peak_rss_mb": rss / 1e6}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
