"""A C/C++/CUDA file's top-level items, read without a compiler: enough for tools.backends.cu_split.

The file is read by tree-sitter's CUDA grammar (a superset of C++'s; issue 65): its top-level nodes are the items,
each with what its declarators declare; a conditional's directives are items of their own and what its branches hold
is read as top-level items too (as the compiler sees them). A function whose body the grammar cannot read (a `#pragma
unroll` between a `for` and its statement) is still one item. Where the grammar cannot read the top level itself (a
macro standing for declarations, a conditional whose branches each open a function's brace), the file is cut by its
brackets instead: blanked comments and literals (same length, line breaks kept), each item up to its `;` or closing
brace, only the first branch of a conditional inside an item counting its braces; what each such item declares is then
read by parsing its text alone, else by patterns (a name missed only makes the split fail to compile, and the file is
built whole). Each item knows whether it names torch and which CUDA space it is in (words, read by patterns).
Launches `k<T><<<config>>>(args)` are calls with a kernel_call_syntax in the grammar, read with their callee,
configuration and arguments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tools.backends import cu_tree

_MASK = re.compile(r'//[^\n]*|/\*.*?\*/|R"([^(\s"]{0,16})\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
IDENT = re.compile(r"[A-Za-z_]\w*")
_TORCH = re.compile(r"\b(?:torch|at|c10|pybind11|py)\s*::|\b(?:TORCH|AT|C10|PYBIND11)_[A-Z0-9_]+\b|\bTensor\b")
TORCH_INCLUDE = re.compile(r'#\s*include\s*[<"](?:torch/|ATen/|c10/|pybind11/|Python\.h)')
_DEVICE = re.compile(r"\b__(global|device|constant|shared|managed)__\b")
# declaration attributes that take parentheses (a declared name is before the parameter list's)
_ATTRS = re.compile(r"\b(?:__launch_bounds__|__maxnreg__|__cluster_dims__|alignas|__declspec)\s*\([^()]*(?:\([^()]*\)[^()]*)*\)"
                    r"|__attribute__\s*\(\(.*?\)\)")


@dataclass
class Item:
    start: int
    end: int
    line: int
    kind: str                      # "pp" (a directive) or "code" (a top-level declaration or definition)
    text: str = ""                 # the user's text
    masked: str = ""               # comments and literals blanked (same length)
    names: set[str] = field(default_factory=set)
    torch: bool = False
    device: str = ""               # "global", "device", ... (the first CUDA space it names)


def mask(text: str) -> str:
    """`text` with comments and literals blanked: same length, line breaks kept."""
    return _MASK.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def _directive(masked: str, start: int) -> int:
    """End of the preprocessor line at `start` (its backslash continuations included)."""
    end = start
    while True:
        nl = masked.find("\n", end)
        if nl < 0:
            return len(masked)
        if masked[:nl].rstrip(" \t\r").endswith("\\"):
            end = nl + 1
            continue
        return nl


def _skip_alternatives(masked: str, k: int) -> int:
    """Past the directive at `k` inside an item; from an #elif/#else, past the matching #endif too, so
    that only the first branch of a conditional counts its braces (each branch opens its own)."""
    if not re.match(r"#\s*(?:elif|else)", masked[k:k + 12]):
        return _directive(masked, k)
    depth = 0
    for m in re.finditer(r"(?m)^[ \t]*#[ \t]*(if|ifdef|ifndef|endif)\b", masked[k:]):
        depth += 1 if m.group(1) != "endif" else -1
        if depth < 0:
            return _directive(masked, k + m.start())
    return len(masked)


def _ends_at_brace(head: str) -> bool:
    """Whether a top-level item whose head (the text before its first `{`) is `head` ends at its
    closing brace (a function, a namespace, PYBIND11_MODULE) or runs on to a `;` (a class, an initializer)."""
    h = re.sub(r"^\s*template\s*<[^{;]*?>\s*", "", head)
    if re.match(r"\s*(?:typedef\s+)?(?:struct|class|union|enum)\b", h):
        return False
    return not re.search(r"(?<![=!<>+\-*/%&|^])=(?!=)", h)


def scan(text: str) -> list[Item]:
    """The file's top-level items in order: directives, and declarations or definitions each up to its
    `;` or closing brace. Directives inside an item stay part of it. Read by the parser (_parsed), or where it
    cannot read the file (a macro standing for a declaration: `S64(0) S64(1)`, a conditional whose branches
    open different braces) by the text's brackets (_cut)."""
    masked = mask(text)
    parsed = cu_tree.items(text, masked)
    items = _cut(text, masked) if parsed is None else [
        Item(s, e, text.count("\n", 0, s) + 1, kind, names=names) for kind, s, e, names in parsed]  # type: ignore[arg-type]
    for it in items:
        it.text, it.masked = text[it.start:it.end], masked[it.start:it.end]
        if it.kind == "code":
            it.torch = bool(_TORCH.search(it.masked))
            dev = _DEVICE.search(it.masked)
            it.device = dev.group(1) if dev else ""
            if it.names is None:         # cut by brackets: its own text parsed, else read by patterns
                alone = cu_tree.items(it.text, it.masked)
                it.names = alone[0][3] if alone and len(alone) == 1 and alone[0][0] == "code" else _names(it.masked)
        else:
            m = re.match(r"#\s*(?:define|undef)\s+(\w+)", it.masked)
            it.names = {m.group(1)} if m else set()
    return items


def _cut(text: str, masked: str) -> list[Item]:
    """The top-level items by the text's brackets, where the parser cannot read the file (scan)."""
    items, i, n = [], 0, len(text)
    while i < n:
        while i < n and masked[i] in " \t\r\n;":
            i += 1
        if i >= n:
            break
        line = text.count("\n", 0, i) + 1
        if masked[i] == "#":
            end = _directive(masked, i)
            items.append(Item(i, end, line, "pp"))
            i = end
            continue
        depth, k, head_end = 0, i, None
        while k < n:
            c = masked[k]
            if c == "#" and masked[masked.rfind("\n", 0, k) + 1:k].strip() == "":
                k = _skip_alternatives(masked, k)
                continue
            if c in "([{":
                depth += 1
                if c == "{" and depth == 1 and head_end is None:
                    head_end = k
            elif c in ")]}":
                depth -= 1
                if c == "}" and depth == 0 and head_end is not None and _ends_at_brace(masked[i:head_end]):
                    k += 1
                    break
            elif c == ";" and depth == 0:
                k += 1
                break
            k += 1
        items.append(Item(i, k, line, "code", names=None))  # type: ignore[arg-type]
        i = k
    return items


def _depth0(s: str) -> str:
    """`s` with everything inside brackets removed (top-level tokens only)."""
    out, depth = [], 0
    for c in s:
        if c in "([{<" and not (c == "<" and depth == 0 and out and out[-1] in " =<"):
            depth += c != "<"
        if c in ")]}":
            depth -= 1
            continue
        if depth == 0 and c not in "([{":
            out.append(c)
    return "".join(out)


def _names(masked: str) -> set[str]:
    """What a top-level item declares (approximately: a name missed only costs the split, which then
    does not compile and is built whole)."""
    body = masked.split("{", 1)[0] if not re.match(r"\s*(?:template\s*<[^;{]*>\s*)?(?:typedef\s+)?(?:struct|class|union|enum)\b", masked) else masked
    head = re.sub(r"^\s*template\s*<[^{;]*?>\s*", "", body)
    if m := re.match(r"\s*(?:typedef\s+)?(?:struct|class|union|enum(?:\s+class|\s+struct)?)\s+"
                     r"(?:(?:__\w+__|alignas)\s*(?:\([^()]*\))?\s*)*(\w+)", head):
        extra = set(re.findall(r"}\s*(\w+)\s*[;,\[=]", masked))      # struct S {...} s;  typedef struct {...} T;
        return {m.group(1)} | extra
    if m := re.match(r"\s*using\s+(\w+)\s*=", head):
        return {m.group(1)}
    if re.match(r"\s*extern\s*{", masked):                             # extern "C" { ... }: what it holds
        return set().union(set(), *(it.names for it in scan(masked[masked.index("{") + 1:masked.rindex("}")])))
    if re.match(r"\s*(?:namespace|using|static_assert)\b", head):
        return set(re.findall(r"\bnamespace\s+(\w+)", head))
    if re.match(r"\s*typedef\b", head):
        return {re.findall(r"(\w+)\s*(?:\)|\[|;|$)", head.rstrip())[-1]} if re.search(r"\w", head) else set()
    head = _ATTRS.sub(" ", head)
    top = _depth0(head)
    eq, par = top.find("="), head.find("(")
    if par >= 0 and (eq < 0 or par < head.find("=")):                # a function
        m = re.search(r"(\w+)\s*(?:<[^()]*>)?\s*$", head[:par])
        return {m.group(1)} if m else set()
    names = set()
    for seg in top.split(","):                                        # variables: int a = 1, b[4];
        if m := re.search(r"(\w+)\s*(?:\[[^\]]*\]\s*)*(?:=.*)?$", seg.strip().rstrip(";")):
            names.add(m.group(1))
    return names


def duplicable(it: Item) -> bool:
    """An item both halves may hold a copy of (C++'s one-definition rule allows identical copies)."""
    head = re.sub(r"^\s*template\s*<[^{;]*?>\s*", "", it.masked.split("{", 1)[0])
    if re.match(r"\s*template\b", it.masked) or re.match(r"\s*(?:typedef|using|struct|class|union|enum)\b", head):
        return True
    if "(" in head.split("=")[0]:                                    # a function
        return bool(re.search(r"\b(?:inline|static|constexpr|__forceinline__)\b", head))
    return bool(re.search(r"\bconstexpr\b", head) or (re.search(r"\bconst\b", head) and "extern" not in head))


@dataclass
class Launch:
    start: int
    end: int
    callee: str
    config: str
    args: str


def launches_in(masked: str, text: str) -> list[Launch]:
    """The `callee<<<config>>>(args)` launches in an item's text (`masked`: the same with comments and literals
    blanked), read by the parser (a call with a kernel_call_syntax: `(k)<<<...>>>`, `table[i]<<<...>>>` too), else, where
    it cannot read one of them, by the brackets (_launches_by_brackets)."""
    if "<<<" not in masked:
        return []
    got = cu_tree.launches(text, masked)
    if got is None or len(got) != masked.count("<<<"):
        return _launches_by_brackets(masked, text)
    return [Launch(*ln) for ln in got]


def _launches_by_brackets(masked: str, text: str) -> list[Launch]:
    out = []
    for m in re.finditer(r"<<<", masked):
        s = m.start()
        j = s
        while j > 0 and masked[j - 1].isspace():
            j -= 1
        if j > 0 and masked[j - 1] == ">":                 # k<T, 64><<<
            depth, j = 0, j - 1
            while j >= 0:
                depth += {">": 1, "<": -1}.get(masked[j], 0)
                if depth == 0:
                    break
                j -= 1
        c = re.search(r"(?:::\s*)?(?:\w+\s*::\s*)*\w+\s*$", masked[:j])
        if c is None:
            return []
        depth, k = 0, m.end()
        while k < len(masked) and not (depth == 0 and masked.startswith(">>>", k)):
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(masked[k], 0)
            k += 1
        a = k + 3
        while a < len(masked) and masked[a].isspace():
            a += 1
        if a >= len(masked) or masked[a] != "(":
            return []
        depth, e = 0, a
        while e < len(masked):
            depth += {"(": 1, ")": -1}.get(masked[e], 0)
            e += 1
            if depth == 0:
                break
        out.append(Launch(c.start(), e, text[c.start():s].strip(), text[m.end():k].strip(), text[a + 1:e - 1].strip()))
    return out


def directive(it: Item) -> str:
    m = re.match(r"#\s*(\w+)", it.masked)
    return m.group(1) if m else ""




def _top_level(config: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in config:
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def default_stream_launches(text: str) -> list[int]:
    """The lines of `<<<...>>>` launches that name no stream (or stream 0): they run on the legacy default stream."""
    out = []
    for launch in launches_in(mask(text), text):
        parts = _top_level(launch.config)
        if len(parts) < 4 or parts[3].strip() in ("0", "nullptr", "NULL", "cudaStreamLegacy"):
            out.append(text.count("\n", 0, launch.start) + 1)
    return out
