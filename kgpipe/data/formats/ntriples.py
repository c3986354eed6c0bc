"""N-Triples (W3C): ``<s> <p> <o> .`` lines with IRIs, blank nodes and literals."""

from __future__ import annotations

import re

from kgpipe.data.formats.base import FORMATS, LabeledTriples, ParseOptions, TripleFormat
from kgpipe.data.formats.text import decode, split_lines
from kgpipe.errors import DataError

__all__ = ["DROPPED", "XSD_STRING", "NTriples", "statement"]


@FORMATS.register("ntriples")
class NTriples(TripleFormat):
    """RDF N-Triples; literal objects are dropped or kept as entities (``data.literals``)."""

    extensions = (".nt", ".ntriples")

    def parse(self, data: bytes, *, source: str, options: ParseOptions) -> LabeledTriples:
        if options.literals not in ("drop", "keep"):
            raise DataError(source, f"literals must be 'drop' or 'keep', got {options.literals!r}")
        return _parse_ntriples(decode(data, source), source, options.literals == "keep")


_IRI_CHARS = r'(?:[^\x00-\x20<>"{}|^`\\]|\\u[0-9A-Fa-f]{4}|\\U[0-9A-Fa-f]{8})*'
_BNODE = r'_:[^\s<>"().]+(?:\.+[^\s<>"().]+)*'
_LITERAL = r'"(?:[^"\\\n\r]|\\.)*"(?:@[A-Za-z]+(?:-[A-Za-z0-9]+)*|\^\^<' + _IRI_CHARS + r">)?"
_NT_STATEMENT = re.compile(
    r"[ \t]*(?:<(" + _IRI_CHARS + r")>|(" + _BNODE + r"))"
    r"[ \t]*<(" + _IRI_CHARS + r")>"
    r"[ \t]*(?:<(" + _IRI_CHARS + r")>|(" + _BNODE + r")|(" + _LITERAL + r"))"
    r"[ \t]*\.[ \t]*(?:#.*)?"
)
_NT_WS = re.compile(r"[ \t]*")
_NT_IRI = re.compile(r"<" + _IRI_CHARS + r">")
_NT_BNODE = re.compile(_BNODE)
_NT_LITERAL = re.compile(_LITERAL)


def _parse_ntriples(text: str, source: str, keep_literals: bool) -> LabeledTriples:
    heads: list[str] = []
    rels: list[str] = []
    tails: list[str] = []
    nums: list[int] = []
    dropped = 0
    for i, line in enumerate(split_lines(text), 1):
        triple = statement(line, i, source, keep_literals)
        if triple is None:
            continue
        if triple is DROPPED:
            dropped += 1
            continue
        h, r, t = triple
        heads.append(h)
        rels.append(r)
        tails.append(t)
        nums.append(i)
    return LabeledTriples(heads, rels, tails, nums, literals_dropped=dropped)


#: what :func:`statement` gives for a statement with a literal object that is dropped
DROPPED = ("", "", "")


def statement(line: str, i: int, source: str, keep_literals: bool) -> tuple[str, str, str] | None:
    """The labels of line ``i``'s statement; None for a blank or comment line, :data:`DROPPED`
    for one whose literal object is dropped (not ``keep_literals``). Raises
    :class:`~kgpipe.errors.DataError` naming the line when it is not a statement."""
    stripped = line.strip()
    if not stripped or stripped[0] == "#":
        return None
    m = _NT_STATEMENT.fullmatch(line)
    if m is None:
        raise DataError(
            source, f"malformed N-Triples statement: {_nt_problem(line)}", line=i, excerpt=line
        )
    s_iri, s_bnode, pred, o_iri, o_bnode, o_literal = m.groups()
    if "\\" in line or "<>" in line:  # escapes to decode (or refuse), an empty IRI
        s_iri, pred, o_iri = (
            None if x is None else _iri(x, source, i, line) for x in (s_iri, pred, o_iri)
        )
        if o_literal is not None:
            o_literal = _canonical_literal(o_literal, source, i, line)
    elif keep_literals and o_literal is not None and o_literal[-1] != '"':  # a tag or type
        o_literal = _canonical_literal(o_literal, source, i, line)
    if o_literal is not None:
        if not keep_literals:
            return DROPPED
        tail = o_literal
    else:
        tail = o_iri if o_iri is not None else o_bnode
    return (s_iri if s_iri is not None else s_bnode), pred, tail


# one term is one label however it is written: an escape is the character it stands for
_ESCAPE = re.compile(r"\\(?:u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|(.))", re.DOTALL)
_ECHAR = {"t": "\t", "b": "\b", "n": "\n", "r": "\r", "f": "\f", '"': '"', "'": "'", "\\": "\\"}
_NOT_IN_IRI = re.compile(r'[\x00-\x20<>"{}|^`\\]')
XSD_STRING = "http://www.w3.org/2001/XMLSchema#string"


def _unescape(text: str, source: str, line: int, excerpt: str, *, echar: bool) -> str:
    """``text`` with its escapes (``\\uXXXX``, ``\\UXXXXXXXX``; in literals also ``\\n``,
    ``\\"``, ...) replaced by the characters they stand for."""

    def one(m: re.Match[str]) -> str:
        code = m.group(1) or m.group(2)
        if code is not None and int(code, 16) <= 0x10FFFF:
            return chr(int(code, 16))
        if code is None and echar and m.group(3) in _ECHAR:
            return _ECHAR[m.group(3)]
        raise DataError(
            source, f"malformed N-Triples statement: invalid escape {m.group(0)!r}",
            line=line, excerpt=excerpt,
        )  # fmt: skip

    out = _ESCAPE.sub(one, text)
    if any("\ud800" <= c <= "\udfff" for c in out):  # UTF-16 halves, escaped one at a time
        try:  # a pair is the one character it encodes (\uD83D\uDE00 is \U0001F600)
            out = out.encode("utf-16", "surrogatepass").decode("utf-16")
        except UnicodeDecodeError:
            raise DataError(
                source, "malformed N-Triples statement: an escape of half a UTF-16 pair",
                line=line, excerpt=excerpt,
            ) from None  # fmt: skip
    return out


def _iri(iri: str, source: str, line: int, excerpt: str) -> str:
    """An IRI's label: its escapes decoded (``<caf\\u00E9>`` is ``<café>``)."""
    if "\\" in iri:
        iri = _unescape(iri, source, line, excerpt, echar=False)
        if _NOT_IN_IRI.search(iri):
            raise DataError(
                source,
                "malformed N-Triples statement: an escape in an IRI stands for a character "
                'IRIs cannot hold (spaces or <>"{}|^`\\)',
                line=line,
                excerpt=excerpt,
            )
    if not iri:
        raise DataError(source, "malformed N-Triples statement: an empty IRI <>", line=line,
                        excerpt=excerpt)  # fmt: skip
    return iri


def _canonical_literal(literal: str, source: str, line: int, excerpt: str) -> str:
    """A literal's label in one spelling: escapes decoded and only ``\\ " \\n \\r``
    escaped again, the language tag in lower case, ``^^xsd:string`` left out (RDF 1.1: the
    same literal as a plain one)."""
    end = literal.rindex('"')
    text, suffix = literal[1:end], literal[end + 1 :]
    if "\\" in text:
        text = _unescape(text, source, line, excerpt, echar=True)
        text = (
            text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
        )
    if suffix.startswith("@"):
        suffix = suffix.lower()
    elif suffix:
        iri = _iri(suffix[3:-1], source, line, excerpt)
        suffix = "" if iri == XSD_STRING else f"^^<{iri}>"
    return f'"{text}"{suffix}'


def _nt_term(line: str, pos: int, allowed: tuple[str, ...], role: str) -> tuple[int, str | None]:
    """Match one term at ``pos``; return the end position or a problem description."""
    pos = _NT_WS.match(line, pos).end()  # type: ignore[union-attr]
    if pos >= len(line):
        return pos, f"missing {role}"
    ch = line[pos]
    if ch == "<":
        m = _NT_IRI.match(line, pos)
        if m is None:
            if ">" not in line[pos:]:
                return pos, f"unterminated IRI in {role} (missing '>')"
            return pos, f'malformed IRI in {role} (IRIs cannot contain spaces or <>"{{}}|^`\\)'
        return m.end(), None
    if ch == "_" and "bnode" in allowed:
        m = _NT_BNODE.match(line, pos)
        if m is None:
            return pos, f"malformed blank node in {role}"
        return m.end(), None
    if ch == '"':
        if "literal" not in allowed:
            return pos, f"the {role} cannot be a literal"
        m = _NT_LITERAL.match(line, pos)
        if m is None:
            return pos, f"unterminated or malformed literal in {role}"
        end = m.end()
        if end < len(line) and line[end] in "@^":
            return end, f"malformed language tag or datatype in {role}"
        return end, None
    kinds = {"iri": "an IRI <...>", "bnode": "a blank node _:x", "literal": 'a literal "..."'}
    expected = " or ".join(kinds[k] for k in allowed)
    return pos, f"the {role} must be {expected}"


def _nt_problem(line: str) -> str:
    """Why ``line`` is not a valid N-Triples statement (for the error message)."""
    stripped = line.lstrip()
    if stripped.lower().startswith(("@prefix", "@base", "prefix ", "base ")):
        return "this looks like Turtle, not N-Triples (prefixes are not allowed)"
    pos = 0
    for role, allowed in (
        ("subject", ("iri", "bnode")),
        ("predicate", ("iri",)),
        ("object", ("iri", "bnode", "literal")),
    ):
        pos, problem = _nt_term(line, pos, allowed, role)
        if problem is not None:
            return problem
    pos = _NT_WS.match(line, pos).end()  # type: ignore[union-attr]
    if pos >= len(line) or line[pos] == "#":
        return "missing final '.'"
    if line[pos] != ".":
        return "expected '.' after the object (more than three terms?)"
    return "unexpected text after the final '.'"
