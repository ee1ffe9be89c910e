"""The structure of a CUDA source file as bench/ncu_regions.py needs it: its functions (lambdas
too), loops, statements and `// ---- NAME` region markers, found by matching braces in the text
with comments, strings and preprocessor lines blanked, so a region survives edits that move lines."""

from __future__ import annotations

import re
from dataclasses import dataclass

from verify_tuner.kernels.errors import TunerError

MARKERS = ("plan", "prologue", "epilogue")
_CONTROL = {"if", "for", "while", "switch", "catch", "constexpr", "return", "sizeof", "decltype"}


class RegionError(TunerError):
    """The profile, the rebuilt SASS or the source cannot be attributed (the message says why)."""


@dataclass(frozen=True)
class Func:
    name: str
    lo: int
    hi: int
    wrapper: bool  # a PTX wrapper or a one-line helper: a line inside it says less than its caller's


class SourceMap:
    """Functions (lambdas too), loops, statements and region markers of a .cu, found by matching
    braces in its text with comments, strings and preprocessor lines blanked."""

    def __init__(self, text: str, kernel: str) -> None:
        self.lines = text.splitlines()
        self._func: dict[int, Func | None] = {}
        clean = _clean(text)
        blocks, self.statements = _scan(clean)
        clean_lines = clean.splitlines()
        self.funcs = []
        for lo, hi, header in blocks:
            name = _function_name(header)
            if name:
                asm = any(re.search(r"\basm\b", s) for s in clean_lines[lo - 1 : hi])
                self.funcs.append(Func(name, lo, hi, (asm and hi - lo < 16) or hi - lo <= 2))
        self.loops = [(lo, hi) for lo, hi, h in blocks if re.match(r"(?:else\s+)?(?:for|while)\s*\(|do$", h)]
        found = [f for f in self.funcs if f.name == kernel]
        if not found:
            raise RegionError(f"the source defines no function {kernel}")
        self.kernel = max(found, key=lambda f: f.hi - f.lo)
        self.markers = {}
        for n in range(self.kernel.lo, self.kernel.hi + 1):
            m = re.search(r"//\s*-{3,}\s*(?:the\s+)?(\w+)", self.lines[n - 1])
            if m and m[1] in MARKERS and m[1] not in self.markers:
                self.markers[m[1]] = n
        missing = [m for m in MARKERS if m not in self.markers]
        if missing:
            raise RegionError(f"the kernel has no '// ---- {missing[0]}' comment: its regions need one")

    def func(self, line: int) -> Func | None:
        """The innermost function or named lambda holding `line`."""
        if line not in self._func:
            inside = [f for f in self.funcs if f.lo <= line <= f.hi]
            self._func[line] = min(inside, key=lambda f: f.hi - f.lo) if inside else None
        return self._func[line]

    def statement(self, line: int) -> int:
        """The first line of the innermost statement holding `line`."""
        inside = [s for s in self.statements if s[0] <= line <= s[1]]
        return min(inside, key=lambda s: s[1] - s[0])[0] if inside else line

    def loop(self, line: int) -> tuple[int, int] | None:
        inside = [lp for lp in self.loops if lp[0] <= line <= lp[1]]
        return min(inside, key=lambda lp: lp[1] - lp[0]) if inside else None

    def enclosing_loop(self, lo: int, hi: int) -> tuple[int, int] | None:
        """The innermost loop around lines lo..hi that is not exactly them."""
        around = [lp for lp in self.loops if lp[0] <= lo and hi <= lp[1] and lp != (lo, hi)]
        return min(around, key=lambda lp: lp[1] - lp[0]) if around else None

    def in_kernel(self, line: int) -> bool:
        return self.kernel.lo <= line <= self.kernel.hi

    def structural(self, line: int) -> bool:
        """Whether `line` is the kernel's own code or a lambda's holding its region markers (the
        segments), not a helper lambda's (refill, row_index), whose lines sit where it is defined."""
        f = self.func(line)
        return self.in_kernel(line) and f is not None and any(f.lo <= m <= f.hi for m in self.markers.values())

    def snippet(self, line: int | None, width: int = 64) -> str:
        if line is None or not 0 < line <= len(self.lines):
            return ""
        text = self.lines[line - 1].strip()
        text = text if len(text) <= width else text[: width - 1] + "…"
        return "`" + text.replace("`", "'").replace("|", "\\|") + "`"


def _clean(text: str) -> str:
    """`text` with comments, string and char literals and preprocessor lines as spaces."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text[i] in "\"'":
            j = i + 1
            while j < n and text[j] not in (text[i], "\n"):
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        i = j
    lines, pp = "".join(out).split("\n"), False
    for k, line in enumerate(lines):
        if pp or line.lstrip().startswith("#"):
            pp = line.rstrip().endswith("\\")
            lines[k] = ""
    return "\n".join(lines)


def _scan(clean: str) -> tuple[list[tuple[int, int, str]], list[tuple[int, int]]]:
    """Brace blocks (first line of their header, last line, header text) and statements (first
    and last line); braces inside parentheses (a lambda argument) do not end the statement."""
    blocks, statements, stack = [], [], []
    buf: list[str] = []
    start, depth, line = None, 0, 1
    for ch in clean:
        if ch == "\n":
            line += 1
            buf.append(" ")
        elif ch == "{":
            stack.append((" ".join("".join(buf).split()), start or line, depth, buf, start))
            buf, start, depth = [], None, 0
        elif ch == "}" and stack:
            header, lo, depth, saved, saved_start = stack.pop()
            blocks.append((lo, line, header))
            buf, start = (saved, saved_start) if depth > 0 else ([], None)
        elif ch == ";" and depth == 0:
            if start is not None:
                statements.append((start, line))
            buf, start = [], None
        else:
            depth += (ch == "(") - (ch == ")")
            start = line if start is None and not ch.isspace() else start
            buf.append(ch)
    return blocks, statements


def _function_name(header: str) -> str | None:
    """The name a block's header defines (a function, a member or a named lambda), or None."""
    m = re.search(r"\bauto\s+(\w+)\s*=\s*\[[^\]]*\]\s*\(", header)
    if m:
        return m[1]
    h = re.sub(r"(\s*\b(const|noexcept|override|mutable|final)\b)+$", "", header)
    if not h.endswith(")"):
        return None
    depth = 0
    for i in range(len(h) - 1, -1, -1):
        depth += (h[i] == ")") - (h[i] == "(")
        if depth == 0:
            break
    m = re.search(r"(\w+)\s*$", h[:i])
    return m[1] if m and m[1] not in _CONTROL else None
