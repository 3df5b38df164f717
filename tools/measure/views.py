"""Pointers the sample never has (issue 62): parity's misaligned views.

Every other check hands the kernel freshly allocated tensors, which start where the allocator puts them: 64-byte
aligned on the CPU, 512 on a GPU. Callers pass views: `x[1:]` of a row-major tensor, one tensor of a packed buffer, a
slice of a KV cache. A kernel whose vector loads or stores assume its pointers are aligned (a head loop peeled by the
index, not the address; aligned SSE/AVX stores; a float4 cast) faults or reads the wrong elements there, and is right
on every freshly allocated buffer.

Before a keep (parity's full and rest extents) parity adds two checks on the smallest listed shape and on the first
hidden one (tools/measure/domains.value_shapes), labelled `misaligned`, each on the task's first distribution:

- `offset:same` - every input and the output at the smallest offset past a 64-byte boundary the task allows (one
  element, or the declared alignment): a kernel that needs more than that fails;
- `offset:apart` - each input and the output at a different offset (1 to 16 bytes' worth of whole elements, multiples
  of what is declared): a kernel that peels one head for all its pointers, as if they shared a phase, fails.

A task whose kernel needs an alignment declares it (task.toml `[parity] align = 16`, or `align` on one of its
[[inputs]]); the views then hold it (offsets that are multiples of it, never a multiple of 64) and the prompt says so.
The views go to the kernel's host as they are: the host makes its buffers at the same offset from a 64-byte boundary
(tools/judge/host.py), so the pointer the kernel gets is misaligned as the judge's is.
"""

from __future__ import annotations

import random

PREFIX = "offset:"
LINE = 64           # every allocator here aligns to at least this: an offset is taken modulo it
SPAN = 16           # the offsets drawn: up to 16 bytes' worth (one SSE/float4 vector), where the unit allows


def draws() -> list[str]:
    return [PREFIX + "same", PREFIX + "apart"]


def is_offset(dist: str) -> bool:
    return dist.startswith(PREFIX)


def choices(unit: int) -> list[int]:
    """The byte offsets past a 64-byte boundary a pointer of this unit (max of element size and declared alignment)
    may be at: its multiples up to 16 bytes, or the unit itself where it is 16 or more (none where it is 64+)."""
    return [unit * k for k in range(1, SPAN // unit + 1)] if unit < SPAN else [unit] if unit < LINE else []


class Offsets:
    """One misaligned check's offsets (bytes past a 64-byte boundary), per input (make_inputs' order) and for the
    output, drawn from the check's seed."""

    def __init__(self, spec, dist: str, seed: int, mod=None):
        self.spec, self.same = spec, dist == PREFIX + "same"
        self.names = _names(mod)
        self.rng = random.Random(seed ^ 0xA119)
        self.used: list[str] = []
        self.taken: set[int] = set()
        self.out: int | None = None

    def _unit(self, t, declared: int) -> int:
        return max(t.element_size(), declared, self.spec.parity.align)

    def _pick(self, unit: int, taken: set[int]) -> int:
        opts = choices(unit)
        if not opts:
            return 0
        if self.same:
            return opts[0]
        free = [o for o in opts if o not in taken] or opts
        return self.rng.choice(free)

    def inputs(self, torch, fresh: tuple) -> tuple:
        """The tensors of `fresh` copied into views at their offsets (contiguous, the same shape and values)."""
        out, taken = [], self.taken
        for i, x in enumerate(fresh):
            if not isinstance(x, torch.Tensor) or not x.numel():
                out.append(x)
                continue
            decl = self.spec.inputs[i].align if i < len(self.spec.inputs) else 0
            off = self._pick(self._unit(x, decl), taken)
            taken.add(off)
            name = self.spec.inputs[i].name if i < len(self.spec.inputs) and self.spec.inputs[i].name else \
                self.names[i] if i < len(self.names) else f"input {i}"
            self.used.append(f"{name} at +{off} B")
            out.append(at(torch, x, off))
        return tuple(out)

    def output(self, template) -> int:
        """The output's offset past a 64-byte boundary, in elements: drawn once per check (its buffers are reused)."""
        if self.out is None:
            self.out = self._pick(self._unit(template, 0), self.taken)
            self.used.append(f"the output at +{self.out} B")
        return self.out // template.element_size()

    def text(self) -> str:
        return (", ".join(self.used) + " past a 64-byte boundary: right on freshly allocated buffers, wrong on a "
                "caller's view; peel a head per pointer or load unaligned, or declare what the kernel needs "
                "([parity] align)")


def _names(mod) -> list[str]:
    """The inputs' names, as the task's reference calls them (reference(shape, x, w, ...)), where it can tell."""
    import inspect
    try:
        params = list(inspect.signature(mod.reference).parameters.values())[1:]
    except (TypeError, ValueError, AttributeError):
        return []
    return [] if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params) else [p.name for p in params]


def at(torch, x, offset: int):
    """A contiguous copy of x whose first element is `offset` bytes past a 64-byte boundary: a view into a larger
    buffer, as a caller's slice is."""
    view = empty_at(torch, x.numel(), x.dtype, x.device, offset).view(x.shape)
    view.copy_(x)
    return view


def empty_at(torch, numel: int, dtype, device, offset: int):
    """An uninitialized flat tensor of numel elements starting `offset` bytes past a 64-byte boundary."""
    el = torch.empty(0, dtype=dtype).element_size()
    if offset % el or not 0 <= offset < LINE:
        raise ValueError(f"an offset of {offset} bytes: a whole number of {el}-byte elements below {LINE}")
    flat = torch.empty(numel + (LINE + offset) // el, dtype=dtype, device=device)
    start = (offset - flat.data_ptr() % LINE) % LINE // el
    return flat[start:start + numel]


def misalignment(t) -> int:
    """Bytes past the 64-byte boundary below t's first element."""
    return t.data_ptr() % LINE
