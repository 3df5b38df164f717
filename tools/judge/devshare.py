"""Buffers between the judge and its kernel host through CUDA IPC instead of files (issue 44's cost per candidate).

A GPU buffer the judge wants back from the host (an output after the calls, an input a call changed), or sends it (an
input), travelled as a file: device to host memory, written, read, host memory to device. For softmax's main shape that is 64 MiB each
way per parity check; for the wide shape (tools/judge/wide.py) 4 GiB, 5.4-6.8 s of its 6-8 s. Here the host answers
with the CUDA IPC handle of the buffer's allocation and its offset in it (`export`: after the calls for what comes
back; for an input, the host makes the buffer first and answers its handle), and the judge maps that allocation
(`Mapped`) and copies the bytes device to device, into its own tensor or into the host's buffer.

Which way the trust goes: only the host exports, and only its own memory; the judge maps the host's allocations,
never the other way, so the candidate's process can reach no byte of the judge's memory (the references, the
verdict's inputs). The judge checks every range against the size of the allocation it mapped (the driver's word,
asked in the judge), not against the host's answer, and copies before it sends the host another request (it
synchronizes first), so the host cannot change the bytes under the copy by anything it does after answering.

Where the driver refuses (an allocation it cannot share: torch's expandable segments, a host under
compute-sanitizer, no libcuda), the host writes the file as before: `export` returns None. AGENT_HOST_IPC=0 turns
the channel off (the files every time), for an A/B measurement on one card.
"""

from __future__ import annotations

import ctypes
import os

CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
_cuda: ctypes.CDLL | None = None


class _Handle(ctypes.Structure):
    """CUipcMemHandle: 64 opaque bytes, NULs among them (read and written whole: a c_char array's value stops at
    the first NUL)."""
    _fields_ = [("reserved", ctypes.c_char * 64)]


def handle_text(h: _Handle) -> str:
    """A handle for the JSON answer: its 64 bytes as hex, NULs and all."""
    return bytes(h).hex()


def handle_of(text: str) -> _Handle:
    return _Handle.from_buffer_copy(bytes.fromhex(text))


def enabled() -> bool:
    return os.environ.get("AGENT_HOST_IPC", "1") != "0"


def driver() -> ctypes.CDLL | None:
    global _cuda
    if _cuda is None:
        try:
            _cuda = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return None
    return _cuda


def _range(cu: ctypes.CDLL, ptr: int) -> tuple[int, int] | None:
    """(base, size) of the allocation holding device address ptr, in this process."""
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    rc = cu.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    return (base.value, size.value) if rc == 0 else None


def export(t) -> dict | None:
    """On the host: {handle, offset, nbytes} for the contiguous CUDA tensor t, or None where it cannot be shared."""
    cu = driver() if enabled() and t.is_cuda and t.is_contiguous() else None
    if cu is None:
        return None
    h = _Handle()
    if cu.cuIpcGetMemHandle(ctypes.byref(h), ctypes.c_uint64(t.data_ptr())) != 0:
        return None
    where = _range(cu, t.data_ptr())
    if where is None:
        return None
    return {"handle": handle_text(h), "offset": t.data_ptr() - where[0], "nbytes": t.numel() * t.element_size()}


def within(offset: int, nbytes: int, size: int) -> bool:
    """A range the judge may copy: inside the allocation it mapped."""
    return isinstance(offset, int) and isinstance(nbytes, int) and offset >= 0 and nbytes >= 0 and offset + nbytes <= size


class _Device:
    """What torch.as_tensor takes for memory it does not own (__cuda_array_interface__): bytes at a device address."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 2}


class Mapped:
    """The host's allocations the judge has mapped, by handle; each mapped once, all unmapped by close()."""

    def __init__(self) -> None:
        # handle -> (address here, size). A handle names one allocation: memory the host frees and allocates again
        # at the same address gets a new handle (the driver's cuIpcGetMemHandle contract), so a mapping kept here is
        # never taken for another allocation's.
        self.open: dict[str, tuple[int, int]] = {}

    def _view(self, t, shared: dict):
        """The host's bytes `shared` names, as a uint8 tensor here over the mapped allocation; ValueError where the
        answer is malformed, does not match t's size, or names bytes outside the allocation."""
        import torch
        cu = driver()
        handle, offset, nbytes = shared.get("handle"), shared.get("offset"), shared.get("nbytes")
        if not t.is_cuda:
            raise ValueError("it shared device memory for a buffer the judge holds in host memory")
        if cu is None or not isinstance(handle, str) or len(handle) != 128 or nbytes != t.numel() * t.element_size():
            raise ValueError(f"a shared buffer the judge cannot take: {str(shared)[:160]}")
        if handle not in self.open:
            ptr = ctypes.c_uint64()
            rc = cu.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), handle_of(handle), CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
            where = _range(cu, ptr.value) if rc == 0 else None
            if where is None:
                raise ValueError(f"the driver could not map the host's buffer (CUresult {rc})")
            self.open[handle] = where
        base, size = self.open[handle]
        if not within(offset, nbytes, size):
            raise ValueError(f"a shared range outside its allocation: offset {offset}, {nbytes} bytes of {size}")
        return torch.as_tensor(_Device(base + offset, nbytes), device=t.device)

    def copy_into(self, t, shared: dict) -> None:
        """t (a contiguous CUDA tensor of the judge) gets the host's bytes (an output, an input a call changed)."""
        import torch
        t.view(-1).view(torch.uint8).copy_(self._view(t, shared))

    def copy_from(self, t, shared: dict) -> None:
        """The host's buffer gets t's bytes (an input, before the calls)."""
        import torch
        self._view(t, shared).copy_(t.detach().reshape(-1).view(torch.uint8))

    def close(self) -> None:
        """Unmap all (after the copies are done: the caller synchronized); the host's memory is its own again."""
        cu = driver()
        for base, _ in self.open.values():
            if cu is not None:
                cu.cuIpcCloseMemHandle(ctypes.c_uint64(base))
        self.open.clear()
