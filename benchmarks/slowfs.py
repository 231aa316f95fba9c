"""A slow network disk on this machine: a FUSE filesystem that passes every call through to a
directory, writes at a bounded rate, and stalls fsync on demand.

    python benchmarks/slowfs.py BACKING MOUNTPOINT [--mbps 200] [--stall-flag PATH]

Writes are paced to `--mbps` megabytes per second over the whole filesystem (NAS and
distributed filesystems write at 100-300 MB/s); while the file `--stall-flag` exists, every
fsync waits (a hung fsync: a server that stopped answering). It runs in the foreground until
unmounted (`fusermount3 -u MOUNTPOINT`) or killed. benchmarks/async_save.py mounts it.

Needs /dev/fuse, libfuse3 (Debian: `apt-get install fuse3`) and the mfusepy package (ctypes
bindings for libfuse: `pip install mfusepy`); mounting needs root or fusermount3.
"""

from __future__ import annotations

import argparse
import errno
import os
import threading
import time

from mfusepy import (  # pip install mfusepy (needs libfuse3)
    FUSE,
    FuseOSError,
    Operations,
    _libfuse,  # the loaded libfuse, for fuse_interrupted()
)


class SlowPassthrough(Operations):
    """Every path under the mount is the same path under `root`; file handles are the backing
    files' descriptors."""

    def __init__(self, root: str, rate: float, stall_flag: str | None) -> None:
        self.root = os.path.realpath(root)
        self.rate = rate  # bytes per second
        self.stall_flag = stall_flag
        self._lock = threading.Lock()
        self._free_at = 0.0  # when the paced "device" is next free (time.monotonic)

    def _full(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def _pace(self, n: int) -> None:
        """Hold the write until the device would have taken `n` more bytes at `rate`."""
        with self._lock:
            now = time.monotonic()
            self._free_at = max(self._free_at, now) + n / self.rate
            wait = self._free_at - now
        time.sleep(wait)

    def _stall(self) -> None:
        """Wait while the flag exists. A waiting process that is killed gives up the call (EINTR),
        as NFS's killable waits do: the kernel waits for a FUSE request the daemon holds without
        a timeout, even through SIGKILL, so without this no process could exit while its write
        hangs (the interrupt the kernel sends is what fuse_interrupted() reports)."""
        while self.stall_flag and os.path.exists(self.stall_flag):
            if _libfuse.fuse_interrupted():
                raise FuseOSError(errno.EINTR)
            time.sleep(0.05)

    @staticmethod
    def _call(fn, *args):
        try:
            return fn(*args)
        except OSError as e:
            raise FuseOSError(e.errno or errno.EIO) from None

    # metadata ---------------------------------------------------------------------------------
    def access(self, path, amode):
        if not os.access(self._full(path), amode):
            raise FuseOSError(errno.EACCES)
        return 0

    def getattr(self, path, fh=None):
        st = self._call(os.lstat, self._full(path))
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size")
        out = {k: getattr(st, k) for k in keys}
        out.update(st_atime=st.st_atime, st_mtime=st.st_mtime, st_ctime=st.st_ctime)
        return out

    def readdir(self, path, fh):
        return [".", "..", *self._call(os.listdir, self._full(path))]

    def statfs(self, path):
        sv = self._call(os.statvfs, self._full(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files")
        return {k: getattr(sv, k) for k in (*keys, "f_flag", "f_frsize", "f_namemax")}

    def chmod(self, path, mode):
        return self._call(os.chmod, self._full(path), mode)

    def chown(self, path, uid, gid):
        return self._call(os.chown, self._full(path), uid, gid)

    use_ns = True  # utimens gets nanoseconds

    def utimens(self, path, times=None):
        return self._call(lambda: os.utime(self._full(path), ns=times))

    def mkdir(self, path, mode):
        return self._call(os.mkdir, self._full(path), mode)

    def rmdir(self, path):
        return self._call(os.rmdir, self._full(path))

    def unlink(self, path):
        return self._call(os.unlink, self._full(path))

    def rename(self, old, new):
        return self._call(os.rename, self._full(old), self._full(new))

    def readlink(self, path):
        return self._call(os.readlink, self._full(path))

    def symlink(self, target, source):
        return self._call(os.symlink, source, self._full(target))

    def link(self, target, source):
        return self._call(os.link, self._full(source), self._full(target))

    # files ------------------------------------------------------------------------------------
    def open(self, path, flags):
        return self._call(os.open, self._full(path), flags)

    def create(self, path, mode, fi=None):
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        return self._call(os.open, self._full(path), flags, mode)

    def read(self, path, size, offset, fh):
        return self._call(os.pread, fh, size, offset)

    def write(self, path, data, offset, fh):
        self._pace(len(data))
        return self._call(os.pwrite, fh, data, offset)

    def truncate(self, path, length, fh=None):
        if fh is not None:
            return self._call(os.ftruncate, fh, length)
        return self._call(os.truncate, self._full(path), length)

    def flush(self, path, fh):
        return 0

    def release(self, path, fh):
        return self._call(os.close, fh)

    def fsync(self, path, datasync, fh):
        self._stall()
        return self._call(os.fdatasync if datasync else os.fsync, fh)

    def fsyncdir(self, path, datasync, fh):
        self._stall()
        return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("backing", help="the directory whose files the mount shows")
    ap.add_argument("mountpoint")
    ap.add_argument("--mbps", type=float, default=200.0, help="write rate, MB/s (10^6 bytes)")
    ap.add_argument("--stall-flag", help="while this file exists, every fsync waits")
    args = ap.parse_args()
    ops = SlowPassthrough(args.backing, args.mbps * 1e6, args.stall_flag)
    FUSE(ops, args.mountpoint, foreground=True, nothreads=False)


if __name__ == "__main__":
    main()
