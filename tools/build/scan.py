"""A static scan of a candidate's editable sources before its build (issue 42): what no kernel needs, found in
milliseconds with the line quoted, before anything compiles or runs.

The runtime probes (parity, the bench's, the sanitizers) catch behaviour; this catches intent that needs no run: a
kernel computes its outputs from its inputs, on the stream it is given. It does not read the environment or /proc,
open files, start threads, processes or streams, keep mutable state between calls, load other code, read clocks,
print, or hand the work to the reference's own library. Each rule is a class of such mistakes (a debug printf left
in, a tuning cache in a file, a static workspace, a side stream "for overlap"), not a list of known cheats.

Comments and literals are blanked before a code pattern is matched (tools.backends.cu_scan.mask), so a comment or a
string that merely names a function is not a hit; a few rules look inside string literals instead (a path under
/proc, an inline-asm clock register). A task allows a rule by name with the reason in task.toml:

    [scan]
    allow = { host_output = "the kernel's error path prints the CUDA error" }

The rejection names the file, the line, the rule and why, and quotes the line.

The same rules run again on the sources as the compiler reads them (scan_expanded; tools/build/expand.py: macros
expanded, the user's lines picked out), beside the build, the user's line quoted beside what it became. There a parser
(tree-sitter's CUDA grammar, a superset of C++'s) also reads what no pattern over the text sees: a variable at
namespace scope that is not const (namespace_globals), and a function a rule names referred to without `name(`
(referenced: `(puts)(...)`, `auto f = std::fopen;`, `&dlsym`), the names the code declares itself left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tools.backends.cu_scan import IDENT, mask

_LITERAL = re.compile(r'R"([^(\s"]{0,16})\((.*?)\)\1"|"((?:\\.|[^"\\\n])*)"', re.S)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


@dataclass(frozen=True)
class Rule:
    name: str
    why: str
    code: re.Pattern | None = None       # matched on the source with comments and literals blanked
    literal: re.Pattern | None = None    # matched inside string literals
    refers: re.Pattern | None = None     # a name the compiled code may not refer to (called, or taken as a pointer)


def _calls(*names: str) -> re.Pattern:
    return re.compile(r"(?<![\w.>:])(?:std::|::)?(?:" + "|".join(names) + r")\s*\(")


def _any(*names: str) -> re.Pattern:
    return re.compile("|".join(names))


# the functions each rule names, once: the written-text patterns and the parser's references (referenced()) read them
_SYSTEM = ("getenv", "secure_getenv", "setenv", "putenv", "unsetenv", "environ", "sysconf", "uname")
_FILES = ("fopen", "freopen", "fdopen", "open", "openat", "creat", "mkstemp", "tmpfile", "unlink", "rename", "chmod",
          "mkdir", "truncate")
_PROCS = ("fork", "vfork", "clone", "execl", "execlp", "execle", "execv", "execvp", "execvpe", "system", "popen",
          "posix_spawn", "posix_spawnp", "pthread_create", "kill", "raise", "signal", "sigaction")
_STREAMS = (r"cudaStreamCreate\w*", r"cuStreamCreate\w*", "cudaLaunchHostFunc", "cudaStreamAddCallback",
            "cuLaunchHostFunc", "getStreamFromPool")
# and the CUDA driver's and runtime's loading of a module at run time (a cubin or PTX blob the build never compiled,
# its kernels by a name made at run time: hidden from the scan and, named in PyTorch's namespaces, from racecheck)
_LOADING = ("dlopen", "dlmopen", "dlsym", "dlvsym", r"cuModuleLoad\w*", r"cuLibraryLoad\w*", r"cudaLibraryLoad\w*")
_CLOCKS = ("clock", "clock64", "clock_gettime", "gettimeofday", "time", "__rdtsc", "rdtsc", "__builtin_readcyclecounter",
           "__globaltimer")
_PRINTS = ("printf", "fprintf", "puts", "fputs", "putchar", "perror", "write")
_LIBS = (r"cublas\w*", r"cublasLt\w*", r"cudnn\w*", r"cufft\w*")
_OPS = (r"(?:torch|at)::(?:matmul|mm|bmm|addmm|baddbmm|linear|softmax|log_softmax|_softmax|scaled_dot_product_attention|"
        r"_scaled_dot_product\w*|conv\w*|einsum|layer_norm|native_\w+)")
_PY = r"Py(?:Run|Import|Eval|Object_Call)\w*"

RULES: list[Rule] = [
    Rule("system_state", "reads the environment or the system's files, or makes a raw system call: a kernel's result "
         "depends on its inputs alone",
         code=re.compile(r"\b(?:" + "|".join(_SYSTEM) + r")\b|" + _calls("syscall").pattern),
         literal=re.compile(r"^/(?:proc|sys|dev)/|^\s*syscall\b"),   # a path; the instruction in inline asm
         refers=_any(*_SYSTEM, "syscall")),
    Rule("file_io", "opens or changes files: a kernel does no file I/O (a cache or a log in a file outlives the call)",
         code=re.compile(_calls(*_FILES).pattern + r"|\b(?:ofstream|ifstream|fstream|filebuf|filesystem)\b"),
         refers=_any(*_FILES)),
    Rule("threads_processes", "starts threads or processes or sends signals: a kernel's call does its work and returns",
         code=re.compile(_calls(*_PROCS).pattern + r"|\bstd::(?:thread|jthread|async)\b|^[ \t]*#[ \t]*pragma[ \t]+omp\b",
                         re.M),
         literal=re.compile(r"^\s*omp\s+\w"),   # _Pragma("omp parallel for")
         refers=_any(*_PROCS)),
    Rule("new_streams", "makes CUDA streams or host callbacks of its own: the task gives the kernel its stream, and "
         "work elsewhere is work the timing does not see",
         code=re.compile(r"\b(?:" + "|".join(_STREAMS) + r")\b"), refers=_any(*_STREAMS)),
    Rule("mutable_static", "keeps mutable state between calls (a static or thread_local variable, a __device__ or "
         "__managed__ global): a call's result then depends on the calls before it, or on another call at once",
         code=None),
    Rule("dynamic_loading", "loads code the build did not compile (another library's kernel through a handle, a "
         "module loaded at run time)",
         code=_calls(*_LOADING), refers=_any(*_LOADING),
         literal=re.compile(r"^(?:cuModuleLoad|cuLibraryLoad|cudaLibraryLoad)\w*$")),   # cuGetProcAddress("...")
    Rule("clocks", "reads a clock: what a kernel computes does not depend on time (a timed run and a checked run "
         "would differ)",
         code=re.compile(_calls(*_CLOCKS).pattern + r"|\bstd::chrono\b"),
         literal=re.compile(r"%%?(?:globaltimer|clock64|clock)\b"), refers=_any(*_CLOCKS)),
    Rule("host_output", "prints: a kernel's output is its tensors (a debug print left in floods the run's logs)",
         code=re.compile(_calls(*_PRINTS).pattern + r"|\bstd::(?:cout|cerr|clog)\b"), refers=_any(*_PRINTS)),
    Rule("reference_library", "hands the work to a library the kernel is measured against (cuBLAS, cuDNN, torch's "
         "operators, Python): the kernel must compute it",
         code=re.compile(r"\b(?:" + "|".join(_LIBS) + r")\s*\(|\b" + _OPS + r"\b|\btorch::nn::functional\b|\b" + _PY
                         + r"\s*\("),
         refers=_any(*_LIBS, _OPS, _PY)),
]
NAMES = [r.name for r in RULES]


@dataclass(frozen=True)
class Hit:
    rule: str
    file: str
    line: int
    quote: str
    compiled: str = ""     # the line as the preprocessor left it, where only that showed the hit (scan_expanded)

    def describe(self) -> str:
        why = next(r.why for r in RULES if r.name == self.rule)
        return (f"{self.file}:{self.line}: {self.rule}: {why}: `{self.quote}`"
                + (f" (as the compiler reads it: `{self.compiled}`)" if self.compiled else ""))


_QUALIFIERS = {"const", "constexpr", "consteval", "__constant__", "__shared__"}
_CALL_AFTER = {"return", "else", "do", "case", "throw", "co_return", "co_await", "new", "delete", "sizeof", "decltype"}


def _mutable_statics(masked: str) -> list[int]:
    """Offsets of variable declarations that keep state between calls: `static` or `thread_local` ones that are not
    const (a static function, or a __shared__ array, is not state), and __device__ or __managed__ variables."""
    out = []
    for m in re.finditer(r"\b(?:static|thread_local|__device__|__managed__)\b", masked):
        stmt = re.match(r"[^;{}]*", masked[m.start():]).group(0)
        head = stmt.split("=", 1)[0]
        words = set(IDENT.findall(head))
        if words & _QUALIFIERS or "(" in head or "operator" in words:
            continue   # const data, a function (its parameter list), shared memory
        if m.group(0) == "__device__" and re.search(r"\b(?:static|thread_local|__managed__)\b", masked[:m.start()].rsplit(";", 1)[-1]):
            continue   # counted at the keyword before it
        if not IDENT.search(head[len(m.group(0)):]):
            continue   # a bare keyword (a macro's argument)
        out.append(m.start())
    return out


def scan_text(text: str, file: str, allow=()) -> list[Hit]:
    """The hits in one source file's text, its rules in `allow` left out; one hit a rule a line."""
    masked = mask(text)
    lines = text.splitlines()
    found: dict[tuple[str, int], Hit] = {}

    def add(rule: str, offset: int) -> None:
        n = text.count("\n", 0, offset) + 1
        quote = " ".join(lines[n - 1].split())[:160] if n <= len(lines) else ""
        found.setdefault((rule, n), Hit(rule, file, n, quote))

    def defined(m: re.Match) -> bool:
        """A call pattern matched where a function of that name is declared or defined (`void write(`)."""
        if not m.group(0).endswith("("):
            return False
        before = re.search(r"([A-Za-z_]\w*)\s*$", masked[max(0, m.start() - 64):m.start()])
        return before is not None and before.group(1) not in _CALL_AFTER

    uncommented = _COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    for r in RULES:
        if r.name in allow:
            continue
        if r.code is not None:
            for m in r.code.finditer(masked):
                if not defined(m):
                    add(r.name, m.start())
        if r.literal is not None:
            for m in _LITERAL.finditer(uncommented):
                body = m.group(2) if m.group(2) is not None else m.group(3) or ""
                if r.literal.search(body):
                    add(r.name, m.start())
        if r.name == "mutable_static":
            for off in _mutable_statics(masked):
                add(r.name, off)
    return sorted(found.values(), key=lambda h: (h.line, h.rule))


def scan_task(task, src_dir: Path | None = None) -> list[Hit]:
    """The hits in the task's editable sources (in `src_dir`, default the task's folder), less the rules task.toml's
    [scan] allow names."""
    root = Path(src_dir or task.root)
    allow = set(task.spec.scan.allow)
    hits: list[Hit] = []
    for rel in task.spec.editable:
        p = root / rel
        if p.is_file():
            hits += scan_text(p.read_text(errors="replace"), rel, allow)
    return hits


_ADJACENT = re.compile(r'"((?:\\.|[^"\\\n])*)"[ \t]*"')   # on one line: the text's lines map to the user's


def scan_expanded(lines: list[tuple[str, int, str]], root: Path, allow=(), known: list[Hit] = (),
                  units: list[list[tuple[str, int, str, bool]]] | None = None) -> list[Hit]:
    """The hits in the sources as compiled (tools/build/expand.py: (file, line, the line as compiled), the user's own
    tokens; `units`: each pass's lines with what headers' macros put there, flagged, for the parser), less those the
    written text already showed: each quotes the user's line and what it became. Adjacent string literals are joined
    first, as the compiler joins them ("/pr" "oc/" is "/proc/")."""
    if not lines:
        return []
    text = "\n".join(t for _, _, t in lines)
    while (joined := _ADJACENT.sub(lambda m: '"' + m.group(1), text)) != text:
        text = joined
    have = {(h.rule, h.file, h.line) for h in known}
    written: dict[str, list[str]] = {}
    out: dict[tuple[str, str, int], Hit] = {}
    found = [(h.rule, *lines[h.line - 1]) for h in scan_text(text, "(as compiled)", allow)]
    trees = list(_trees(units or [[(*x, False) for x in lines]]))     # parsed once for the parser's two rules
    found += referenced(trees, allow)
    if "mutable_static" not in allow:
        found += [("mutable_static", *at) for at in namespace_globals(trees)]
    for rule, rel, n, compiled in found:
        if (rule, rel, n) in have or (rule, rel, n) in out:
            continue
        if rel not in written:
            written[rel] = (root / rel).read_text(errors="replace").splitlines()
        src = " ".join(written[rel][n - 1].split())[:160] if n <= len(written[rel]) else ""
        out[(rule, rel, n)] = Hit(rule, rel, n, src, " ".join(compiled.split())[:160])
    return sorted(out.values(), key=lambda h: (h.file, h.line, h.rule))


# what makes a namespace-scope variable no state: read-only, declared elsewhere, or memory of one launch
_NOT_STATE = {"const", "constexpr", "constinit", "extern", "__shared__", "__constant__"}


Unit = list[tuple[str, int, str, bool]]


def _trees(units: list[Unit]):
    """(one file's lines of one preprocessing pass, their syntax tree) for each (referenced, namespace_globals), by
    tree-sitter's CUDA grammar (a superset of C++'s); nothing where it is not installed (the written-text rules still
    run)."""
    from tools.backends.cu_tree import parser as cuda_parser
    parser = cuda_parser()
    if parser is None:
        return
    for unit, rel in ((u, f) for u in units for f in dict.fromkeys(e[0] for e in u)):
        mine = [e for e in unit if e[0] == rel]
        yield mine, parser.parse("\n".join(e[2] for e in mine).encode())


def referenced(trees: list, allow=()) -> list[tuple[str, str, int, str]]:
    """(rule, file, line, the line compiled) for each function a rule names that the user's compiled code refers to:
    called under any spelling (`(fopen)(...)`, `std::fopen`) or taken as a pointer (`auto f = fopen;`, `&puts`), which
    a pattern over `name(` does not see. A name the unit itself declares (a parameter `time`, a helper `write`) is the
    user's, not the library's; one qualified by a namespace other than std (`at::clone`) is not the C library's (the
    torch operators are matched qualified); a header's macro's code (flag 3) is the header's."""
    rules = [r for r in RULES if r.refers is not None and r.name not in allow]
    out: list[tuple[str, str, int, str]] = []
    for mine, tree in trees if rules else ():
        declared: set[bytes] = set()
        refs: list[tuple[str, int]] = []
        stack = [(tree.root_node, None)]
        while stack:
            node, field = stack.pop()
            stack += [(c, node.field_name_for_child(i)) for i, c in enumerate(node.children)]
            if node.type == "identifier" and field == "declarator":
                declared.add(node.text)
            elif node.type == "identifier" and node.parent is not None:
                scope = node.parent.child_by_field_name("scope") if node.parent.type == "qualified_identifier" else None
                if scope is None or scope.text == b"std":
                    refs.append((node.text.decode(errors="replace"), node.start_point[0]))
            elif node.type == "qualified_identifier" and node.parent is not None \
                    and node.parent.type != "qualified_identifier":
                refs.append(("".join(node.text.decode(errors="replace").split()), node.start_point[0]))
        for name, row in refs:
            if name.encode() in declared or mine[row][3]:
                continue
            out += [(r.name, *mine[row][:3]) for r in rules if r.refers.fullmatch(name)]
    return out


def namespace_globals(trees: list) -> list[tuple[str, int, str]]:
    """The variables defined at namespace scope that are not const, each as (file, line, the line compiled): a plain
    global, one in an anonymous namespace or an extern "C" block, a __device__ or __managed__ one. Each is state a call
    leaves for the next, which the written-text rule (a `static`, `thread_local`, `__device__` or `__managed__` keyword)
    does not see in `float cache[64];`. Read by tree-sitter's CUDA grammar (a superset of C++'s), one file's lines of
    one preprocessing pass at a time (a one-file extension's halves repeat lines, each in its own statements), what
    headers' macros put there included (whole statements); one whose type a header's macro wrote (PYBIND11_MODULE's
    module_def) is the header's, not counted; `__device__ int n;` (the keyword a CUDA header's macro) is the user's.
    [] where the parser is not installed (the keyword rule still runs)."""
    out: list[tuple[str, int, str]] = []
    for mine, tree in trees:
        scopes = [tree.root_node]
        while scopes:
            for node in scopes.pop().children:
                if node.type in ("namespace_definition", "linkage_specification"):
                    body = node.child_by_field_name("body")
                    scopes += [body] if body is not None else []
                elif node.type == "declaration":
                    declarators = node.children_by_field_name("declarator")
                    words = set(re.findall(r"[A-Za-z_]\w*", node.text.decode(errors="replace")))
                    kind = node.child_by_field_name("type") or node     # its type: who wrote the declaration
                    at = mine[kind.start_point[0]]
                    if declarators and not all(d.type == "function_declarator" for d in declarators) \
                            and not words & _NOT_STATE and not at[3]:
                        out.append(at[:3])
    return out


def allow_all(why: str) -> str:
    """task.toml text that allows every rule with one reason (a harness that verifies the runtime probes on kernels
    the scan would stop first)."""
    return "\n[scan]\nallow = { " + ", ".join(f'{n} = "{why}"' for n in NAMES) + " }\n"


def rejection(hits: list[Hit]) -> str:
    """The build's message for a rejected candidate: each hit on a line of its own (the first 8)."""
    more = f"\n(+{len(hits) - 8} more)" if len(hits) > 8 else ""
    return ("the source scan (tools/build/scan.py) found what no kernel needs; task.toml [scan] allow = "
            "{RULE = \"why\"} allows a rule by name:\n" + "\n".join(h.describe() for h in hits[:8]) + more)
