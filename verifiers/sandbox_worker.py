"""The sandbox zygote: a small trusted process that forks one fresh child per task.

Started by ``lmselfplay.verifiers.executor.Executor`` as ``python -I sandbox_worker.py CONFIG``.
It is stdlib-only and self-contained on purpose: it runs with ``-I`` (no user site, no
environment variables, no script directory on ``sys.path``) and must not import the project.

Life of the zygote:

1. Set up once, as ``cfg["boundary"]`` says: ``namespaces`` (root: a new network namespace,
   a mount namespace where every mount is read-only, a private tmpfs for the working
   directories, the host's private directories hidden with only the Python installation
   bound back, a ``/proc`` that shows each uid only its own processes; any failure is
   fatal), ``bwrap`` (the host started us inside bubblewrap, which did all that) or
   ``unsafe-hooks-only`` (no namespaces). In every mode, prepare Landlock and seccomp where the kernel has them.
2. Read tasks (JSON lines) from stdin. For each task fork a child that: starts a new
   session, gets stdin from /dev/null and fresh pipes as stdout/stderr/result (fd 3),
   enters a fresh working directory, enters its Landlock domain, closes every other
   descriptor, sets rlimits, drops to the slot's uid (``namespaces``), loads its seccomp
   filter, installs an audit hook, runs the code, serializes the value with the canonical
   encoder below and writes it to fd 3. A child runs exactly one task and dies
   (``os._exit``); it is never reused.
3. Watch every child with a pidfd, enforce the wall timeout and the output caps, kill the
   whole session (and every process of the slot uid) when the task ends, remove the
   working directory, and write one JSON line per finished task to stdout: what the zygote
   observed plus the child's result text, unparsed. The host decides the status.

The zygote never parses, unpickles or evaluates anything a child wrote.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import selectors
import shutil
import signal
import sys
import time

# ----------------------------------------------------------------------------------------------
# Canonical value codec (shared with the host, which imports this module).
# A value is encoded as JSON where every JSON object is a tag: {"t": [...]} tuple,
# {"d": [[k, v], ...]} dict, {"s": [...]} set, {"z": [...]} frozenset, {"b": "hex"} bytes,
# {"c": [re, im]} complex, {"f": "nan" | "inf" | "-inf"} non-finite float.
# Only exact built-in types are accepted, so a subclass cannot lie through __repr__/__eq__.
# ----------------------------------------------------------------------------------------------

MAX_DEPTH = 100


class ValueTooLarge(ValueError):
    """The encoded value exceeds the configured size."""


def make_encoder(max_bytes):
    """Build ``encode(value) -> str`` from references captured now (before untrusted code runs)."""
    from json.encoder import encode_basestring_ascii as enc_str

    _type, _len, _int_repr, _float_repr = type, len, int.__repr__, float.__repr__
    _list_t, _tuple_t, _dict_t, _set_t, _fset_t = list, tuple, dict, set, frozenset
    _bytes_t, _complex_t, _str_t, _int_t, _float_t, _bool_t = bytes, complex, str, int, float, bool
    _hex, _enumerate = bytes.hex, enumerate
    _join = "".join
    _TypeError, _ValueError = TypeError, ValueError
    _nf = {"nan": '{"f":"nan"}', "inf": '{"f":"inf"}', "-inf": '{"f":"-inf"}'}

    def fl(x):
        r = _float_repr(x)
        return _nf.get(r, r)

    def enc(x, depth, out, size):
        if depth > MAX_DEPTH:
            raise _ValueError("value nested too deeply (or cyclic)")
        t = _type(x)
        if x is None:
            s = "null"
        elif t is _bool_t:
            s = "true" if x else "false"
        elif t is _int_t:
            s = _int_repr(x)
        elif t is _float_t:
            s = fl(x)
        elif t is _str_t:
            s = enc_str(x)
        elif t is _bytes_t:
            s = '{"b":"' + _hex(x) + '"}'
        elif t is _complex_t:
            s = '{"c":[' + fl(x.real) + "," + fl(x.imag) + "]}"
        elif t is _list_t or t is _tuple_t or t is _set_t or t is _fset_t:
            items = _list_t(x)
            head = {_list_t: "[", _tuple_t: '{"t":[', _set_t: '{"s":[', _fset_t: '{"z":['}[t]
            out.append(head)
            size[0] += 8
            for i, item in _enumerate(items):
                if i:
                    out.append(",")
                enc(item, depth + 1, out, size)
            out.append("]" if t is _list_t else "]}")
            return
        elif t is _dict_t:
            out.append('{"d":[')
            for i, (k, v) in _enumerate(_list_t(x.items())):
                out.append(",[" if i else "[")
                enc(k, depth + 1, out, size)
                out.append(",")
                enc(v, depth + 1, out, size)
                out.append("]")
            out.append("]}")
            size[0] += 8
            return
        else:
            raise _TypeError(f"cannot serialize a value of type {t.__name__}")
        size[0] += _len(s)
        if size[0] > max_bytes:
            raise ValueTooLarge(f"serialized value exceeds {max_bytes} bytes")
        out.append(s)

    def encode(value):
        out, size = [], [0]
        enc(value, 0, out, size)
        return _join(out)

    return encode


MAX_SAME_HASH = 32  # elements of one set / keys of one dict that may share a hash value


def decode(obj, depth=0):
    """Inverse of the encoder, applied to ``json.loads`` output; returns plain built-ins.

    Linear in the size of ``obj`` whatever its shape: a set, frozenset or dict is built only
    when at most :data:`MAX_SAME_HASH` of its elements share a hash value (else ValueError).
    Hashes of ints, floats and tuples of them are not randomised, so a value of many distinct
    elements that all hash alike would make every insertion walk all the earlier ones: a
    quadratic rebuild (minutes for a value under the size limit). The encoder never writes
    equal elements twice, so a repeated element is refused by the same check."""
    if depth > MAX_DEPTH + 2:
        raise ValueError("value nested too deeply")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [decode(v, depth + 1) for v in obj]
    if isinstance(obj, dict) and len(obj) == 1:
        (tag, v), = obj.items()
        if tag == "t":
            return tuple(decode(x, depth + 1) for x in v)
        if tag == "d":
            pairs = [(decode(k, depth + 1), decode(x, depth + 1)) for k, x in v]
            _spread_hashes([k for k, _ in pairs])
            return dict(pairs)
        if tag == "s":
            return set(_spread_hashes([decode(x, depth + 1) for x in v]))
        if tag == "z":
            return frozenset(_spread_hashes([decode(x, depth + 1) for x in v]))
        if tag == "b":
            return bytes.fromhex(v)
        if tag == "c":
            return complex(decode(v[0], depth + 1), decode(v[1], depth + 1))
        if tag == "f" and v in ("nan", "inf", "-inf"):
            return float(v)
    raise ValueError(f"malformed encoded value: {str(obj)[:80]}")


def _spread_hashes(items):
    """``items``, when no more than :data:`MAX_SAME_HASH` of them share a hash value (counted
    in a dict keyed by the hash, an int: linear); else ValueError. Unhashable items (a list in
    a set) are a ValueError too."""
    counts = {}
    for x in items:
        try:
            h = hash(x)
        except TypeError:
            raise ValueError(f"malformed encoded value: unhashable {type(x).__name__} in a set or dict key") from None
        n = counts.get(h, 0) + 1
        if n > MAX_SAME_HASH:
            raise ValueError(f"more than {MAX_SAME_HASH} elements of one set or dict share a hash value "
                             "(refused: rebuilding it would take quadratic time)")
        counts[h] = n
    return items


# ----------------------------------------------------------------------------------------------
# libc helpers (zygote only; the child loses access to ctypes before untrusted code runs)
# ----------------------------------------------------------------------------------------------

CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1 << 10, 1 << 11, 1 << 21
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2


class Libc:
    def __init__(self):
        import ctypes

        self._ctypes = ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)
        c = ctypes
        self.libc.mount.argtypes = [c.c_char_p, c.c_char_p, c.c_char_p, c.c_ulong, c.c_char_p]
        self.libc.unshare.argtypes = [c.c_int]
        self.libc.prctl.argtypes = [c.c_int, c.c_ulong, c.c_ulong, c.c_ulong, c.c_ulong]

    def _check(self, rc, what):
        if rc != 0:
            e = self._ctypes.get_errno()
            raise OSError(e, f"{what}: {os.strerror(e)}")

    def unshare(self, flags):
        self._check(self.libc.unshare(flags), "unshare")

    def mount(self, src, target, fstype, flags, data=None):
        b = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
        self._check(self.libc.mount(b(src), b(target), b(fstype), flags, b(data)), f"mount {target}")

    def prctl(self, option, arg=0, arg3=0):
        self._check(self.libc.prctl(option, arg, arg3, 0, 0), "prctl")


def _mountinfo():
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            mp = parts[4].encode().decode("unicode_escape")  # octal escapes like \040
            out.append((mp, parts[5].split(",")))
    return out


def _mnt_flags(opts):
    table = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
             "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
    flags = 0
    for o in opts:
        flags |= table.get(o, 0)
    return flags


def setup_filesystem(libc, cfg, needed, protections):
    """Read-only view of the host with a private tmpfs scratch and hidden private dirs."""
    scratch = cfg["scratch_dir"]
    libc.unshare(CLONE_NEWNS)
    libc.mount(None, "/", None, MS_REC | MS_PRIVATE)
    root_ro = False
    for mp, opts in sorted(_mountinfo()):
        try:
            libc.mount(None, mp, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _mnt_flags(opts))
            root_ro = root_ro or mp == "/"
        except OSError:
            pass
    libc.mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV,
               f"size={int(cfg['scratch_mb'])}m,mode=0711")
    if root_ro:
        protections.append("readonly-fs")
    protections.append("tmpfs-scratch")

    # Directories to hide: configured ones plus any ancestor of a needed path that the
    # unprivileged uid could not traverse (so the Python installation stays importable).
    keep = sorted(set(needed) | {scratch})
    hide = {os.path.realpath(h) for h in cfg["hidden_paths"] if os.path.isdir(h)}
    for p in keep:
        parts = p.strip("/").split("/")
        for i in range(1, len(parts)):
            a = "/" + "/".join(parts[:i])
            try:
                if not os.stat(a).st_mode & 0o001:
                    hide.add(a)
            except OSError:
                pass
    hide.discard("/")
    top = [h for h in sorted(hide) if not any(h.startswith(o + "/") for o in hide if o != h)]
    hidden = []
    for h in top:
        inside = [p for p in keep if p.startswith(h + "/") or p == h]
        if h in inside:  # cannot hide a directory that is itself needed; hide nothing there
            continue
        fds = [(p, os.open(p, os.O_PATH | os.O_DIRECTORY)) for p in inside]
        try:
            libc.mount("tmpfs", h, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
            for p, fd in fds:
                os.makedirs(p, exist_ok=True)
                libc.mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
                if p != scratch:
                    libc.mount(None, p, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
            libc.mount(None, h, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
            hidden.append(h)
        except OSError as e:
            print(f"sandbox: could not hide {h}: {e}", file=sys.stderr)
        finally:
            for _, fd in fds:
                os.close(fd)
    if hidden:
        protections.append("hidden-dirs")
    try:  # a private /proc where each uid sees only its own processes
        libc.mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
        protections.append("proc-hidepid")
    except OSError:
        pass
    return hidden


def _world_traversable(path):
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        try:
            if not os.stat("/" + "/".join(parts[:i])).st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def claim_uid_block(cfg):
    """Lock a block of uids (one per slot) so that two executors never share one."""
    import fcntl

    lockdir = cfg["uid_lock_dir"]
    os.makedirs(lockdir, mode=0o700, exist_ok=True)
    n = int(cfg["max_workers"])
    for block in range(4096):
        fd = os.open(os.path.join(lockdir, f"block{block}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        base = int(cfg["uid_base"]) + block * 1024
        return fd, [base + i for i in range(n)]
    raise RuntimeError("no free sandbox uid block")


# ----------------------------------------------------------------------------------------------
# Kernel layers applied in every child before untrusted code: Landlock and seccomp.
# Both work unprivileged (they need only no_new_privs) and bind the process whatever it does
# next, native code included.
# ----------------------------------------------------------------------------------------------

LL_CREATE_RULESET, LL_ADD_RULE, LL_RESTRICT_SELF = 444, 445, 446  # same number on every arch
LL_EXECUTE, LL_WRITE_FILE, LL_READ_FILE, LL_READ_DIR = 1, 2, 4, 8
LL_FILE_RIGHTS = {1: 0b111, 3: 0b111 | (1 << 14), 5: 0b111 | (1 << 14) | (1 << 15)}
LL_ALL_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
LL_NET_TCP = 1 | 2  # bind and connect (ABI 4)
LL_SCOPES = 1 | 2  # abstract unix sockets and signals (ABI 6)


def _by_abi(table, abi):
    return table[max(k for k in table if k <= abi)]


class Landlock:
    """Per-child Landlock domain: read (and execute) every path outside the scratch tree
    (``read_paths`` given: only those paths, and the readable devices), read and write only
    the task's own working directory, write ``/dev/null``; no TCP bind/connect (ABI 4); no
    signals to and no abstract unix sockets of processes outside the domain, i.e. the zygote
    and the other tasks (ABI 6).

    The rule targets are opened once in the zygote (O_PATH) and reused by every child.
    """

    def __init__(self, libc, scratch, read_paths=None):
        import ctypes
        import struct

        self._ctypes, self._struct, self.libc = ctypes, struct, libc.libc
        self.libc.syscall.restype = ctypes.c_long
        abi = self.libc.syscall(LL_CREATE_RULESET, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
        if abi < 1:
            raise OSError(ctypes.get_errno(), "Landlock is not available")
        self.abi = abi
        self.all_fs = _by_abi(LL_ALL_BY_ABI, abi)
        self.file_fs = _by_abi(LL_FILE_RIGHTS, abi)
        fields = [self.all_fs, LL_NET_TCP if abi >= 4 else 0, LL_SCOPES if abi >= 6 else 0]
        size = 8 * (1 + (abi >= 4) + (abi >= 6))
        self.attr = ctypes.create_string_buffer(struct.pack("QQQ", *fields)[:size], size)
        self.read_fds = []
        paths = _outside_scratch(scratch) if read_paths is None else \
            [*read_paths, *(os.path.join("/dev", n) for n in DEV_READABLE)]
        for path in paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            is_dir = os.path.isdir(f"/proc/self/fd/{fd}")
            rights = (LL_EXECUTE | LL_READ_FILE | LL_READ_DIR) if is_dir else (LL_EXECUTE | LL_READ_FILE)
            self.read_fds.append((fd, rights))
        self.null_fd = os.open("/dev/null", os.O_PATH | os.O_CLOEXEC)
        # Landlock refuses some targets (pseudo filesystems): keep only the rules it takes
        probe = self._call(LL_CREATE_RULESET, self.attr, len(self.attr.raw), 0)
        try:
            kept = []
            for fd, rights in self.read_fds:
                try:
                    self._rule(probe, fd, rights)
                    kept.append((fd, rights))
                except OSError:
                    os.close(fd)
            self.read_fds = kept
        finally:
            os.close(probe)
        # packed once here: a child only makes the syscalls
        pack = self._struct.pack
        self.rule_bufs = [ctypes.create_string_buffer(pack("=Qi", rights, fd), 12)
                          for fd, rights in self.read_fds]
        self.rule_bufs.append(ctypes.create_string_buffer(
            pack("=Qi", LL_READ_FILE | LL_WRITE_FILE, self.null_fd), 12))
        self.protections = ["landlock"] + (["landlock-net"] if abi >= 4 else []) + (
            ["landlock-scope"] if abi >= 6 else [])

    def _call(self, nr, *args):
        rc = self.libc.syscall(nr, *args)
        if rc < 0:
            e = self._ctypes.get_errno()
            raise OSError(e, f"landlock syscall {nr}: {os.strerror(e)}")
        return rc

    def _rule(self, ruleset, fd, rights):
        buf = self._ctypes.create_string_buffer(self._struct.pack("=Qi", rights, fd), 12)
        self._call(LL_ADD_RULE, ruleset, 1, buf, 0)  # LANDLOCK_RULE_PATH_BENEATH

    def restrict(self, workdir):
        """In the child (after no_new_privs): enter the domain."""
        ruleset = self._call(LL_CREATE_RULESET, self.attr, len(self.attr.raw), 0)
        try:
            syscall = self.libc.syscall
            for buf in self.rule_bufs:
                if syscall(LL_ADD_RULE, ruleset, 1, buf, 0) < 0:
                    raise OSError(self._ctypes.get_errno(), "landlock_add_rule")
            wd = os.open(workdir, os.O_PATH | os.O_DIRECTORY)
            try:
                self._rule(ruleset, wd, self.all_fs)
            finally:
                os.close(wd)
            self._call(LL_RESTRICT_SELF, ruleset, 0)
        finally:
            os.close(ruleset)


DEV_READABLE = ("null", "zero", "random", "urandom", "fd", "stdin", "stdout", "stderr")
UNSAFE_MODE_READS = ("/usr", "/lib", "/lib64", "/bin")  # shared libraries a native module loads


def _outside_scratch(scratch):
    """Every entry of every ancestor of ``scratch`` except the ones leading to it: together
    they cover the whole tree but the scratch directory (and so every task's directory).
    In ``/dev`` only :data:`DEV_READABLE` (fewer rules: each costs every child a syscall)."""
    out, parts = [], os.path.realpath(scratch).strip("/").split("/")
    for depth in range(len(parts)):
        parent = "/" + "/".join(parts[:depth])
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        if parent == "/dev":
            names = [n for n in names if n in DEV_READABLE]
        out += [os.path.join(parent, n) for n in names if n != parts[depth]]
    return out


# seccomp: a BPF program (x86-64) built per child, since the signal rule names its own pid.
AUDIT_ARCH_X86_64 = 0xC000003E
SECCOMP_DENY = {  # EPERM: process creation and execution, debugging other processes, sockets,
    # namespaces and mounts, kernel interfaces a program never needs
    "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "ptrace": 101,
    "process_vm_readv": 310, "process_vm_writev": 311, "tkill": 200, "rt_sigqueueinfo": 129,
    "rt_tgsigqueueinfo": 297, "pidfd_send_signal": 424, "pidfd_open": 434, "pidfd_getfd": 438,
    "socket": 41, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
    "unshare": 272, "setns": 308, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
    "keyctl": 250, "add_key": 248, "request_key": 249, "kexec_load": 246,
    "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
    "iopl": 172, "ioperm": 173, "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_by_handle_at": 304, "name_to_handle_at": 303, "syslog": 103, "quotactl": 179,
    "mknod": 133, "mknodat": 259, "move_pages": 279, "migrate_pages": 256,
    "settimeofday": 164, "clock_settime": 227, "adjtimex": 159, "clock_adjtime": 305,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "move_mount": 429,
    "open_tree": 428, "mount_setattr": 442, "lookup_dcookie": 212, "personality": 135,
    "uselib": 134, "vhangup": 153, "kcmp": 312, "process_madvise": 440,
}
NR_CLONE, NR_CLONE3, NR_KILL, NR_TGKILL = 56, 435, 62, 234
CLONE_THREAD = 0x00010000
# calls that change another process's scheduling or limits when given its pid: allowed only on
# the calling process itself (pid 0 or its own), so that a task cannot renice, reschedule or
# cut the limits of its zygote (in bwrap: pid 1, the same uid) or the other tasks
SELF_ONLY_ARG0 = {"sched_setparam": 142, "sched_setscheduler": 144, "sched_setaffinity": 203,
                  "sched_setattr": 314, "prlimit64": 302}
# (which, who, ...) calls: only which = the process kind (PRIO_PROCESS 0, IOPRIO_WHO_PROCESS 1)
# and who = itself; a process group or a whole uid (every process of the sandbox) is refused
SELF_ONLY_WHO = {"setpriority": (141, 0), "ioprio_set": (251, 1)}


_SECCOMP_TEMPLATE = {}


def seccomp_filter_bytes(pid):
    """:func:`seccomp_program` for ``pid``, patched into a template built once."""
    import struct

    if not _SECCOMP_TEMPLATE:
        code, n = seccomp_program(0x7FFFFFF0)  # a marker no real pid has
        marks = [i for i in range(0, len(code), 8)
                 if struct.unpack_from("I", code, i + 4)[0] in (0x7FFFFFF0, (-0x7FFFFFF0) & 0xFFFFFFFF)]
        _SECCOMP_TEMPLATE.update(code=code, n=n, marks=marks)
    t = _SECCOMP_TEMPLATE
    buf = bytearray(t["code"])
    for i in t["marks"]:
        neg = struct.unpack_from("I", buf, i + 4)[0] != 0x7FFFFFF0
        struct.pack_into("I", buf, i + 4, ((-pid) & 0xFFFFFFFF) if neg else pid)
    return bytes(buf), t["n"]


def seccomp_program(pid):
    """The filter: deny :data:`SECCOMP_DENY`; ``clone`` only for threads (``clone3``
    answers ENOSYS so that libc falls back to ``clone``, whose flags can be read); signals
    only to this process (``kill`` of pid, 0 or -pid, ``tgkill`` of pid); scheduling, priority
    and resource-limit calls only on this process (:data:`SELF_ONLY_ARG0`,
    :data:`SELF_ONLY_WHO`); other architectures' and x32 calls killed/denied. Returns the
    packed ``sock_filter`` array."""
    import errno
    import struct

    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    nr, arch, arg0, arg1 = 0, 4, 16, 24  # offsets in struct seccomp_data (the args' low words)
    p = [(ld, 0, 0, arch), (jeq, 1, 0, AUDIT_ARCH_X86_64), (ret, 0, 0, kill),
         (ld, 0, 0, nr), (jge, 0, 1, 0x40000000), (ret, 0, 0, eperm)]
    for number in sorted(SECCOMP_DENY.values()):
        p += [(jeq, 0, 1, number), (ret, 0, 0, eperm)]
    p += [(jeq, 0, 1, NR_CLONE3), (ret, 0, 0, enosys)]
    p += [(jeq, 0, 4, NR_CLONE), (ld, 0, 0, arg0), (jset, 0, 1, CLONE_THREAD),
          (ret, 0, 0, allow), (ret, 0, 0, eperm)]
    p += [(jeq, 0, 6, NR_KILL), (ld, 0, 0, arg0), (jeq, 3, 0, pid), (jeq, 2, 0, 0),
          (jeq, 1, 0, (-pid) & 0xFFFFFFFF), (ret, 0, 0, eperm), (ret, 0, 0, allow)]
    p += [(jeq, 0, 4, NR_TGKILL), (ld, 0, 0, arg0), (jeq, 1, 0, pid), (ret, 0, 0, eperm),
          (ret, 0, 0, allow)]
    for number in sorted(SELF_ONLY_ARG0.values()):  # arg0 is 0 or pid, else EPERM
        p += [(jeq, 0, 5, number), (ld, 0, 0, arg0), (jeq, 2, 0, 0), (jeq, 1, 0, pid),
              (ret, 0, 0, eperm), (ret, 0, 0, allow)]
    for number, which in sorted(SELF_ONLY_WHO.values()):  # arg0 is which, arg1 is 0 or pid
        p += [(jeq, 0, 7, number), (ld, 0, 0, arg0), (jeq, 0, 3, which), (ld, 0, 0, arg1),
              (jeq, 2, 0, 0), (jeq, 1, 0, pid), (ret, 0, 0, eperm), (ret, 0, 0, allow)]
    p.append((ret, 0, 0, allow))
    return b"".join(struct.pack("HBBI", *ins) for ins in p), len(p)


def seccomp_available():
    import platform

    return platform.machine() == "x86_64"


def load_seccomp(libc):
    """In the child, after no_new_privs: install :func:`seccomp_program` for this pid."""
    ctypes = libc._ctypes
    code, n = seccomp_filter_bytes(os.getpid())
    buf = ctypes.create_string_buffer(code, len(code))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(n, ctypes.addressof(buf))
    libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog))


# ----------------------------------------------------------------------------------------------
# The child: everything after fork and before untrusted code, then the harness.
# ----------------------------------------------------------------------------------------------

FORBIDDEN_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.vfork", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
    "os.startfile", "subprocess.Popen", "pty.spawn", "sys.addaudithook", "gc.get_objects",
    "gc.get_referrers", "gc.get_referents", "resource.prlimit", "resource.setrlimit",
    "socket.__new__", "socket.bind", "socket.connect", "socket.sendto", "socket.sethostname",
    "os.symlink", "os.link", "os.mknod", "os.mkfifo", "os.setxattr", "os.removexattr",
    "os.chflags", "os.lchflags", "os.chown", "os.lchown", "signal.pthread_kill",
    "sys.remote_exec", "_posixsubprocess.fork_exec", "cpython.PyInterpreterState_New",
})
FORBIDDEN_IMPORTS = frozenset({"ctypes", "_ctypes", "_posixsubprocess", "_xxsubinterpreters",
                               "_testcapi", "_testinternalcapi", "multiprocessing", "mmap",
                               "pty", "socket", "_socket"})
# event -> (indices of path arguments, indices of dir_fd arguments)
PATH_WRITE_EVENTS = {"os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)), "os.mkdir": ((0,), (2,)),
                     "os.chmod": ((0,), (2,)), "os.utime": ((0,), (3,)), "os.truncate": ((0,), ()),
                     "os.rename": ((0, 1), (2, 3)), "shutil.rmtree": ((0,), ())}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def make_audit_hook(workdir, read_roots, restrict_reads, allow_ctypes):
    """An audit hook that refuses process creation, sockets, ctypes and writes outside cwd.

    Defense in depth only: it binds the Python level. The OS-level barriers (uid, namespaces,
    rlimits, read-only mounts) are what hold if a program finds a way around it.
    """
    _startswith, _norm, _join, _fspath = str.startswith, os.path.normpath, os.path.join, os.fspath
    _getcwd, _getpid, _isinstance, _str, _int, _bytes = os.getcwd, os.getpid, isinstance, str, int, bytes
    _fsdecode, _PermissionError, _readlink = os.fsdecode, PermissionError, os.readlink
    forbidden, imports, pevents = FORBIDDEN_EVENTS, FORBIDDEN_IMPORTS, PATH_WRITE_EVENTS
    wd = workdir.rstrip("/")
    roots = tuple(r.rstrip("/") for r in read_roots)
    devs = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"})
    me = _getpid()

    def resolve(p, dir_fd=None):
        if _isinstance(p, _int):
            return None
        if _isinstance(p, _bytes):
            p = _fsdecode(p)
        elif not _isinstance(p, _str):
            p = _fspath(p)
            if _isinstance(p, _bytes):
                p = _fsdecode(p)
        if dir_fd is not None and dir_fd >= 0 and not _startswith(p, "/"):
            try:  # a relative path under dir_fd: the directory that fd names
                return _norm(_join(_readlink(f"/proc/self/fd/{dir_fd}"), p))
            except OSError:
                return "/"  # unknown: judged as outside
        return _norm(_join(_getcwd(), p))

    def inside(p, base):
        return p == base or _startswith(p, base + "/")

    def hook(event, args):
        if event in forbidden:
            raise _PermissionError(f"sandbox: {event} is not allowed")
        if event == "open":
            p = resolve(args[0])
            if p is None:
                return
            mode, flags = args[1], args[2]
            writing = (_isinstance(flags, _int) and flags & WRITE_FLAGS) or (
                _isinstance(mode, _str) and ("w" in mode or "a" in mode or "x" in mode or "+" in mode))
            if inside(p, wd) or (not writing and p in devs):
                return
            if writing:
                raise _PermissionError(f"sandbox: writing outside the working directory: {p}")
            if restrict_reads:
                for r in roots:
                    if inside(p, r):
                        return
                raise _PermissionError(f"sandbox: reading outside the allowed paths: {p}")
            return
        if event in pevents:
            paths, dirfds = pevents[event]
            for k, i in enumerate(paths):
                # CPython passes dir_fd=-1 (or None) when none was given
                fd = args[dirfds[k]] if k < len(dirfds) and dirfds[k] < len(args) else None
                p = resolve(args[i], fd if _isinstance(fd, _int) else None)
                if p is not None and not inside(p, wd):
                    raise _PermissionError(f"sandbox: {event} outside the working directory: {p}")
            return
        if event == "os.chdir" or event == "os.listdir" or event == "os.scandir":
            p = resolve(args[0]) if args[0] is not None else _getcwd()
            if p is None or inside(p, wd):
                return
            if event != "os.chdir" and (not restrict_reads or any(inside(p, r) for r in roots)):
                return
            raise _PermissionError(f"sandbox: {event} outside the working directory: {p}")
        if event == "os.kill" or event == "os.killpg":
            if event == "os.killpg" or args[0] != me:
                raise _PermissionError("sandbox: signals to other processes are not allowed")
            return
        if event == "import":
            # every dotted component counts: a native module loaded under another package
            # name (``x._posixsubprocess``) still needs its own init symbol, i.e. its own name
            names = frozenset(_str(args[0]).split("."))
            bad = names & imports
            if bad and not (allow_ctypes and bad <= {"ctypes", "_ctypes"}):
                raise _PermissionError(f"sandbox: import of {args[0]} is not allowed")
            return
        if not allow_ctypes and _startswith(event, "ctypes."):
            raise _PermissionError(f"sandbox: {event} is not allowed")

    return hook


def child_main(task, cfg, uid, workdir, out_w, err_w, res_w, libc, landlock):
    """Runs in the forked child; never returns.

    Order matters: no_new_privs before Landlock and seccomp (both require it), Landlock
    while the zygote's rule fds are still open, the uid drop before seccomp, every other
    descriptor closed before the program runs."""
    try:
        signal.set_wakeup_fd(-1)
        os.setsid()
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.dup2(res_w, 3)
        os.chdir(workdir)
        if libc is not None:
            libc.prctl(PR_SET_NO_NEW_PRIVS, 1)
        if landlock is not None:
            landlock.restrict(workdir)
        os.closerange(4, 65536)  # close_range(2): the zygote never holds that many fds
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write raises EFBIG instead
        mb = 1024 * 1024
        cpu = max(1, int(round(cfg["cpu_s"])))
        limits = [(resource.RLIMIT_CPU, cpu, cpu + 1),
                  (resource.RLIMIT_FSIZE, int(cfg["max_file_bytes"])),
                  (resource.RLIMIT_NOFILE, int(cfg["max_open_files"])),
                  (resource.RLIMIT_CORE, 0)]
        if cfg["memory_mb"]:
            limits.append((resource.RLIMIT_AS, int(cfg["memory_mb"]) * mb))
        if uid is not None:
            limits.append((resource.RLIMIT_NPROC, int(cfg["max_threads"])))
        for lim in limits:
            soft, hard = lim[1], lim[2] if len(lim) > 2 else lim[1]
            resource.setrlimit(lim[0], (soft, hard))
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        if libc is not None:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # cleared by setuid: set it after
            if cfg.get("seccomp"):
                load_seccomp(libc)
        if os.getppid() != cfg["zygote_pid"]:  # the zygote died before we got here
            os._exit(70)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir,
                           "TMPDIR": workdir})
        for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
            del sys.modules[name]
        if "random" in sys.modules:  # a fresh interpreter seeds from urandom: do the same
            sys.modules["random"].seed(int.from_bytes(os.urandom(32), "little"))
        import builtins
        import tempfile

        tempfile.tempdir = workdir
        encode = make_encoder(int(cfg["max_value_bytes"]))
        if cfg["audit_hook"]:
            sys.addaudithook(make_audit_hook(workdir, cfg["read_roots"], cfg["restrict_reads"],
                                             cfg["allow_ctypes"]))
    except BaseException as e:  # setup failed: report and die
        _write_all(3, json.dumps({"status": "error", "error": f"sandbox setup failed: {e!r}"}).encode())
        os._exit(71)
    _harness(task, encode, builtins)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return
        view = view[n:]


def _harness(task, encode, builtins):
    """Run the task and write one JSON message to fd 3. Refs are captured before user code."""
    _write, _exit, _dumps = _write_all, os._exit, json.dumps
    _MemoryError, _BaseException, _type, _str = MemoryError, BaseException, type, str
    stdout, stderr = sys.stdout, sys.stderr
    import traceback

    _format_exc = traceback.format_exc
    msg = None
    try:
        g = {"__name__": "__main__", "__builtins__": builtins}
        args = [decode(a) for a in task.get("args", [])]
        kwargs = {k: decode(v) for k, v in (task.get("kwargs") or {}).items()}
        exec(compile(task["code"], "<program>", "exec"), g)
        if task.get("entry"):
            fn = g.get(task["entry"])
            if fn is None:
                raise NameError(f"the program does not define {task['entry']!r}")
            value = fn(*args, **kwargs)
        elif task.get("expr"):
            value = eval(compile(task["expr"], "<expr>", "eval"), g)
        else:
            value = None
        try:
            msg = '{"status":"ok","value":' + encode(value) + "}"
        except ValueTooLarge as e:
            msg = _dumps({"status": "output-limit", "error": _str(e)})
        except _BaseException as e:
            msg = _dumps({"status": "error", "error": f"{_type(e).__name__}: {e}"})
    except _MemoryError:
        msg = '{"status":"memory","error":"MemoryError"}'
    except _BaseException as e:  # SystemExit, KeyboardInterrupt and friends included
        try:
            text = f"{_type(e).__name__}: {e}"
            tb = _format_exc(limit=-20)
        except _BaseException:
            text, tb = f"{_type(e).__name__}: <unprintable>", ""
        try:
            msg = _dumps({"status": "error", "error": text[:2000], "traceback": tb[-8000:]})
        except _BaseException:
            msg = '{"status":"error","error":"unprintable exception"}'
    for s in (stdout, stderr, sys.stdout, sys.stderr):
        try:
            s.flush()
        except _BaseException:
            pass
    _write(3, msg.encode("utf-8", "surrogatepass"))
    _exit(0)


# ----------------------------------------------------------------------------------------------
# The zygote loop
# ----------------------------------------------------------------------------------------------

class Running:
    __slots__ = ("tid", "pid", "slot", "workdir", "fds", "bufs", "sizes", "deadline", "start",
                 "timeout", "reason", "exit", "rusage", "pidfd")


def _sweep_uid(uid):
    """Kill every process owned by ``uid`` (the slot's processes, however they escaped).

    The zygote (single-threaded, root) briefly takes the slot uid as real and effective uid,
    keeping root as saved uid, so that ``kill(-1)`` reaches exactly that uid's processes;
    then it switches back. Three syscalls instead of forking a helper per task.
    """
    os.setresuid(uid, uid, 0)
    try:
        for _ in range(2):
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                break
    finally:
        os.setresuid(0, 0, 0)


class Zygote:
    def __init__(self, cfg):
        self.cfg = cfg
        self.protections = []
        self.sel = selectors.DefaultSelector()
        self.running: dict[int, Running] = {}
        self.by_pid: dict[int, Running] = {}
        self.pending = collections.deque()
        self.orphan_status = {}
        self.counter = 0
        self.libc = None
        self.landlock = None
        self.uids = None
        self.inbuf = b""
        self.euid = os.geteuid()
        os.open("/dev/null", os.O_RDONLY)  # keep fd 3 taken so that pipes land above it
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        try:
            self.libc = Libc()
            self.libc.prctl(PR_SET_DUMPABLE, 0)
            self.libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
        except (OSError, AttributeError):
            self.libc = None
        self._setup()
        for name in cfg.get("preimport", []):
            try:
                __import__(name)
            except ImportError:
                pass
        # Children must not run the cyclic GC over the zygote's objects: that would touch
        # (and copy-on-write) every page of the inherited heap.
        import gc

        gc.collect()
        gc.freeze()

    def _setup(self):
        """The boundary named by ``cfg["boundary"]``, failing closed when it cannot be had:
        ``namespaces`` (root: netns, read-only mount ns, one uid per slot), ``bwrap`` (the
        host started us inside bubblewrap: it says which namespaces), ``unsafe-hooks-only``
        (rlimits and the audit hook). Landlock and seccomp are added in every mode whenever
        the kernel has them (in ``unsafe-hooks-only`` Landlock also limits reads to the Python
        installation and the system's libraries, :data:`UNSAFE_MODE_READS`)."""
        cfg, prot = self.cfg, self.protections
        needed = sorted({os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)})
        cfg["read_roots"] = needed
        cfg["zygote_pid"] = os.getpid()
        mode = cfg["boundary"]
        if mode == "namespaces":
            if self.euid != 0 or self.libc is None:
                raise RuntimeError("the namespaces sandbox needs root")
            self.lockfd, self.uids = claim_uid_block(cfg)  # before the host turns read-only
            os.chmod(cfg["scratch_dir"], 0o711)
            self.libc.unshare(CLONE_NEWNET)
            prot.append("netns")
            setup_filesystem(self.libc, cfg, needed, prot)
            if "hidden-dirs" not in prot and not all(_world_traversable(p) for p in needed):
                raise RuntimeError("the Python installation is not readable for an "
                                   "unprivileged uid and could not be exposed in the mount namespace")
            prot += ["uid-drop", "rlimit-nproc"]
        elif mode == "bwrap":
            prot += cfg["outer_protections"]
        if self.libc is not None:
            # unsafe-hooks-only has no namespaces to hide the host's files and processes: its
            # Landlock domain reads only the Python installation and the system's libraries
            reads = None if mode != "unsafe-hooks-only" else sorted(
                {*needed, *(os.path.realpath(p) for p in UNSAFE_MODE_READS if os.path.isdir(p))})
            try:
                self.landlock = Landlock(self.libc, cfg["scratch_dir"], reads)
                prot += self.landlock.protections
            except (OSError, AttributeError):
                self.landlock = None
            cfg["seccomp"] = seccomp_available()
            if cfg["seccomp"]:
                seccomp_filter_bytes(1)  # build the template before forking
                prot.append("seccomp")
        prot.append("rlimits")
        prot.append("session-kill")
        if cfg["audit_hook"]:
            prot.append("audit-hook")
        if self.libc:
            prot.append("no-new-privs")

    # -- host I/O --------------------------------------------------------------------------
    def send(self, obj):
        _write_all(1, (json.dumps(obj) + "\n").encode())

    def serve(self):
        self.send({"ready": True, "protections": self.protections, "pid": os.getpid(),
                   "uids": self.uids})
        os.set_blocking(0, False)
        self.sel.register(0, selectors.EVENT_READ, None)
        # Orphans re-parented to us die at any time: SIGCHLD wakes the loop to reap them.
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *a: None)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        free = list(range(int(self.cfg["max_workers"])))[::-1]
        host_open = True
        while host_open or self.running:
            while self.pending and free:
                self.start(self.pending.popleft(), free.pop())
            now = time.monotonic()
            timeout = None
            if self.running:
                timeout = max(0.0, min(r.deadline for r in self.running.values()) - now)
            for key, _ in self.sel.select(timeout):
                if key.data == "wake":
                    try:
                        os.read(self.wake_r, 4096)
                    except BlockingIOError:
                        pass
                    self.reap_orphans()
                    continue
                if key.data is None:
                    host_open = self.read_host()
                else:
                    r, kind = key.data
                    if kind == "exit":
                        self.finish(r)
                        free.append(r.slot)
                    else:
                        self.read_pipe(r, kind)
            now = time.monotonic()
            for r in list(self.running.values()):
                if r.reason is None and now >= r.deadline:
                    self.kill(r, "timeout")
        self.shutdown()

    def read_host(self):
        """Queue the tasks the host sent; False at end of input. Task text lives only in
        ``self.inbuf`` / ``self.pending`` (never in the loop's locals), which a child clears
        right after fork: a child sees only its own task."""
        try:
            chunk = os.read(0, 1 << 20)
        except BlockingIOError:
            return True
        if not chunk:
            self.sel.unregister(0)
            for r in list(self.running.values()):
                self.kill(r, "killed")
            return False
        *lines, self.inbuf = (self.inbuf + chunk).split(b"\n")
        self.pending.extend(json.loads(line) for line in lines if line.strip())
        return True

    def shutdown(self):
        if self.uids:
            for uid in self.uids:
                _sweep_uid(uid)

    # -- task lifecycle --------------------------------------------------------------------
    def start(self, task, slot):
        self.counter += 1
        cfg = self.cfg
        uid = self.uids[slot] if self.uids else None
        # unguessable, so that no task can name another's directory
        workdir = os.path.join(cfg["scratch_dir"], f"t{self.counter}-{os.urandom(8).hex()}")
        os.mkdir(workdir, 0o700)
        if uid is not None:
            os.chown(workdir, uid, uid)
        pipes = [os.pipe() for _ in range(3)]
        timeout = float(task.get("timeout_s") or cfg["timeout_s"])
        pid = os.fork()
        if pid == 0:
            try:
                # Other tasks' code and inputs must not be reachable from this child's memory.
                self.pending.clear()
                self.running.clear()
                self.by_pid.clear()
                self.inbuf = b""
                for rd, _ in pipes:
                    os.close(rd)
                child_main(task, cfg, uid, workdir, pipes[0][1], pipes[1][1], pipes[2][1],
                           self.libc, self.landlock)
            finally:
                os._exit(72)
        r = Running()
        r.tid, r.pid, r.slot, r.workdir = task["id"], pid, slot, workdir
        r.start = time.monotonic()
        r.deadline = r.start + timeout
        r.timeout = timeout
        r.reason, r.exit, r.rusage = None, None, None
        r.bufs = {"out": [], "err": [], "res": []}
        r.sizes = {"out": 0, "err": 0, "res": 0}
        r.fds = {}
        for (rd, wr), kind in zip(pipes, ("out", "err", "res")):
            os.close(wr)
            os.set_blocking(rd, False)
            r.fds[kind] = rd
            self.sel.register(rd, selectors.EVENT_READ, (r, kind))
        r.pidfd = os.pidfd_open(pid)
        self.sel.register(r.pidfd, selectors.EVENT_READ, (r, "exit"))
        self.running[task["id"]] = r
        self.by_pid[pid] = r

    def read_pipe(self, r, kind, drain=False):
        fd = r.fds.get(kind)
        if fd is None:
            return
        cap = int(self.cfg["max_value_bytes" if kind == "res" else "max_output_bytes"])
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                self.sel.unregister(fd)
                os.close(fd)
                del r.fds[kind]
                return
            room = cap + 64 - r.sizes[kind]
            r.bufs[kind].append(chunk[:max(0, room)])
            r.sizes[kind] += len(chunk)
            if kind != "res" and r.sizes["out"] + r.sizes["err"] > cap and r.reason is None:
                self.kill(r, "output-limit")
            elif kind == "res" and r.sizes["res"] > cap + 64 and r.reason is None:
                self.kill(r, "output-limit")
            if not drain:
                return

    def kill(self, r, reason):
        if r.reason is None:
            r.reason = reason
        self.kill_tree(r)

    def kill_tree(self, r):
        """SIGKILL the task's process group and every process of its slot uid."""
        try:
            os.killpg(r.pid, signal.SIGKILL)
        except OSError:
            pass
        if self.uids:
            _sweep_uid(self.uids[r.slot])

    def finish(self, r):
        if r.pid in self.orphan_status:
            status, rusage = self.orphan_status.pop(r.pid)
        else:
            _, status, rusage = os.wait4(r.pid, 0)
        duration = time.monotonic() - r.start
        # The main process is gone: kill whatever it left behind, then read the pipes dry.
        self.kill_tree(r)
        self.reap_orphans()
        for kind in ("out", "err", "res"):
            self.read_pipe(r, kind, drain=True)
            fd = r.fds.pop(kind, None)
            if fd is not None:
                self.sel.unregister(fd)
                os.close(fd)
        self.sel.unregister(r.pidfd)
        os.close(r.pidfd)
        try:
            os.rmdir(r.workdir)  # the common case: the program wrote nothing
        except OSError:
            shutil.rmtree(r.workdir, ignore_errors=True)
        del self.running[r.tid]
        del self.by_pid[r.pid]
        try:
            msg = self.verdict(r, status, rusage, duration)
            self.send(msg)
        except Exception as e:  # this task's failure is this task's alone
            self.send({"id": r.tid, "reason": "sandbox-error", "error": f"{type(e).__name__}: {e}"})

    def reap_orphans(self):
        """Reap re-parented grandchildren (we are a subreaper); keep statuses of our tasks."""
        while True:
            try:
                pid, status, rusage = os.wait3(os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.by_pid:
                self.orphan_status[pid] = (status, rusage)

    def verdict(self, r, status, rusage, duration):
        """What the host decides the task's status from: how the process ended (the
        zygote's own observations) and the child's result text, passed on unparsed."""
        cap = int(self.cfg["max_output_bytes"])
        raw = b"".join(r.bufs["res"])
        res = {"id": r.tid, "duration_s": duration, "reason": r.reason, "timeout_s": r.timeout,
               "stdout": b"".join(r.bufs["out"])[:cap].decode("utf-8", "replace"),
               "stderr": b"".join(r.bufs["err"])[:cap].decode("utf-8", "replace"),
               "cpu_s": (rusage.ru_utime + rusage.ru_stime) if rusage else None,
               "exit_code": os.waitstatus_to_exitcode(status), "result": None,
               "result_too_large": r.sizes["res"] > int(self.cfg["max_value_bytes"]) + 64}
        if raw and not res["result_too_large"]:
            res["result"] = raw.decode("utf-8", "surrogateescape")
        return res


def main():
    cfg = json.loads(sys.argv[1])
    try:
        z = Zygote(cfg)
    except BaseException as e:
        import traceback

        traceback.print_exc()
        _write_all(1, (json.dumps({"ready": False, "error": repr(e)}) + "\n").encode())
        raise SystemExit(1) from e
    z.serve()


if __name__ == "__main__":
    main()
