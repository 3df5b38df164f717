"""A C/C++/CUDA file read by tree-sitter's CUDA grammar (a superset of C++'s; issue 65), for tools.backends.cu_scan:
its top-level items with what each declares, and its kernel launches. None where the grammar cannot read what is
asked (cu_scan then reads the text by its brackets) or is not installed.

CUDA's parenthesised attributes (__launch_bounds__(...), __align__(n)), which the grammar does not know, are read as
blanks of the same length, so that offsets stay the text's.
"""

from __future__ import annotations

import re
import threading

_CUDA_ATTRS = re.compile(r"\b(?:__launch_bounds__|__maxnreg__|__cluster_dims__|__align__)\s*\([^()]*(?:\([^()]*\)[^()]*)*\)")


_LOCAL = threading.local()       # one parser a thread: the build splits while the scan's preprocessing splits too


def parser():
    """This thread's parser of tree-sitter's CUDA grammar (the split here, the scan's references and globals in
    tools/build/scan.py, [signature]'s prototype in tools/signature.py); None where it is not installed."""
    if not hasattr(_LOCAL, "parser"):
        try:
            import tree_sitter
            import tree_sitter_cuda
        except ImportError:
            _LOCAL.parser = None
        else:
            _LOCAL.parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_cuda.language()))
    return _LOCAL.parser


def _readable(text: str, masked: str) -> str:
    """`text` with CUDA's parenthesised attributes blanked (found on `masked`: not inside a comment or a literal)."""
    src = list(text)
    for m in _CUDA_ATTRS.finditer(masked):
        src[m.start():m.end()] = " " * (m.end() - m.start())
    return "".join(src)


def launches(text: str, masked: str) -> list[tuple[int, int, str, str, str]] | None:
    """(start, end, callee, configuration, arguments) of each call with a kernel_call_syntax (`k<T><<<g, b>>>(x)`,
    `(k)<<<...>>>`, `table[i]<<<...>>>`) the grammar reads without an error, in order; None for a text not in ASCII
    (the parser counts bytes) or without the grammar."""
    p = parser()
    if p is None or not text.isascii():
        return None
    tree = p.parse(_readable(text, masked).encode())
    out, todo = [], [tree.root_node]
    while todo:
        n = todo.pop()
        todo += reversed(n.children)
        chevrons = next((c for c in n.children if c.type == "kernel_call_syntax"), None) \
            if n.type == "call_expression" else None
        fn, args = n.child_by_field_name("function"), n.child_by_field_name("arguments")
        if chevrons is None or fn is None or args is None or n.has_error:
            continue
        config = text[chevrons.start_byte + 3:chevrons.end_byte - 3]
        out.append((fn.start_byte, n.end_byte, text[fn.start_byte:fn.end_byte].strip(), config.strip(),
                    text[args.start_byte + 1:args.end_byte - 1].strip()))
    return sorted(out)


_DIRECTIVE_TOKENS = {"#if", "#ifdef", "#ifndef", "#elif", "#elifdef", "#elifndef", "#else", "#endif", "\n"}
_SPECIFIERS = {"struct_specifier", "class_specifier", "union_specifier", "enum_specifier"}


def items(text: str, masked: str) -> list[tuple[str, int, int, set[str]]] | None:
    """The top-level items, each (kind: "pp" a directive or "code", start, end, what it declares, read from its
    declarators); a conditional's directives are items of their own and what its branches hold is read as top-level
    items too, as the compiler sees them. None where the grammar cannot read the top level (an error outside a
    function's body)."""
    p = parser()
    if p is None:
        return None
    data = _readable(text, masked).encode()
    tree = p.parse(data)
    if len(data) == len(text):
        char = lambda b: b  # noqa: E731
    else:                                   # UTF-8 in comments or literals: the parser counts bytes
        offsets = [0] * (len(data) + 1)
        k = 0
        for i, ch in enumerate(text):
            for _ in range(len(ch.encode())):
                offsets[k] = i
                k += 1
        offsets[k] = len(text)
        char = offsets.__getitem__
    out: list[tuple[str, int, int, set[str]]] = []

    def emit(kind: str, start_b: int, end_b: int, names: set[str] | None = None) -> None:
        s, e = char(start_b), char(end_b)
        while e > s and text[e - 1] in " \t\r\n":
            e -= 1
        out.append((kind, s, e, names if names is not None else set()))

    def line_end(b: int) -> int:
        nl = data.find(b"\n", b)
        return len(data) if nl < 0 else nl

    def walk(nodes) -> None:
        nodes = list(nodes)
        i = 0
        while i < len(nodes):
            n = nodes[i]
            if n.type in ("preproc_if", "preproc_ifdef", "preproc_else", "preproc_elif", "preproc_elifdef"):
                fields = [n.field_name_for_child(j) for j in range(n.child_count)]
                head = max((c.end_byte for c, f in zip(n.children, fields) if f in ("condition", "name")),
                           default=n.children[0].end_byte)
                emit("pp", n.start_byte, line_end(head))
                walk(c for c, f in zip(n.children, fields)
                     if f not in ("condition", "name", "alternative") and c.type not in _DIRECTIVE_TOKENS)
                alternative = n.child_by_field_name("alternative")
                if alternative is not None:
                    walk([alternative])
                endif = next((c for c in n.children if c.type == "#endif"), None)
                if endif is not None:
                    emit("pp", endif.start_byte, line_end(endif.end_byte))
            elif n.type.startswith("preproc_"):
                emit("pp", n.start_byte, n.end_byte)
            elif n.type != "comment" and n.type != ";":
                if n.type == "ERROR" or n.is_missing or n.has_error and not _body_only(n):
                    raise _Unreadable
                end = n.end_byte
                if n.type in _SPECIFIERS and i + 1 < len(nodes) and nodes[i + 1].type == ";":
                    end, i = nodes[i + 1].end_byte, i + 1          # struct S { ... };
                emit("code", n.start_byte, end, _declares(n))
            i += 1

    try:
        walk(tree.root_node.children)
    except _Unreadable:
        return None
    return out


class _Unreadable(Exception):
    """The grammar could not read a top-level item's head (only a function body's errors are the body's own)."""


def _body_only(node) -> bool:
    """Whether the parser's errors in a top-level node are all inside a function's body (a `#pragma unroll` between a
    `for` and its statement, a conditional that opens braces in each branch): its extent and name still hold."""
    while node.type == "template_declaration":
        node = next((c for c in node.named_children if c.type != "template_parameter_list"), node)
        if node.type == "template_declaration" and not node.named_children:
            return False
    if node.type != "function_definition":
        return False
    return all(not c.has_error and not c.is_missing for c in node.children if c != node.child_by_field_name("body"))


_NAMED = {"identifier", "type_identifier", "field_identifier", "namespace_identifier"}


def _declared(d) -> str | None:
    """The name a declarator declares: through pointers, references, arrays, functions and initialisers."""
    while d is not None and d.type not in _NAMED:
        if d.type in ("qualified_identifier", "template_function", "template_type", "operator_name", "destructor_name"):
            d = d.child_by_field_name("name")
            continue
        d = d.child_by_field_name("declarator") or next(
            (c for c in d.named_children if c.type not in ("attribute_specifier", "attribute_declaration")), None)
    return d.text.decode(errors="replace") if d is not None else None


def _declares(node) -> set[str]:
    """What a top-level node declares: a function's or variable's name, a type's, a namespace's; what an extern "C"
    block or a template holds."""
    out: set[str] = set()
    todo = [node]
    while todo:
        n = todo.pop()
        if n.type == "template_declaration":
            todo += [c for c in n.named_children if c.type != "template_parameter_list"]
        elif n.type == "linkage_specification":
            body = n.child_by_field_name("body")
            todo += list(body.named_children) if body is not None and body.type == "declaration_list" else \
                [body] if body is not None else []
        elif n.type == "namespace_definition" and n.child_by_field_name("name") is not None:
            out.add(n.child_by_field_name("name").text.decode(errors="replace"))
        elif n.type in _SPECIFIERS or n.type == "alias_declaration":
            name = n.child_by_field_name("name")
            if name is not None:
                out.add(_declared(name) or "")
        elif n.type in ("function_definition", "declaration", "type_definition"):
            kind = n.child_by_field_name("type")
            if kind is not None and kind.type in _SPECIFIERS:
                todo.append(kind)
            out.update(filter(None, (_declared(d) for d in n.children_by_field_name("declarator"))))
    return out - {""}


