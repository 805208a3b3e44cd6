"""The weights fetch: runs on a host as ONE process, stdlib only, started by engine_ctl.shell.fetch as
`python3 -I -S -c BOOTSTRAP`: the bootstrap reads this file, then one line of JSON arguments (with the hub
token, so it is never on a command line), from stdin. Nothing passes through a shell: files are written with
os calls and fetched with urllib.

It fetches the files of one commit of a Hugging Face repository into <dest>, where <dest> is
<models_dir>/sources/<org>/<repo>/<commit>:
- the free space (and the cap on all downloads under sources/) is checked first against the files' sizes;
- files come in under <dest>.partial/ as <file>.part, resumed with an HTTP Range request after an
  interruption (a kill -9 included);
- each file is verified (the LFS sha256, or the git blob id of a file kept in git) before it is renamed into
  <dest>.partial/, and <dest>.partial/ is renamed to <dest> only when every file is there: <dest> is whole
  or absent;
- the checkpoint digest (sha256 over each file's path and sha256) is written beside the files;
- a file a checkout of another commit of the repository already has (same size and digest, verified) is linked
  from there, not downloaded again;
- the hub token goes only to the host of the endpoint: a redirect elsewhere (LFS files are redirected to a CDN)
  is followed without it, as huggingface_hub does;
- a body cut short (the server closed the connection early) is resumed with Range, and connection errors, 429 and
  5xx are retried, up to 5 times with backoff, honouring Retry-After; then the fetch fails keeping the part. Only a
  digest mismatch after a complete download is corruption.

The hub's download URL is {endpoint}/{repo}/resolve/{commit}/{file} (huggingface_hub's
HUGGINGFACE_CO_URL_TEMPLATE, src/huggingface_hub/constants.py), answered with X-Repo-Commit and ETag headers.

It prints one JSON object a line: {"event": "progress", ...} while it works, then one of
{"event": "done", "digest": ...}, {"event": "refused", "reason": ...} (exit 3), {"event": "corrupt", ...} (exit 4)
or {"event": "failed", "reason": ...} (exit 5)."""

import contextlib
import fcntl
import hashlib
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

MARKER = ".engine-ctl-checkpoint.json"
CHUNK = 1 << 20
PROGRESS_EVERY_S = 0.5
RETRIES = 5
BACKOFF_S = 1.0
BACKOFF_MAX_S = 30.0
RETRY_AFTER_MAX_S = 60.0
RETRY_STATUSES = (429, 500, 502, 503, 504)


class Retryable(Exception):
    """A transient failure: a connection error, a body cut short, 429 or 5xx (with the server's Retry-After)."""

    def __init__(self, reason, retry_after=None):
        Exception.__init__(self, reason)
        self.reason = reason
        self.retry_after = retry_after


def retry_after_s(headers):
    """Retry-After in seconds (a number; an HTTP date is not worth parsing here), capped."""
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return min(max(float(str(value)), 0.0), RETRY_AFTER_MAX_S)
    except (TypeError, ValueError):
        return None


def backoff_s(attempt, retry_after, base=BACKOFF_S):
    if retry_after is not None:
        return retry_after
    return min(base * (2**attempt), BACKOFF_MAX_S)


class SameHostAuth(urllib.request.HTTPRedirectHandler):
    """Follows redirects, keeping Authorization only while the target is the endpoint's own host."""

    def __init__(self, endpoint):
        self.home = urllib.parse.urlsplit(endpoint)

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = urllib.request.HTTPRedirectHandler.redirect_request(self, req, fp, code, msg, headers, newurl)
        if new is not None:
            target = urllib.parse.urlsplit(new.full_url)
            if (target.scheme, target.hostname, target.port) != (self.home.scheme, self.home.hostname, self.home.port):
                new.remove_header("Authorization")
                new.unredirected_hdrs.pop("Authorization", None)
        return new


def emit(**event):
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def gb(n):
    """As engine_ctl.core.weights.human: decimal units, one decimal."""
    for factor, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= factor:
            return "%.1f %s" % (n / factor, unit)
    return "%d B" % n


def tree_bytes(root):
    total = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def free_bytes(path):
    probe = path
    while not os.path.isdir(probe):
        probe = os.path.dirname(probe.rstrip("/")) or "/"
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize


class Hashes:
    """sha256 of the content, and the git blob id (sha1 of "blob <size>\\0" + content) for files kept in git."""

    def __init__(self, size):
        self.sha256 = hashlib.sha256()
        self.blob = hashlib.sha1(b"blob %d\0" % size)

    def update(self, data):
        self.sha256.update(data)
        self.blob.update(data)


def hash_file(path, size, hashes=None, upto=None):
    hashes = hashes or Hashes(size)
    left = upto
    with open(path, "rb") as f:
        while left is None or left > 0:
            data = f.read(CHUNK if left is None else min(CHUNK, left))
            if not data:
                break
            hashes.update(data)
            if left is not None:
                left -= len(data)
    return hashes


def verified(entry, hashes):
    if entry.get("sha256"):
        return hashes.sha256.hexdigest() == entry["sha256"]
    return hashes.blob.hexdigest() == entry.get("git_blob")


class Fetch:
    def __init__(self, args):
        self.args = args
        self.dest = args["dest"]
        self.stage = self.dest + ".partial"
        self.files = args["files"]
        self.total = sum(f["size"] for f in self.files)
        self.done = 0
        self.file_start = 0
        self.file_size = 0
        self.last = 0.0
        self.digests = {}
        self.reused = 0

    def progress(self, name, force=False):
        now = time.monotonic()
        if force or now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            emit(
                event="progress",
                file=name,
                file_done=self.done - self.file_start,
                file_size=self.file_size,
                done=self.done,
                total=self.total,
            )

    def url(self, name):
        a = self.args
        quoted = urllib.parse.quote(name)
        return "%s/%s/resolve/%s/%s" % (a["endpoint"].rstrip("/"), a["repo"], a["commit"], quoted)

    def request(self, name, offset):
        """The file from `offset` on; a transient failure raises Retryable."""
        headers = {"User-Agent": "engine-ctl-fetch"}
        if self.args.get("token"):
            headers["Authorization"] = "Bearer " + self.args["token"]
        if offset:
            headers["Range"] = "bytes=%d-" % offset
        opener = urllib.request.build_opener(SameHostAuth(self.args["endpoint"]))
        try:
            return opener.open(urllib.request.Request(self.url(name), headers=headers), timeout=60)
        except urllib.error.HTTPError as exc:
            if exc.code in RETRY_STATUSES:
                raise Retryable("HTTP %d" % exc.code, retry_after_s(exc.headers)) from None
            raise
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise Retryable("%s: %s" % (type(exc).__name__, getattr(exc, "reason", None) or exc)) from None

    def check_space(self):
        """Refuse before any byte comes in: the cap on all downloads, then the free space."""
        need = 0
        for f in self.files:
            final = os.path.join(self.stage, f["path"])
            part = final + ".part"
            if os.path.exists(final):
                continue
            have = os.path.getsize(part) if os.path.exists(part) else 0
            need += max(f["size"] - have, 0)
        used = tree_bytes(self.args["sources"])
        cap = self.args.get("cap")
        free = free_bytes(self.stage)
        if cap is not None and used + need > cap:
            return (
                "the download of %s would take all downloads to %s, past the cap of %s (%s already "
                "downloaded); raise downloads.cap in the inventory or free space under sources/"
                % (gb(need), gb(used + need), gb(cap), gb(used))
            )
        if need > free:
            return "the download of %s does not fit: %s free; free some space" % (gb(need), gb(free))
        return None

    def one(self, entry):
        name, size = entry["path"], entry["size"]
        self.file_start, self.file_size = self.done, size
        final = os.path.join(self.stage, name)
        part = final + ".part"
        os.makedirs(os.path.dirname(final), mode=0o755, exist_ok=True)
        if os.path.exists(final):
            hashes = hash_file(final, size)
            if os.path.getsize(final) == size and verified(entry, hashes):
                self.done += size
                self.digests[name] = hashes.sha256.hexdigest()
                return None
            os.unlink(final)
        kept = self.from_another_commit(entry)
        if kept is not None:
            self.reuse(kept, final)
            self.done += size
            self.digests[name] = entry.get("sha256") or hash_file(final, size).sha256.hexdigest()
            self.reused += size
            return None
        have = os.path.getsize(part) if os.path.exists(part) else 0
        if have > size:
            os.truncate(part, 0)
            have = 0
        hashes = hash_file(part, size, upto=have) if have else Hashes(size)
        self.done += have
        attempt = 0
        while have < size:
            try:
                hashes = self.download(entry, part, have, hashes)
                have = os.path.getsize(part)
                if have >= size:
                    break
                why, wait = "the body was cut short at %d of %d bytes" % (have, size), None
            except Retryable as exc:
                have = os.path.getsize(part) if os.path.exists(part) else 0
                hashes = hash_file(part, size, upto=have) if have else Hashes(size)
                self.done = self.file_start + have
                why, wait = exc.reason, exc.retry_after
            if attempt >= RETRIES:
                raise Retryable("%s, after %d retries (the %d bytes that came are kept)" % (why, RETRIES, have))
            emit(event="retry", file=name, attempt=attempt + 1, reason=why)
            time.sleep(backoff_s(attempt, wait, self.args.get("backoff_s", BACKOFF_S)))
            attempt += 1
        if os.path.getsize(part) != size or not verified(entry, hashes):
            got = hashes.sha256.hexdigest()
            os.unlink(part)
            return {"file": name, "expected": entry.get("sha256") or entry.get("git_blob"), "sha256": got}
        os.chmod(part, 0o644)
        os.rename(part, final)
        self.digests[name] = hashes.sha256.hexdigest()
        return None

    def from_another_commit(self, entry):
        """The same file (same size and digest) in a checkout of another commit of this repository on this host,
        verified as a download is: a new commit re-downloads only the files that changed."""
        parent = os.path.dirname(self.dest)
        for other in sorted(os.listdir(parent)):
            folder = os.path.join(parent, other)
            if folder == self.dest or "." in other or not os.path.isdir(folder):
                continue
            try:
                with open(os.path.join(folder, MARKER)) as f:
                    known = json.load(f)["files"].get(entry["path"])
            except (OSError, ValueError, KeyError, AttributeError):
                continue
            candidate = os.path.join(folder, entry["path"])
            if not known or known.get("size") != entry["size"] or not os.path.isfile(candidate):
                continue
            if entry.get("sha256") and known.get("sha256") != entry["sha256"]:
                continue
            if verified(entry, hash_file(candidate, entry["size"])):
                return candidate
        return None

    def reuse(self, source, final):
        """A hard link (no second copy on disk), or a copy across file systems."""
        tmp = final + ".reuse"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        try:
            os.link(source, tmp)
        except OSError:
            with open(source, "rb") as src, open(tmp, "wb") as dst:
                while True:
                    data = src.read(CHUNK)
                    if not data:
                        break
                    dst.write(data)
                dst.flush()
                os.fsync(dst.fileno())
            os.chmod(tmp, 0o644)
        os.rename(tmp, final)

    def download(self, entry, part, have, hashes):
        name = entry["path"]
        try:
            response = self.request(name, have)
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and have:  # the part is whole already
                return hashes
            raise
        with response:
            if have and response.status == 200:  # the server ignored the Range: start again
                self.done -= have
                have = 0
                os.truncate(part, 0)
                hashes = Hashes(entry["size"])
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                while True:
                    try:
                        data = response.read(CHUNK)
                    except (http.client.IncompleteRead, OSError) as exc:  # what came so far is written: resume
                        os.fsync(fd)
                        raise Retryable("the connection broke: %s" % type(exc).__name__) from None
                    if not data:
                        break
                    os.write(fd, data)
                    hashes.update(data)
                    self.done += len(data)
                    self.progress(name)
                os.fsync(fd)
            finally:
                os.close(fd)
        self.progress(name, force=True)
        return hashes

    def finish(self):
        from_paths = {f["path"]: self.digests[f["path"]] for f in self.files}
        text = "".join("%s  %s\n" % (from_paths[p], p) for p in sorted(from_paths))
        digest = hashlib.sha256(text.encode()).hexdigest()
        files = {}
        for name, sha in from_paths.items():  # the facts probe re-measures a file whose size, mtime or inode moved
            st = os.stat(os.path.join(self.stage, name))
            files[name] = {"sha256": sha, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}
        marker = {"repo": self.args["repo"], "commit": self.args["commit"], "files": files, "digest": digest}
        with open(os.path.join(self.stage, MARKER), "w") as f:
            json.dump(marker, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(os.path.join(self.stage, MARKER), 0o644)
        os.rename(self.stage, self.dest)
        return digest

    def measure(self, found):
        """The checkpoint digest of the files in place now (a file whose size or mtime moved is hashed again)."""
        digests = {}
        for name, entry in found["files"].items():
            full = os.path.join(self.dest, name)
            if not os.path.isfile(full):
                digests[name] = "missing"
                continue
            st = os.stat(full)
            same = (st.st_size, st.st_mtime_ns) == (entry["size"], entry["mtime_ns"])
            same = same and entry.get("ino", st.st_ino) == st.st_ino  # another file renamed over it: a new inode
            digests[name] = entry["sha256"] if same else hash_file(full, st.st_size).sha256.hexdigest()
        text = "".join("%s  %s\n" % (digests[p], p) for p in sorted(digests))
        return hashlib.sha256(text.encode()).hexdigest()

    def run(self):
        marker = os.path.join(self.dest, MARKER)
        if os.path.exists(marker):
            with open(marker) as f:
                found = json.load(f)
            if self.measure(found) == found["digest"]:
                emit(event="progress", file="", file_done=0, file_size=0, done=self.total, total=self.total)
                emit(event="done", digest=found["digest"], fetched=0, total=self.total)
                return 0
            # changed under its deployments: back to staging, where every file is verified again and a changed
            # one fetched anew
            os.unlink(marker)
            if not os.path.exists(self.stage):
                os.rename(self.dest, self.stage)
        if self.args.get("enabled") is False:
            emit(
                event="refused",
                reason="downloads are off (downloads.enabled: false in the inventory) and the "
                "files are not at " + self.dest,
            )
            return 3
        os.makedirs(self.stage, mode=0o755, exist_ok=True)
        why = self.check_space()
        if why:
            emit(event="refused", reason=why)
            return 3
        self.progress("", force=True)
        for entry in self.files:
            bad = self.one(entry)
            if bad:
                emit(event="corrupt", **bad)
                return 4
        digest = self.finish()
        emit(event="done", digest=digest, fetched=self.total - self.reused, reused=self.reused, total=self.total)
        return 0


def main():
    args = json.loads(sys.stdin.readline())
    os.umask(0o022)
    parent = os.path.dirname(args["dest"])
    os.makedirs(parent, mode=0o755, exist_ok=True)
    for d in (args["sources"], parent):  # the dynamic users of the units read the weights
        os.chmod(d, 0o755)
    with open(args["dest"] + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one fetch of a checkout at a time; a second waits for the first
        try:
            return Fetch(args).run()
        except Retryable as exc:
            emit(event="failed", reason=exc.reason)
            return 5
        except (OSError, urllib.error.URLError, ValueError, http.client.HTTPException) as exc:
            emit(event="failed", reason="%s: %s" % (type(exc).__name__, getattr(exc, "reason", None) or exc))
            return 5


sys.exit(main())
