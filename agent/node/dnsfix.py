"""Turns off c10d's reverse-DNS lookups in this process, so store connections never stall.

Why: TCPStore formats every peer address with getnameinfo() (no NI_NUMERICHOST). Peers appear as
v4-mapped IPv6 (`::ffff:127.0.0.1`), which /etc/hosts rarely lists, so each connection asks DNS
for a PTR record; a dropped query costs glibc's 5 s retry (64 clients here: 10 s). c10d itself
keeps a process-wide flag that switches the lookups off after the first failure; we set that flag
up front. It is a local static (no exported symbol), so we find it in libtorch_cpu.so's .symtab.
Everything is checked; if anything looks unexpected we change nothing and return False.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct

_SYMBOL = b"_ZZN4c10d6detail14formatSockAddrB5cxx11EPK8sockaddrjE19disable_getnameinfo"
_SHT_SYMTAB = 2
_SYM_SIZE = 24  # Elf64_Sym


# path → the flag's address in this process, once found: finding it reads libtorch_cpu.so's
# symbol table (0.02 s), and node 0 makes a store for the ranks at every attempt of every run.
_FOUND: dict[str, int] = {}


def disable_reverse_dns(torch_lib_dir: str) -> bool:
    """Set c10d's `disable_getnameinfo` flag; True when it is now set. libtorch must be loaded."""
    path = os.path.realpath(os.path.join(torch_lib_dir, "libtorch_cpu.so"))
    address = _FOUND.get(path)
    if address is None:
        try:
            offset = _symbol_offset(path)
            base = _load_base(path) if offset is not None else None
        except (OSError, ValueError, struct.error, StopIteration):
            return False
        if offset is None or base is None or not _is_writable(base + offset):
            return False
        address = _FOUND[path] = base + offset
    flag = ctypes.c_bool.from_address(address)
    flag.value = True
    return True


def found_address(library: str) -> int | None:
    """Where this process found the flag in `library` (a libtorch_cpu.so path), if it has."""
    return _FOUND.get(os.path.realpath(library))


def _symbol_offset(path: str) -> int | None:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:5] != b"\x7fELF\x02" or m[5] != 1:  # 64-bit little-endian only
            return None
        (shoff,) = struct.unpack_from("<Q", m, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", m, 0x3A)
        sections = [
            struct.unpack_from("<IIQQQQIIQQ", m, shoff + i * shentsize) for i in range(shnum)
        ]
        symtab = next(s for s in sections if s[1] == _SHT_SYMTAB)
        strtab = sections[symtab[6]]
        str_start, str_end = strtab[4], strtab[4] + strtab[5]
        # The name must start right after a NUL: string tables share suffixes between names.
        at = m.find(b"\0" + _SYMBOL + b"\0", str_start - 1, str_end)
        if at < 0:
            return None
        needle = struct.pack("<I", at + 1 - str_start)
        start, end = symtab[4], symtab[4] + symtab[5]
        pos = m.find(needle, start, end)
        while pos >= 0 and (pos - start) % _SYM_SIZE:
            pos = m.find(needle, pos + 1, end)
        if pos < 0:
            return None
        value, size = struct.unpack_from("<QQ", m, pos + 8)
        return value if size == 1 else None


def _load_base(path: str) -> int | None:
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            # A private mapping at file offset 0: the loader's, not someone's mmap of the file.
            private_at_zero = (
                len(fields) >= 6 and fields[1].endswith("p") and int(fields[2], 16) == 0
            )
            if private_at_zero and os.path.realpath(fields[5]) == path:
                return int(fields[0].split("-")[0], 16)
    return None


def _is_writable(address: int) -> bool:
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if low <= address < high:
                return fields[1].startswith("rw")
    return False
