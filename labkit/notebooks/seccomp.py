"""A seccomp filter for the sandbox (``bwrap --seccomp FD``), built here in plain Python.

A classic-BPF program (``struct sock_filter`` array, ``linux/filter.h``) over ``struct
seccomp_data`` (``linux/seccomp.h``: ``nr`` at offset 0, ``arch`` at 4, ``args[0]`` at 16). It
refuses, with ``EPERM``, system calls no exercise needs and a submission could use to leave or
inspect its box: new namespaces (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag),
``ptrace`` and reading other processes' memory, ``mount`` and friends, the kernel keyring
(``keyctl``), ``bpf``, ``perf_event_open``, modules, ``reboot``, ``io_uring``. ``clone3`` gets
``ENOSYS`` (its flags sit behind a pointer the filter cannot read), so the C library falls back
to ``clone``, whose flags it can. x86-64 only: elsewhere :func:`program` returns None and the
sandbox runs without it (the namespaces and limits still hold). Libseccomp's Python bindings
(Debian ``python3-seccomp``) would do the same, but only for the system's Python.

Each instruction is ``struct sock_filter {u16 code; u8 jt; u8 jf; u32 k}``; jumps are relative
to the next instruction.
"""
from __future__ import annotations

import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
X32_BIT = 0x40000000                     # the x32 ABI's syscall numbers: refused outright
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
EPERM, ENOSYS = 1, 38
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
CLONE, CLONE3 = 56, 435
CLONE_NEW = 0x7E020080                   # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME
REFUSED = {                              # x86-64 numbers (arch/x86/entry/syscalls/syscall_64.tbl)
    "ptrace": 101, "syslog": 103, "pivot_root": 155, "chroot": 161, "acct": 163, "mount": 165, "umount2": 166,
    "swapon": 167, "swapoff": 168, "reboot": 169, "iopl": 172, "ioperm": 173, "init_module": 175,
    "delete_module": 176, "quotactl": 179, "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250,
    "unshare": 272, "perf_event_open": 298, "open_by_handle_at": 304, "setns": 308, "process_vm_readv": 310,
    "process_vm_writev": 311, "kcmp": 312, "finit_module": 313, "bpf": 321, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program() -> bytes | None:
    """The filter as bytes for ``bwrap --seccomp FD``, or None off x86-64."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    prog = [_op(LD_W_ABS, 4),                                   # A = arch
            _op(JEQ_K, AUDIT_ARCH_X86_64, 1, 0),                # x86-64: skip the next
            _op(RET_K, RET_ERRNO | EPERM),                      # another ABI (i386 via int 0x80): refused
            _op(LD_W_ABS, 0),                                   # A = syscall number
            _op(JGE_K, X32_BIT, 0, 1),
            _op(RET_K, RET_ERRNO | EPERM)]
    for nr in sorted(REFUSED.values()):
        prog += [_op(JEQ_K, nr, 0, 1), _op(RET_K, RET_ERRNO | EPERM)]
    prog += [_op(JEQ_K, CLONE3, 0, 1), _op(RET_K, RET_ERRNO | ENOSYS),
             _op(JEQ_K, CLONE, 0, 3),                           # clone: look at its flags
             _op(LD_W_ABS, 16),                                 # A = low 32 bits of args[0] (little-endian)
             _op(JSET_K, CLONE_NEW, 0, 1),
             _op(RET_K, RET_ERRNO | EPERM),
             _op(RET_K, RET_ALLOW)]
    return b"".join(prog)
