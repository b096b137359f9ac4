"""Protocol buffer text format (Caffe's .prototxt), read without a protobuf compiler.

A message becomes a :class:`Message`: an ordered mapping from field name to
the list of its values (every field may repeat), each value a number, a
string, an enum identifier (kept as a string), a bool, or a nested Message.
``lines`` records the line of each field's first occurrence.  A syntax error,
a file that is not UTF-8, or messages nested deeper than :data:`MAX_DEPTH`
is a DataError naming the file, line and column.
"""

from __future__ import annotations

import re

from netspec.data.files import regular_file
from netspec.errors import DataError, shown

TOKEN = re.compile(r"""
    (?P<space>[ \t\r\n]+|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>[-+]?(?:inf(?:inity)?|nan|0x[0-9a-f]++|(?>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?>e[-+]?[0-9]+)?)f?(?![\w.]))
  | (?P<name>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<punct>[{}\[\]:;,<>])
""", re.VERBOSE | re.IGNORECASE)
MAX_DEPTH = 100  # nested messages; Caffe's deepest (a filler in a param in a layer) is 3
MAX_BYTES = 16 << 20  # of a file: GoogLeNet's train_val.prototxt has 50 KB
ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "a": "\a", "b": "\b", "f": "\f",
           "v": "\v", "?": "?"}


class Message(dict):
    """Field name -> list of values, in the order written; ``lines`` gives each field's first line."""

    def __init__(self, line: int = 0):
        super().__init__()
        self.line = line
        self.lines: dict[str, int] = {}

    def add(self, name: str, value, line: int) -> None:
        self.setdefault(name, []).append(value)
        self.lines.setdefault(name, line)

    def one(self, name: str, default=None):
        """The last value of a non-repeated field (protobuf's rule), or ``default``."""
        values = self.get(name)
        return values[-1] if values else default


def _unescape(text: str, fail) -> bytes:
    """The bytes a quoted string stands for; ``fail(message)`` on a broken escape."""
    body, out, i = text[1:-1], bytearray(), 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out += char.encode("utf-8")
            i += 1
            continue
        following = body[i + 1]
        if following in ESCAPES:
            out += ESCAPES[following].encode()
            i += 2
        elif following in "01234567":
            digits = re.match(r"[0-7]{1,3}", body[i + 1:]).group()
            out.append(int(digits, 8) & 0xFF)
            i += 1 + len(digits)
        elif following in "xX":
            digits = re.match(r"[0-9a-fA-F]{0,2}", body[i + 2:]).group()
            if not digits:
                fail(f"'\\{following}' with no hexadecimal digit after it in {shown(text)}")
            out.append(int(digits, 16))
            i += 2 + len(digits)
        else:
            out += following.encode()
            i += 2
    return bytes(out)


MAX_DIGITS = 40  # of a number: protobuf's are 64-bit integers and doubles (and 1e308 is written in a few)


def _number(text: str, fail):
    """The value of a number token, as protobuf's text format reads it: ``0x`` hexadecimal, a whole number with a
    leading zero octal; ``fail(message)`` when it cannot be one (more digits than any protobuf field holds, leading
    zeros not counted; 8 or 9 in an octal number)."""
    lowered = text.lower()
    unsigned = lowered.lstrip("+-")
    if "x" in lowered:
        if len(unsigned[2:].lstrip("0")) > 16:
            fail(f"{shown(text)} does not fit in 64 bits")
        return int(lowered, 16)
    special = ("inf", "infinity", "nan")
    if unsigned not in special:
        lowered = lowered.removesuffix("f")  # C-style float suffix (nanf, inff, 1.5f)
        unsigned = lowered.lstrip("+-")
    if unsigned in special:
        return float(lowered.replace("infinity", "inf"))
    whole = not any(c in unsigned for c in ".e")
    if whole and len(unsigned) > 1 and unsigned.startswith("0"):
        if any(c in "89" for c in unsigned):
            fail(f"{shown(text)}: a whole number with a leading zero is octal (digits 0 to 7), as in protobuf")
        if len(unsigned.lstrip("0")) > 22:
            fail(f"{shown(text)} does not fit in 64 bits")
        return int(lowered, 8)
    if sum(c.isdigit() for c in unsigned.lstrip("0")) > MAX_DIGITS:
        fail(f"{shown(text)} has more digits than any number a protobuf field holds")
    return int(lowered) if whole else float(lowered)


class _Parser:
    def __init__(self, text: str, where: str):
        self.where, self.tokens = where, []
        position, line, line_start = 0, 1, 0
        while position < len(text):
            match = TOKEN.match(text, position)
            if match is None:
                self.fail(line, position - line_start + 1, f"unexpected character {text[position]!r}")
            kind = match.lastgroup
            if kind != "space":
                self.tokens.append((kind, match.group(), line, position - line_start + 1))
            newlines = match.group().count("\n")
            if newlines:
                line += newlines
                line_start = match.start() + match.group().rfind("\n") + 1
            position = match.end()
        self.tokens.append(("end", "", line, position - line_start + 1))
        self.index = 0
        self.depth = 0

    def fail(self, line: int, column: int, message: str):
        raise DataError(f"{self.where}:{line}:{column}: {message}")

    def peek(self):
        return self.tokens[self.index]

    def take(self):
        token = self.tokens[self.index]
        self.index += 1
        return token

    def message(self, closing: str | None, line: int = 1) -> Message:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self.fail(line, self.peek()[3], f"messages nested deeper than {MAX_DEPTH} levels")
        result = self._fields(closing, line)
        self.depth -= 1
        return result

    def _fields(self, closing: str | None, line: int) -> Message:
        result = Message(line)
        while True:
            kind, value, line, column = self.peek()
            if kind == "end":
                if closing is not None:
                    self.fail(line, column, f"missing '{closing}' before the end of the file")
                return result
            if value == closing:
                self.take()
                return result
            if kind != "name":
                self.fail(line, column, f"expected a field name, found {shown(value)}")
            self.take()
            self.field(result, value, line)
            if self.peek()[1] in (",", ";"):
                self.take()

    def field(self, result: Message, name: str, line: int) -> None:
        kind, value, at, column = self.peek()
        if value == ":":
            self.take()
            kind, value, at, column = self.peek()
            if value == "[":
                self.take()
                while self.peek()[1] != "]":
                    result.add(name, self.value_or_message(), line)
                    if self.peek()[1] == ",":
                        self.take()
                self.take()
                return
        if value in ("{", "<"):
            self.take()
            result.add(name, self.message("}" if value == "{" else ">", at), line)
            return
        result.add(name, self.scalar(), line)

    def value_or_message(self):
        if self.peek()[1] in ("{", "<"):
            kind, value, line, column = self.take()
            return self.message("}" if value == "{" else ">", line)
        return self.scalar()

    def scalar(self):
        kind, value, line, column = self.take()

        def fail(message: str):
            self.fail(line, column, message)

        if kind == "string":
            data = _unescape(value, fail)
            while self.peek()[0] == "string":  # adjacent strings concatenate
                data += _unescape(self.take()[1], fail)
            return data.decode("utf-8", errors="replace")
        if kind == "number":
            return _number(value, fail)
        if kind == "name":
            return {"true": True, "false": False, "True": True, "False": False}.get(value, value)
        self.fail(line, column, f"expected a value, found {shown(value)}" if value
                  else "expected a value before the end of the file")


def parse_prototxt(text: str, where: str = "<string>") -> Message:
    """The top-level message of a text-format file."""
    return _Parser(text, where).message(None)


def read_prototxt(path: str) -> Message:
    """Parse the text-format file at ``path``."""
    regular_file(path, MAX_BYTES)  # (a FIFO would be waited on forever)
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not a text file (byte {exc.start} is not UTF-8)") from None
    return parse_prototxt(text, path)
